-- definition_agreement(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (a, b, n, spearman, same_band,
-- early_a_late_b, late_a_early_b): per pair of definitions (decision_definitions), over the images both place:
-- Spearman's ρ of their layers (average ranks for ties; NULL when one is constant), the share of images in the
-- same band, and how many are early by one and late by the other (definition_pair_stats).
CREATE OR REPLACE MACRO definition_agreement(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
SELECT * EXCLUDE (early_late_decided) FROM definition_pair_stats(runs, k, min_conf, scope) ORDER BY a, b;
