-- calibration(of_run, bins := 15, scope := 'auto', binning := 'width', min_n := 10) -> (run_id, anchor, name, ece,
-- mce, mce_bin, mce_n, bins_used, small_bins, min_bin_n, accuracy, confidence, n): per anchor the expected
-- calibration error of its probe, Σ_b share_b |accuracy_b - confidence_b| over calibration_bins (docs/design.md §7),
-- the largest gap of a bin of at least min_n images (mce; NULL where no bin is that large), that bin (the lowest of
-- equal gaps) and its image count, the non-empty bins and how many of them hold fewer than min_n images, the
-- smallest bin's count, and the anchor's accuracy and mean confidence over its n images. ECE's and MCE's bootstrap
-- intervals are numpy's (analytics/readouts.py).
CREATE OR REPLACE MACRO calibration(of_run, bins := 15, scope := 'auto', binning := 'width', min_n := 10) AS TABLE
SELECT run_id, anchor, any_value(name) AS name, sum(share * gap) AS ece, max(gap) FILTER (WHERE sets_mce) AS mce,
       arg_max(bin, [gap, -bin]) FILTER (WHERE sets_mce) AS mce_bin,
       arg_max(n, [gap, -bin]) FILTER (WHERE sets_mce) AS mce_n,
       count(*) AS bins_used, count(*) FILTER (WHERE NOT sets_mce) AS small_bins, min(n) AS min_bin_n,
       sum(share * accuracy) AS accuracy, sum(share * confidence) AS confidence, sum(n)::BIGINT AS n
FROM calibration_bins(of_run, bins := bins, scope := scope, binning := binning, min_n := min_n)
GROUP BY run_id, anchor
ORDER BY anchor;
