-- anchor_cka_named -> (model, view, estimator, anchor_a, name_a, anchor_b, name_b, cka, n_images, created_at): the
-- rows of `anchor_cka` (featstore cka) with both anchors' names where the database has them.
CREATE OR REPLACE VIEW anchor_cka_named AS
SELECT c.model, c.view, c.estimator, c.anchor_a, a.name AS name_a, c.anchor_b, b.name AS name_b, c.cka, c.n_images,
       c.created_at
FROM anchor_cka c
LEFT JOIN anchors a ON a.model = c.model AND a.anchor = c.anchor_a
LEFT JOIN anchors b ON b.model = c.model AND b.anchor = c.anchor_b;
