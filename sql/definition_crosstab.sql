-- definition_crosstab(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (a, b, band_a, band_b, n, share): the
-- early/mid/late cross-table of every pair of definitions (decision_definitions), all nine cells, zeros included,
-- and a prediction depth's 'unsettled' row or column (images even its anchor T does not settle) beside them.
CREATE OR REPLACE MACRO definition_crosstab(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
SELECT unnest(crosstab, recursive := true) FROM definition_comparison(runs, k, min_conf, 4, scope);
