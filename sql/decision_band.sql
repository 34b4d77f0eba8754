-- decision_band(layer, t, k := 0) -> VARCHAR: the early/mid/late band of a decision layer among anchors 0..t.
-- k = 0, the paper's band (docs/design.md §7): 'early' when layer < 0.3t, 'late' when layer >= 0.7t, else 'mid' (a
-- never-stable l*, placed at t, is late). k >= 1, the window-aware band of l*(k) (docs/design.md §5): a stable l*(k)
-- is at most t - k, so the thirds are of t - k, and a layer past it (never stable) is 'never', in no third.
CREATE OR REPLACE MACRO decision_band(layer, t, k := 0) AS
    CASE WHEN k > 0 AND layer > t - k THEN 'never'
         WHEN layer < 0.3 * (t - k) THEN 'early' WHEN layer >= 0.7 * (t - k) THEN 'late' ELSE 'mid' END;
