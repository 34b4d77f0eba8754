-- decision_summary(k, scope := 'auto', min_conf := 0) -> one row per run: the decision_sweep row of that k.
CREATE OR REPLACE MACRO decision_summary(k, scope := 'auto', min_conf := 0) AS TABLE
SELECT * FROM decision_sweep(k, scope, min_conf := min_conf) s WHERE s.k = k;
