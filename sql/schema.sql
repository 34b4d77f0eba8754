-- featstore's tables (docs/design.md §6; docs/analytics.md lists them), one database per image set. Idempotent:
-- run on every write connection.
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);

-- every image of the store; split is the seeded 70/30 train/test split with val carved from train; class_name
-- names the label (a WNID when labels are ImageNet-1k indices)
CREATE TABLE IF NOT EXISTS images (
    dataset VARCHAR, image_id BIGINT PRIMARY KEY, path VARCHAR, label INTEGER, split VARCHAR, class_name VARCHAR);
ALTER TABLE images ADD COLUMN IF NOT EXISTS class_name VARCHAR;

-- the anchors of each model: anchor = index 0..T along depth; block/tap for Transformer module taps
CREATE TABLE IF NOT EXISTS anchors (
    model VARCHAR, anchor SMALLINT, name VARCHAR, module VARCHAR, dim INTEGER, depth_frac DOUBLE,
    block INTEGER, tap VARCHAR, PRIMARY KEY (model, anchor));

-- the store each model's rows come from, as it identifies itself: its image table's checksum, the model's weights
-- and anchors (name:width, in order); a probe from a store that disagrees is refused (docs/clusters.md)
CREATE TABLE IF NOT EXISTS model_sources (
    model VARCHAR PRIMARY KEY, store VARCHAR, images VARCHAR, weights_id VARCHAR, anchors VARCHAR);

-- one row per (model, view, probe variant[, cross-fit, seed]): rerunning replaces it. probe = the variant's name;
-- the run's identity (featstore.records.RunIdentity, which spells run_id from it): model, view, probe_id (the
-- variant with its parameters), train_view, cross_fit, seed, streamed (the fit rows did not fit the memory budget
-- and were streamed by chunk); probe_name (the name its weights are stored under) and probe_version (the stored
-- weights' version); C = the L2 strength the variant pins (linear:C=0.5; NULL where the search chooses one per
-- anchor, probe_fits.C, or the variant has none); params = the variant's parameters and the job's settings
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY, model VARCHAR, view VARCHAR, train_view VARCHAR, probe VARCHAR, params JSON,
    cross_fit INTEGER, seed INTEGER, n_images INTEGER, n_anchors INTEGER, store VARCHAR,
    created_at TIMESTAMP, probe_id VARCHAR, probe_name VARCHAR, probe_version VARCHAR, streamed BOOLEAN, C DOUBLE);
-- (a database written before the identity had columns: sql/migrate_runs.sql, run on opening it)

-- every image at every anchor: the probe's argmax and max softmax probability
CREATE TABLE IF NOT EXISTS predictions (
    run_id VARCHAR, image_id BIGINT, anchor SMALLINT, pred INTEGER, conf REAL);

-- cross-fit runs: the fold whose probes predicted each image (out of sample)
CREATE TABLE IF NOT EXISTS folds (run_id VARCHAR, image_id BIGINT, fold SMALLINT);

-- per run, fold and anchor: how training ended (epochs, whether its stopping criterion was met before the epoch
-- cap, final objective on the rows it learnt from, loss and accuracy on the val rows) and what it chose (info;
-- C: the L2 strength the fit used, pinned or chosen, NULL for a variant without one)
CREATE TABLE IF NOT EXISTS probe_fits (
    run_id VARCHAR, fold SMALLINT, anchor SMALLINT, val_accuracy DOUBLE, info JSON);
ALTER TABLE probe_fits ADD COLUMN IF NOT EXISTS epochs INTEGER;
ALTER TABLE probe_fits ADD COLUMN IF NOT EXISTS converged BOOLEAN;
ALTER TABLE probe_fits ADD COLUMN IF NOT EXISTS train_loss DOUBLE;
ALTER TABLE probe_fits ADD COLUMN IF NOT EXISTS val_loss DOUBLE;
ALTER TABLE probe_fits ADD COLUMN IF NOT EXISTS C DOUBLE;

