-- tap_grid(grid_run, scope := 'auto') -> (run_id, block, tap, depth_pct, accuracy, n): probe accuracy of every
-- (block, tap) anchor of a run built with --taps; depth% = block / (L-1) * 100 (docs/design.md §3).
CREATE OR REPLACE MACRO tap_grid(grid_run, scope := 'auto') AS TABLE
SELECT pa.run_id, a.block, a.tap, 100.0 * a.depth_frac AS depth_pct, pa.accuracy, pa.n
FROM probe_accuracy(scope) pa JOIN runs r USING (run_id) JOIN anchors a ON a.model = r.model AND a.anchor = pa.anchor
WHERE pa.run_id = grid_run AND a.tap IS NOT NULL
ORDER BY a.block, a.anchor;
