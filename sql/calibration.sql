-- calibration(of_run, bins := 15, scope := 'auto') -> (run_id, anchor, name, ece, mce, accuracy, confidence, n):
-- per anchor the expected calibration error of its probe, Σ_b share_b |accuracy_b - confidence_b| over the equal-
-- width bins of calibration_bins (docs/design.md §7), the largest bin gap (mce), and the anchor's accuracy and mean
-- confidence.
CREATE OR REPLACE MACRO calibration(of_run, bins := 15, scope := 'auto') AS TABLE
SELECT run_id, anchor, any_value(name) AS name, sum(share * gap) AS ece, max(gap) AS mce,
       sum(share * accuracy) AS accuracy, sum(share * confidence) AS confidence, sum(n)::BIGINT AS n
FROM calibration_bins(of_run, bins := bins, scope := scope)
GROUP BY run_id, anchor
ORDER BY anchor;
