-- definition_crosstab(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (a, b, band_a, band_b, n, share): the
-- early/mid/late cross-table of every pair of definitions (decision_definitions), all nine cells, zeros included,
-- and a prediction depth's 'unsettled' row or column (images even its anchor T does not settle) beside them.
CREATE OR REPLACE MACRO definition_crosstab(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
WITH p AS (SELECT * FROM definition_pairs(runs, k, min_conf, scope)),
pairs AS (SELECT a, b, any_value(kind_a) AS kind_a, any_value(kind_b) AS kind_b, count(*) AS total
          FROM p GROUP BY a, b),
bands AS (SELECT unnest(['early', 'mid', 'late', 'unsettled']) AS band, unnest([0, 1, 2, 3]) AS position),
cells AS (SELECT a, b, band_a, band_b, count(*) AS n FROM p GROUP BY a, b, band_a, band_b)
SELECT pr.a, pr.b, x.band AS band_a, y.band AS band_b, coalesce(c.n, 0) AS n, coalesce(c.n, 0) / pr.total AS share
FROM pairs pr CROSS JOIN bands x CROSS JOIN bands y
LEFT JOIN cells c ON c.a = pr.a AND c.b = pr.b AND c.band_a = x.band AND c.band_b = y.band
WHERE (x.band <> 'unsettled' OR pr.kind_a = 'depth') AND (y.band <> 'unsettled' OR pr.kind_b = 'depth')
ORDER BY pr.a, pr.b, x.position, y.position;
