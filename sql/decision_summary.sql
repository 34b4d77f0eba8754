-- decision_summary(k, scope := 'auto') -> one row per run: the decision_sweep row of that k.
CREATE OR REPLACE MACRO decision_summary(k, scope := 'auto') AS TABLE
SELECT * FROM decision_sweep(k, scope) s WHERE s.k = k;
