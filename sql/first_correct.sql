-- first_correct(of_run, scope := 'auto') -> (image_id, label, split, first_correct, t): per image the run predicted
-- (and the scope counts), the first anchor whose probe prediction is the label, NULL when none is (docs/design.md §7).
CREATE OR REPLACE MACRO first_correct(of_run, scope := 'auto') AS TABLE
SELECT p.image_id, i.label, i.split, min(p.anchor) FILTER (WHERE p.pred = i.label) AS first_correct,
       any_value(r.n_anchors) - 1 AS t
FROM predictions p JOIN runs r USING (run_id) JOIN images i USING (image_id)
WHERE p.run_id = of_run AND in_scope(scope, i.split, r.cross_fit)
GROUP BY p.image_id, i.label, i.split
ORDER BY p.image_id;
