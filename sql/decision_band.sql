-- decision_band(layer, t) -> VARCHAR: the early/mid/late band of a decision layer among anchors 0..t
-- (docs/design.md §7): 'early' when layer < 0.3t, 'late' when layer >= 0.7t, else 'mid'.
CREATE OR REPLACE MACRO decision_band(layer, t) AS
    CASE WHEN layer < 0.3 * t THEN 'early' WHEN layer >= 0.7 * t THEN 'late' ELSE 'mid' END;
