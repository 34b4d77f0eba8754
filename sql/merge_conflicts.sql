-- merge_conflicts: with a source database attached as `src`, each result the target also holds under the same key
-- but with other content: (what, key). `featstore merge` refuses a source with any, unless --replace.
-- Content: a run's row (all but created_at and the columns migrate_runs derives from params, run_content.sql,
-- so that a source written before they existed compares by the same content) and its predictions; a circuit run's
-- row and its edges; a model's outputs per view; a measurement's costs; a zoo row; a stored graph distance; a run's
-- learned gate and its scores; a model's anchor CKA matrix per view and estimator.
WITH digests AS (
    SELECT side, what, key, bit_xor(digest) AS digest FROM (
        SELECT 'target' AS side, 'run' AS what, r.run_id AS key, hash(r) AS digest
        FROM run_content('runs') r
        UNION ALL SELECT 'target', 'run', p.run_id, hash(p) FROM predictions p
        UNION ALL SELECT 'source', 'run', r.run_id, hash(r)
        FROM run_content('src.runs') r
        UNION ALL SELECT 'source', 'run', p.run_id, hash(p) FROM src.predictions p
        UNION ALL SELECT 'target', 'circuit run', c.run_id, hash(c)
        FROM (SELECT * EXCLUDE (created_at) FROM circuit_runs) c
        UNION ALL SELECT 'target', 'circuit run', e.run_id, hash(e) FROM edges e
        UNION ALL SELECT 'source', 'circuit run', c.run_id, hash(c)
        FROM (SELECT * EXCLUDE (created_at) FROM src.circuit_runs) c
        UNION ALL SELECT 'source', 'circuit run', e.run_id, hash(e) FROM src.edges e
        UNION ALL SELECT 'target', 'gate', g.run_id, hash(g) FROM (SELECT * EXCLUDE (created_at) FROM gates) g
        UNION ALL SELECT 'target', 'gate', s.run_id, hash(s) FROM gate_scores s
        UNION ALL SELECT 'source', 'gate', g.run_id, hash(g) FROM (SELECT * EXCLUDE (created_at) FROM src.gates) g
        UNION ALL SELECT 'source', 'gate', s.run_id, hash(s) FROM src.gate_scores s
        UNION ALL SELECT 'target', 'model outputs', m.model || '/' || m.view, hash(m) FROM model_outputs m
        UNION ALL SELECT 'source', 'model outputs', m.model || '/' || m.view, hash(m) FROM src.model_outputs m
        UNION ALL SELECT 'target', 'costs', c.model || ' on ' || c.device || ' batch ' || c.batch_size, hash(c)
        FROM (SELECT * EXCLUDE (measured_at) FROM anchor_costs) c
        UNION ALL SELECT 'source', 'costs', c.model || ' on ' || c.device || ' batch ' || c.batch_size, hash(c)
        FROM (SELECT * EXCLUDE (measured_at) FROM src.anchor_costs) c
        UNION ALL SELECT 'target', 'zoo row', z.study || '/' || z.model || '/' || z.dataset, hash(z)
        FROM (SELECT * EXCLUDE (created_at) FROM zoo_runs) z
        UNION ALL SELECT 'source', 'zoo row', z.study || '/' || z.model || '/' || z.dataset, hash(z)
        FROM (SELECT * EXCLUDE (created_at) FROM src.zoo_runs) z
        UNION ALL SELECT 'target', 'graph distance', g.id_run || ' vs ' || g.ood_run || ' ' || g.distance || '@'
            || g.top_n, hash(g) FROM (SELECT * EXCLUDE (created_at) FROM css_graph) g
        UNION ALL SELECT 'source', 'graph distance', g.id_run || ' vs ' || g.ood_run || ' ' || g.distance || '@'
            || g.top_n, hash(g) FROM (SELECT * EXCLUDE (created_at) FROM src.css_graph) g
        UNION ALL SELECT 'target', 'anchor CKA', c.model || '/' || c.view || ' ' || c.estimator, hash(c)
        FROM (SELECT * EXCLUDE (created_at) FROM anchor_cka) c
        UNION ALL SELECT 'source', 'anchor CKA', c.model || '/' || c.view || ' ' || c.estimator, hash(c)
        FROM (SELECT * EXCLUDE (created_at) FROM src.anchor_cka) c
    ) GROUP BY side, what, key
)
SELECT s.what, s.key
FROM digests s JOIN digests t ON t.side = 'target' AND t.what = s.what AND t.key = s.key
WHERE s.side = 'source' AND s.digest <> t.digest
ORDER BY s.what, s.key;
