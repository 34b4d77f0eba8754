-- merge_rows: with a source database attached as `src`, every result it holds replaces the target's result of
-- the same key (equal content, unless --replace allowed a different one); images, anchors, model sources and meta
-- the target lacks are added. Run inside the merge's one transaction, after merge_conflicts and merge_disagreements.
-- A learned gate belongs to its run's predictions: the target's goes when the source brings a gate for that run,
-- or brings the run with other content (--replace; that gate learnt the old predictions).
-- (A run's content leaves out created_at and the identity columns, as in merge_conflicts; the caller runs
-- migrate_runs afterwards, which fills those columns for the runs of a source written before they existed.)
DELETE FROM gate_scores WHERE run_id IN (SELECT run_id FROM src.gates) OR run_id IN (
    SELECT s.run_id FROM run_content('src.runs') s
    JOIN run_content('runs') t USING (run_id) WHERE hash(s) <> hash(t));
DELETE FROM gates WHERE run_id IN (SELECT run_id FROM src.gates) OR run_id IN (
    SELECT s.run_id FROM run_content('src.runs') s
    JOIN run_content('runs') t USING (run_id) WHERE hash(s) <> hash(t));
DELETE FROM predictions WHERE run_id IN (SELECT run_id FROM src.runs);
DELETE FROM decisions WHERE run_id IN (SELECT run_id FROM src.runs);
DELETE FROM folds WHERE run_id IN (SELECT run_id FROM src.runs);
DELETE FROM probe_fits WHERE run_id IN (SELECT run_id FROM src.runs);
DELETE FROM runs WHERE run_id IN (SELECT run_id FROM src.runs);
INSERT INTO runs BY NAME SELECT * FROM src.runs;
INSERT INTO predictions BY NAME SELECT * FROM src.predictions;
INSERT INTO decisions BY NAME SELECT * FROM src.decisions;
INSERT INTO folds BY NAME SELECT * FROM src.folds;
INSERT INTO probe_fits BY NAME SELECT * FROM src.probe_fits;
INSERT INTO gates BY NAME SELECT * FROM src.gates;
INSERT INTO gate_scores BY NAME SELECT * FROM src.gate_scores;
DELETE FROM edges WHERE run_id IN (SELECT run_id FROM src.circuit_runs);
DELETE FROM circuit_runs WHERE run_id IN (SELECT run_id FROM src.circuit_runs);
INSERT INTO circuit_runs BY NAME SELECT * FROM src.circuit_runs;
INSERT INTO edges BY NAME SELECT * FROM src.edges;
DELETE FROM model_outputs t WHERE EXISTS (SELECT 1 FROM src.model_outputs s WHERE s.model = t.model AND s.view = t.view);
INSERT INTO model_outputs BY NAME SELECT * FROM src.model_outputs;
DELETE FROM anchor_costs t WHERE EXISTS (SELECT 1 FROM src.model_costs s WHERE s.model = t.model
                                         AND s.device = t.device AND s.batch_size = t.batch_size);
DELETE FROM model_costs t WHERE EXISTS (SELECT 1 FROM src.model_costs s WHERE s.model = t.model
                                        AND s.device = t.device AND s.batch_size = t.batch_size);
INSERT INTO anchor_costs BY NAME SELECT * FROM src.anchor_costs;
INSERT INTO model_costs BY NAME SELECT * FROM src.model_costs;
DELETE FROM zoo_runs t WHERE EXISTS (SELECT 1 FROM src.zoo_runs s WHERE s.study = t.study AND s.model = t.model
                                     AND s.dataset = t.dataset);
INSERT INTO zoo_runs BY NAME SELECT * FROM src.zoo_runs;
DELETE FROM css_graph t WHERE EXISTS (SELECT 1 FROM src.css_graph s WHERE s.id_run = t.id_run
                                      AND s.ood_run = t.ood_run AND s.distance = t.distance AND s.top_n = t.top_n);
INSERT INTO css_graph BY NAME SELECT * FROM src.css_graph;
DELETE FROM anchor_cka t WHERE EXISTS (SELECT 1 FROM src.anchor_cka s WHERE s.model = t.model AND s.view = t.view
                                      AND s.estimator = t.estimator);
INSERT INTO anchor_cka BY NAME SELECT * FROM src.anchor_cka;
INSERT INTO anchors BY NAME SELECT * FROM src.anchors WHERE model NOT IN (SELECT model FROM anchors);
INSERT INTO model_sources BY NAME SELECT * FROM src.model_sources WHERE model NOT IN (SELECT model FROM model_sources);
INSERT INTO images BY NAME SELECT * FROM src.images WHERE NOT EXISTS (SELECT 1 FROM images);
INSERT OR IGNORE INTO meta SELECT * FROM src.meta;
