-- overthinking(of_run, scope := 'auto') -> (run_id, anchor, name, correct_by, wasteful_by, destructive_by,
-- wasteful, destructive, head_accuracy, n, correct_by_chance, wasteful_by_chance, destructive_by_chance,
-- wasteful_chance, destructive_chance): Kaya et al.'s overthinking (docs/design.md §7) over the images of
-- first_correct that have the model's own answer (`model_outputs` of the run's view): per anchor l the shares
-- whose probe is correct at some anchor <= l (of those, head right: wasteful_by, head wrong: destructive_by); over
-- the run the shares correct at some internal anchor 0..T-1 with the head right (wasteful) or wrong (destructive).
-- Each *_chance is the same share if every anchor were right independently of the others, at its own accuracy on
-- the images of the same head outcome (head right, head wrong): Σ_g n_g/n (1 - Π_{j<=l} (1 - acc_j(g))).
CREATE OR REPLACE MACRO overthinking(of_run, scope := 'auto') AS TABLE
WITH r AS (SELECT run_id, model, view, n_anchors - 1 AS t FROM runs WHERE run_id = of_run),
img AS (SELECT f.image_id, f.label, coalesce(f.first_correct, f.t + 1) AS fc, f.t, mo.pred = f.label AS head_right
        FROM first_correct(of_run, scope := scope) f
        JOIN model_outputs mo ON mo.image_id = f.image_id AND mo.model = (SELECT model FROM r)
                             AND mo.view = (SELECT view FROM r)),
accuracy AS (SELECT img.head_right, p.anchor, avg((p.pred = img.label)::INT) AS acc, count(*) AS n_group
             FROM img JOIN predictions p ON p.run_id = of_run AND p.image_id = img.image_id
             GROUP BY img.head_right, p.anchor),
missed AS (SELECT head_right, anchor, n_group / (SELECT count(*) FROM img) AS weight,
                  product(1 - acc) OVER (PARTITION BY head_right ORDER BY anchor) AS none_by
           FROM accuracy),
chance AS (SELECT anchor, sum(weight * (1 - none_by)) AS correct_by_chance,
                  coalesce(sum(weight * (1 - none_by)) FILTER (WHERE head_right), 0) AS wasteful_by_chance,
                  coalesce(sum(weight * (1 - none_by)) FILTER (WHERE NOT head_right), 0) AS destructive_by_chance
           FROM missed GROUP BY anchor),
run_shares AS (SELECT avg((fc < t AND head_right)::INT) AS wasteful, avg((fc < t AND NOT head_right)::INT)
                      AS destructive, avg(head_right::INT) AS head_accuracy, count(*) AS n FROM img),
run_chance AS (SELECT coalesce(any_value(wasteful_by_chance) FILTER (WHERE anchor = (SELECT t FROM r) - 1), 0)
                      AS wasteful_chance,
                      coalesce(any_value(destructive_by_chance) FILTER (WHERE anchor = (SELECT t FROM r) - 1), 0)
                      AS destructive_chance FROM chance),
l AS (SELECT unnest(generate_series(0, (SELECT t FROM r))) AS anchor)
SELECT (SELECT run_id FROM r) AS run_id, l.anchor, a.name, avg((img.fc <= l.anchor)::INT) AS correct_by,
       avg((img.fc <= l.anchor AND img.head_right)::INT) AS wasteful_by,
       avg((img.fc <= l.anchor AND NOT img.head_right)::INT) AS destructive_by,
       any_value(s.wasteful) AS wasteful, any_value(s.destructive) AS destructive,
       any_value(s.head_accuracy) AS head_accuracy, any_value(s.n) AS n,
       any_value(c.correct_by_chance) AS correct_by_chance, any_value(c.wasteful_by_chance) AS wasteful_by_chance,
       any_value(c.destructive_by_chance) AS destructive_by_chance,
       any_value(rc.wasteful_chance) AS wasteful_chance, any_value(rc.destructive_chance) AS destructive_chance
FROM l CROSS JOIN img CROSS JOIN run_shares s CROSS JOIN run_chance rc
LEFT JOIN chance c ON c.anchor = l.anchor
LEFT JOIN anchors a ON a.model = (SELECT model FROM r) AND a.anchor = l.anchor
GROUP BY l.anchor, a.name
ORDER BY l.anchor;
