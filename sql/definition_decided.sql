-- definition_decided(kind, layer, t, k) -> BOOLEAN: whether a layer of decision_definitions is a decision rather
-- than its definition's fallback: a never-stable l*(k) or joint layer is placed at T (a stable one is at most
-- T - k), an unsettled prediction depth at T + 1.
CREATE OR REPLACE MACRO definition_decided(kind, layer, t, k) AS
    layer <= t - CASE WHEN kind = 'depth' THEN 0 ELSE k END;
