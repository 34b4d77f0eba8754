-- ddb(tau := 0.3, variant := 'global') -> (run_id, model, view, variant, tau, deep, shallow, ddb): Dependency
-- Depth Bias = log(Σ Λ from deep sources / Σ Λ from shallow sources); shallow = blocks < τL (the input embedding
-- included), deep = blocks >= (1-τ)L; targets: global = all, deep = deep blocks and logits, out = logits only.
CREATE OR REPLACE MACRO ddb(tau := 0.3, variant := 'global') AS TABLE
WITH e AS (
    SELECT c.run_id, c.model, c.view, c.layers, x.src_layer, x.dst_layer, abs(x.score) AS a
    FROM edges x JOIN circuit_runs c USING (run_id)
    WHERE CASE variant WHEN 'global' THEN true
                       WHEN 'deep' THEN x.dst_layer >= (1 - tau) * c.layers
                       WHEN 'out' THEN x.dst_layer = c.layers END)
SELECT run_id, model, view, variant AS variant, tau AS tau,
       sum(a) FILTER (WHERE src_layer >= (1 - tau) * layers) AS deep,
       sum(a) FILTER (WHERE src_layer < tau * layers) AS shallow,
       ln(sum(a) FILTER (WHERE src_layer >= (1 - tau) * layers) / sum(a) FILTER (WHERE src_layer < tau * layers))
           AS ddb
FROM e GROUP BY run_id, model, view, layers ORDER BY run_id;