-- the model's own head on each view (full-depth baseline, from the stored logits)
CREATE TABLE IF NOT EXISTS model_outputs (
    model VARCHAR, view VARCHAR, image_id BIGINT, pred INTEGER, conf REAL);

-- derived at write time from predictions (sql/derive_decisions.sql), one row per (run, image, k), k = 1..T:
-- the decision layer l*(k), the prediction it settles on, whether that is the label, and never-stable
CREATE TABLE IF NOT EXISTS decisions (
    run_id VARCHAR, image_id BIGINT, k SMALLINT, layer SMALLINT, stable_pred INTEGER, correct BOOLEAN,
    never_stable BOOLEAN);

-- featstore cost: measured cost of exiting at each anchor, per model, device and batch size (per batch, ms)
CREATE TABLE IF NOT EXISTS anchor_costs (
    model VARCHAR, device VARCHAR, batch_size INTEGER, anchor SMALLINT, ms DOUBLE, flops BIGINT,
    probe_ms DOUBLE, probe_flops BIGINT, measured_at TIMESTAMP);
CREATE TABLE IF NOT EXISTS model_costs (
    model VARCHAR, device VARCHAR, batch_size INTEGER, ms DOUBLE, flops BIGINT, measured_at TIMESTAMP);

-- featstore circuits: one row per EAP-IG run, and its edge scores in the graph's fixed edge order
CREATE TABLE IF NOT EXISTS circuit_runs (
    run_id VARCHAR PRIMARY KEY, model VARCHAR, view VARCHAR, layers INTEGER, heads INTEGER, ig_steps INTEGER,
    n_images INTEGER, n_edges INTEGER, params JSON, created_at TIMESTAMP);
CREATE TABLE IF NOT EXISTS edges (
    run_id VARCHAR, edge INTEGER, src VARCHAR, dst VARCHAR, src_layer SMALLINT, dst_layer SMALLINT, score DOUBLE);
-- graph distances between two circuits' top_n-edge graphs (computed in Python: they need eigenvalues)
CREATE TABLE IF NOT EXISTS css_graph (
    id_run VARCHAR, ood_run VARCHAR, distance VARCHAR, top_n INTEGER, value DOUBLE, n_edges INTEGER,
    created_at TIMESTAMP);

-- featstore zoo: per study, model and image set (role id or ood), the head's top-1 accuracy and the circuit run
CREATE TABLE IF NOT EXISTS zoo_runs (
    study VARCHAR, model VARCHAR, dataset VARCHAR, role VARCHAR, accuracy DOUBLE, n_images INTEGER,
    circuit_run VARCHAR, created_at TIMESTAMP);

-- featstore gate: one learned exit gate per run, fitted on one split (trained_on) from the run's own prediction
-- timelines (features: its names and standardisation; weights: the logistic regression; info: how the fit went)
CREATE TABLE IF NOT EXISTS gates (
    run_id VARCHAR PRIMARY KEY, trained_on VARCHAR, n_rows INTEGER, target VARCHAR, features JSON, weights JSON,
    info JSON, created_at TIMESTAMP);
-- the gate's score at every (image, anchor) of its run: its estimate that the anchor's prediction is already the
-- model's own and correct; learnt = the image is one the gate was fitted on (exit-sim leaves those out)
CREATE TABLE IF NOT EXISTS gate_scores (run_id VARCHAR, image_id BIGINT, anchor SMALLINT, score REAL, learnt BOOLEAN);

-- featstore cka: linear CKA between every pair of a model's anchors on one view (docs/design.md §7), from the stored
-- features of every usable image; estimator 'biased' (Kornblith et al.) or 'unbiased' (the unbiased HSIC);
-- rerunning replaces the rows of the same model, view and estimator
CREATE TABLE IF NOT EXISTS anchor_cka (
    model VARCHAR, view VARCHAR, estimator VARCHAR, anchor_a SMALLINT, anchor_b SMALLINT, cka DOUBLE,
    n_images INTEGER, created_at TIMESTAMP);
