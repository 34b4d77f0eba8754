-- css_vs_clean(distance := 'srcc') -> (ood_run, id_run, css): for every circuit run on a shifted image set, its
-- Circuit Shift Score against the same model's clean circuit run (same number of IG steps).
CREATE OR REPLACE MACRO css_vs_clean(distance := 'srcc') AS TABLE
SELECT o.run_id AS ood_run, i.run_id AS id_run, s.css
FROM circuit_runs o
JOIN circuit_runs i ON i.model = o.model AND i.view = 'clean' AND o.view <> 'clean' AND i.ig_steps = o.ig_steps,
LATERAL css(i.run_id, o.run_id, distance := distance) s;
