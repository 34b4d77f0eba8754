-- tap_gains(grid_run, scope := 'auto') -> (strategy, block, tap, accuracy, gain_recovered): the base (resid of the
-- last block), the oracle (best (block, tap) pair), the best tap of each block ('best@<block>'), and the fixed
-- taps act@100 (act at block L-1) and ln2@60 (ln2 at block round(0.6(L-1))); gain recovered
-- G = (A_S - A_base) / (A_oracle - A_base) (docs/design.md §3); NULL without a resid tap (no base).
CREATE OR REPLACE MACRO tap_gains(grid_run, scope := 'auto') AS TABLE
WITH g AS (SELECT * FROM tap_grid(grid_run, scope)),
last AS (SELECT max(block) AS l FROM g),
base AS (SELECT accuracy FROM g, last WHERE tap = 'resid' AND block = last.l),
oracle AS (SELECT max(accuracy) AS accuracy FROM g),
picks AS (
    SELECT 'base resid@100' AS strategy, block, tap, accuracy, 0 AS ord FROM g, last WHERE tap = 'resid' AND block = last.l
    UNION ALL
    SELECT 'oracle', arg_max(block, accuracy), arg_max(tap, accuracy), max(accuracy), 1 FROM g
    UNION ALL
    SELECT 'act@100', block, tap, accuracy, 2 FROM g, last WHERE tap = 'act' AND block = last.l
    UNION ALL
    SELECT 'ln2@60', block, tap, accuracy, 3 FROM g, last WHERE tap = 'ln2' AND block = round(0.6 * last.l)
    UNION ALL
    SELECT 'best@' || block, block, arg_max(tap, accuracy), max(accuracy), 4 + block FROM g GROUP BY block)
SELECT p.strategy, p.block, p.tap, p.accuracy,
       CASE WHEN oracle.accuracy > base.accuracy
            THEN (p.accuracy - base.accuracy) / (oracle.accuracy - base.accuracy) END AS gain_recovered
FROM picks p CROSS JOIN oracle LEFT JOIN base ON true ORDER BY p.ord;
