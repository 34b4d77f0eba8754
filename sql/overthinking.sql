-- overthinking(of_run, scope := 'auto') -> (run_id, anchor, name, correct_by, wasteful_by, destructive_by,
-- wasteful, destructive, head_accuracy, n): Kaya et al.'s overthinking (docs/design.md §7) over the images of
-- first_correct that have the model's own answer (`model_outputs` of the run's view): per anchor l the shares
-- whose probe is correct at some anchor <= l (of those, head right: wasteful_by, head wrong: destructive_by); over
-- the run the shares correct at some internal anchor 0..T-1 with the head right (wasteful) or wrong (destructive).
-- Their label-blind permutation null is numpy's (analytics/readouts.py), over overthinking_timelines' rows.
CREATE OR REPLACE MACRO overthinking(of_run, scope := 'auto') AS TABLE
WITH r AS (SELECT run_id, model, view, n_anchors - 1 AS t FROM runs WHERE run_id = of_run),
img AS (SELECT f.image_id, f.label, coalesce(f.first_correct, f.t + 1) AS fc, f.t, mo.pred = f.label AS head_right
        FROM first_correct(of_run, scope := scope) f
        JOIN model_outputs mo ON mo.image_id = f.image_id AND mo.model = (SELECT model FROM r)
                             AND mo.view = (SELECT view FROM r)),
run_shares AS (SELECT avg((fc < t AND head_right)::INT) AS wasteful, avg((fc < t AND NOT head_right)::INT)
                      AS destructive, avg(head_right::INT) AS head_accuracy, count(*) AS n FROM img),
l AS (SELECT unnest(generate_series(0, (SELECT t FROM r))) AS anchor)
SELECT (SELECT run_id FROM r) AS run_id, l.anchor, a.name, avg((img.fc <= l.anchor)::INT) AS correct_by,
       avg((img.fc <= l.anchor AND img.head_right)::INT) AS wasteful_by,
       avg((img.fc <= l.anchor AND NOT img.head_right)::INT) AS destructive_by,
       any_value(s.wasteful) AS wasteful, any_value(s.destructive) AS destructive,
       any_value(s.head_accuracy) AS head_accuracy, any_value(s.n) AS n
FROM l CROSS JOIN img CROSS JOIN run_shares s
LEFT JOIN anchors a ON a.model = (SELECT model FROM r) AND a.anchor = l.anchor
GROUP BY l.anchor, a.name
ORDER BY l.anchor;
