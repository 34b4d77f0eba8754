-- decision_summary(k, scope := 'auto', min_conf := 0, band := 'paper') -> one row per run: the decision_sweep row of
-- that k.
CREATE OR REPLACE MACRO decision_summary(k, scope := 'auto', min_conf := 0, band := 'paper') AS TABLE
SELECT * FROM decision_sweep(k, scope, min_conf := min_conf, band := band) s WHERE s.k = k;
