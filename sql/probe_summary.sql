-- probe_summary(run) -> (anchor, name, accuracy, n, converged): what `featstore probe` prints after a run: α(l) on
-- the images the run is scored on (the test split, or every image of a cross-fit run) and whether every fold's fit
-- at that anchor met its stopping criterion (NULL where the run fitted nothing, e.g. a view only predicted).
CREATE OR REPLACE MACRO probe_summary(run) AS TABLE
SELECT a.anchor, a.name, a.accuracy, a.n, f.converged
FROM probe_accuracy(scope := 'auto') a
LEFT JOIN (SELECT anchor, bool_and(converged) AS converged FROM probe_fits WHERE run_id = run GROUP BY anchor) f
    USING (anchor)
WHERE a.run_id = run
ORDER BY a.anchor;
