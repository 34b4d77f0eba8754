-- definition_decided_disagreements(runs, k := 2, min_conf := 0.5, per_pair := 4, scope := 'auto') -> (a, b, n, side,
-- image_id, path, label, layer_a, layer_b, t): per pair of definitions (decision_definitions), the n images early by
-- one and late by the other where both layers are decisions, not a fallback (definition_decided), and a few of
-- them (side 'a early, b late' or 'a late, b early'), picked by a fixed hash of the id: the disagreements the report
-- shows, pairs with the most first.
CREATE OR REPLACE MACRO definition_decided_disagreements(runs, k := 2, min_conf := 0.5, per_pair := 4,
                                                         scope := 'auto') AS TABLE
SELECT unnest(decided, recursive := true) FROM definition_comparison(runs, k, min_conf, per_pair, scope);
