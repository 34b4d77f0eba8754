-- definition_ranking(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (a, b, n, spearman, same_band,
-- early_a_late_b, late_a_early_b, early_late_decided): definition_agreement of every pair of definitions with
-- early_late_decided, the images early by one and late by the other where both layers are decisions
-- (definition_decided), the pairs that disagree most first (then the fewest in the same band).
CREATE OR REPLACE MACRO definition_ranking(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
SELECT * FROM definition_pair_stats(runs, k, min_conf, scope) ORDER BY early_late_decided DESC, same_band, a, b;
