-- zoo_points(taus, top_n) -> (study, ood_set, metric, target, tau, model, x, y): per zoo model and OOD set, each
-- metric x beside the number it should predict y. Before deployment: DDB (ddb_global | ddb_deep | ddb_out, per τ)
-- of the ID circuit, and the baseline id_accuracy, against OOD accuracy. After deployment: CSS (css_<distance>)
-- between the ID and the OOD circuit against the accuracy drop (ID - OOD accuracy). Metrics without τ repeat
-- for every τ.
CREATE OR REPLACE MACRO zoo_points(taus, top_n) AS TABLE
WITH ood AS (
    SELECT o.study, o.model, o.dataset AS ood_set, o.accuracy AS ood_acc, o.circuit_run AS ood_run,
           i.accuracy AS id_acc, i.circuit_run AS id_run
    FROM zoo_runs o JOIN zoo_runs i ON i.study = o.study AND i.model = o.model AND i.role = 'id'
    WHERE o.role = 'ood'),
grid AS (SELECT unnest(taus)::DOUBLE AS tau),
shift AS (
    SELECT * FROM css_grid(
        (SELECT list(i.circuit_run ORDER BY o.circuit_run) FROM zoo_runs o
         JOIN zoo_runs i ON i.study = o.study AND i.model = o.model AND i.role = 'id' WHERE o.role = 'ood'),
        (SELECT list(o.circuit_run ORDER BY o.circuit_run) FROM zoo_runs o
         JOIN zoo_runs i ON i.study = o.study AND i.model = o.model AND i.role = 'id' WHERE o.role = 'ood'),
        top_n))
SELECT o.study, o.ood_set, 'ddb_' || d.variant AS metric, 'ood_accuracy' AS target, d.tau, o.model, d.log_ratio AS x,
       o.ood_acc AS y
FROM ood o JOIN ddb_grid(taus) d ON d.run_id = o.id_run
UNION ALL
SELECT o.study, o.ood_set, 'id_accuracy', 'ood_accuracy', g.tau, o.model, o.id_acc, o.ood_acc
FROM ood o CROSS JOIN grid g
UNION ALL
SELECT o.study, o.ood_set, 'css_' || s.distance, 'accuracy_drop', g.tau, o.model, s.value, o.id_acc - o.ood_acc
FROM ood o JOIN shift s ON s.id_run = o.id_run AND s.ood_run = o.ood_run CROSS JOIN grid g;
