-- idm(circuit_run) -> (src_layer, dst_layer, lambda): the inter-layer dependency matrix Λ_ij = Σ |c(e)| over
-- edges from block i to block j (input embedding = layer -1, logits = layer L, a deep target).
CREATE OR REPLACE MACRO idm(circuit_run) AS TABLE
SELECT src_layer, dst_layer, sum(abs(score)) AS lambda
FROM edges WHERE run_id = circuit_run GROUP BY src_layer, dst_layer ORDER BY src_layer, dst_layer;
