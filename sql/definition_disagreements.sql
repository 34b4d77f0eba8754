-- definition_disagreements(runs, k := 2, min_conf := 0.5, per_pair := 4, scope := 'auto') -> (a, b, side,
-- image_id, path, label, layer_a, layer_b, t): per pair of definitions, a few images that are early by one and
-- late by the other (side 'a early, b late' or 'a late, b early'), picked by a fixed hash of the id.
CREATE OR REPLACE MACRO definition_disagreements(runs, k := 2, min_conf := 0.5, per_pair := 4, scope := 'auto')
AS TABLE
SELECT unnest(disagreements, recursive := true) FROM definition_comparison(runs, k, min_conf, per_pair, scope);
