-- definition_pair_stats(runs, k := 2, min_conf := 0.5, scope := 'auto') -> (a, b, n, spearman, same_band,
-- early_a_late_b, late_a_early_b, early_late_decided): per pair of definitions (decision_definitions), from one
-- read of definition_pairs: definition_agreement's figures and early_late_decided, the images early by one and late
-- by the other where both layers are decisions (definition_decided); unordered (definition_agreement and
-- definition_ranking order it).
CREATE OR REPLACE MACRO definition_pair_stats(runs, k := 2, min_conf := 0.5, scope := 'auto') AS TABLE
SELECT unnest(ranking, recursive := true) FROM definition_comparison(runs, k, min_conf, 4, scope);
