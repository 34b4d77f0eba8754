-- ddb_grid(taus) -> (run_id, model, view, variant, tau, deep, shallow, log_ratio): Dependency Depth Bias of
-- every circuit run for each τ in the list and each variant: log(Σ Λ from deep sources / Σ Λ from shallow sources);
-- shallow = blocks < τL (the input embedding included), deep = blocks >= (1-τ)L; targets: global = all blocks
-- and the logits, deep = deep blocks and the logits, out = the logits only.
CREATE OR REPLACE MACRO ddb_grid(taus) AS TABLE
WITH lam AS (
    SELECT run_id, src_layer, dst_layer, sum(abs(score)) AS a FROM edges GROUP BY run_id, src_layer, dst_layer),
grid AS (SELECT unnest(taus)::DOUBLE AS tau),
variants AS (SELECT unnest(['global', 'deep', 'out']) AS variant),
e AS (
    SELECT c.run_id, c.model, c.view, c.layers, g.tau, v.variant, l.src_layer, l.a
    FROM lam l JOIN circuit_runs c USING (run_id) CROSS JOIN grid g CROSS JOIN variants v
    WHERE CASE v.variant WHEN 'global' THEN true
                         WHEN 'deep' THEN l.dst_layer >= (1 - g.tau) * c.layers
                         WHEN 'out' THEN l.dst_layer = c.layers END)
SELECT run_id, model, view, variant, tau,
       sum(a) FILTER (WHERE src_layer >= (1 - tau) * layers) AS deep,
       sum(a) FILTER (WHERE src_layer < tau * layers) AS shallow,
       ln(sum(a) FILTER (WHERE src_layer >= (1 - tau) * layers) / sum(a) FILTER (WHERE src_layer < tau * layers))
           AS log_ratio
FROM e GROUP BY run_id, model, view, layers, variant, tau ORDER BY run_id, variant, tau;
