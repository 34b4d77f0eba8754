-- population(scope := 'auto') -> (run_id, model, view, cross_fit, seed, source, dataset, images, counted,
-- classes): per run, which images its statistics count: the image set (its source, such as 'ImageFolder /data/
-- val', and fingerprint), how many images the database holds, how many the scope counts for this run (every
-- usable image of a cross-fit run, else the test split), and their classes.
CREATE OR REPLACE MACRO population(scope := 'auto') AS TABLE
SELECT r.run_id, r.model, r.view, r.cross_fit, r.seed, (SELECT any_value(value) FROM meta WHERE key = 'source')
           AS source, any_value(i.dataset) AS dataset, count(*) AS images,
       count(*) FILTER (WHERE in_scope(scope, i.split, r.cross_fit)) AS counted,
       count(DISTINCT i.label) FILTER (WHERE in_scope(scope, i.split, r.cross_fit)) AS classes
FROM runs r CROSS JOIN images i
GROUP BY ALL
ORDER BY r.run_id;
