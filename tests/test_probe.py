"""`featstore probe`: accuracy against scikit-learn, predictions recomputed from saved weights, cross-fit,
streaming vs in-memory, reruns, views, and refusals that write nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import duckdb
import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from synthetic import class_clusters, read_probe, write_feature_store

from featstore.probing.split import make_split
from featstore.store.reader import FeatureStore

from conftest import fail_after_inserting, fails, run_cli

DIMS = [8, 32, 64, 128]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """A store written by the test: Gaussian class clusters, a clean and a noisier view."""
    feats, labels = class_clusters(2400, 8, DIMS, seed=3)
    rng = np.random.default_rng(9)
    noisy = [(f.astype(np.float32) + rng.normal(0, 1.0, f.shape) * f.astype(np.float32).std(axis=0)).astype(np.float16)
             for f in feats]
    path = tmp_path_factory.mktemp("clusters") / "s.zarr"
    write_feature_store(path, feats, labels, 8, views={"noisy": noisy}, chunk_rows=256)
    return path, feats, labels


def sklearn_accuracy(x: np.ndarray, labels: np.ndarray, split: np.ndarray, standardise: bool) -> float:
    fit, test = np.isin(split, ["train", "val"]), split == "test"
    x = x.astype(np.float32)
    if standardise:
        x = StandardScaler().fit(x[fit]).transform(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return float(LogisticRegression().fit(x[fit], labels[fit]).score(x[test], labels[test]))


def probe_accuracy(db, run_id: str) -> list[float]:
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT anchor, avg((p.pred = i.label)::INT) FROM predictions p JOIN images i "
                       "USING (image_id) WHERE run_id = ? AND i.split = 'test' GROUP BY anchor ORDER BY anchor",
                       [run_id]).fetchall()
    con.close()
    return [acc for _, acc in rows]


def assert_matches_sklearn(store_path, key: str, db, run_id: str) -> None:
    fs = FeatureStore(store_path)
    labels = fs.image_table()["label"]
    split = make_split(fs.image_table()["image_id"])
    ours = probe_accuracy(db, run_id)
    for anchor, acc in zip(fs.anchors(key), ours, strict=True):
        x = fs.read(key, "clean", anchor.name)
        best = max(sklearn_accuracy(x, labels, split, s) for s in (False, True))
        assert acc >= best - 0.01, f"{anchor.name}: featstore {acc:.4f} vs scikit-learn {best:.4f}"


def assert_predictions_recompute(store_path, key: str, view: str, db, run_id: str, probe_name: str) -> None:
    """N x (T+1) rows, and pred = argmax(W x + b) with the weights saved in the store (float64 here)."""
    fs = FeatureStore(store_path)
    anchors = fs.anchors(key)
    con = duckdb.connect(str(db), read_only=True)
    got = con.execute("SELECT image_id, anchor, pred, conf FROM predictions WHERE run_id = ? "
                      "ORDER BY image_id, anchor", [run_id]).fetchnumpy()
    folds = dict(con.execute("SELECT image_id, fold FROM folds WHERE run_id = ?", [run_id]).fetchall())
    con.close()
    n = fs.num_images
    assert len(got["pred"]) == n * len(anchors)
    ids = fs.image_table()["image_id"]
    fold = np.array([folds.get(int(i), 0) for i in ids])
    for anchor in anchors:
        w, b, _ = read_probe(fs, key, probe_name, anchor.name)
        x = fs.read(key, view, anchor.name).astype(np.float64)
        logits = np.einsum("nd,ncd->nc", x, w[fold].astype(np.float64)) + b[fold]
        top2 = np.sort(logits, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 1e-4 * np.abs(top2).max(axis=1)
        pred = got["pred"][anchor.index :: len(anchors)]
        assert clear.mean() > 0.99
        assert np.array_equal(pred[clear], logits.argmax(axis=1)[clear]), anchor.name
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        conf = (probs / probs.sum(axis=1, keepdims=True)).max(axis=1)
        assert np.allclose(got["conf"][anchor.index :: len(anchors)], conf, atol=1e-4)


def test_linear_on_class_clusters_matches_sklearn_and_its_weights(clusters, tmp_path):
    store, _, _ = clusters
    db = tmp_path / "f.duckdb"
    out = run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress").output
    assert "wrote run synthetic/clean/linear" in out
    assert "probes linear@clean" in run_cli("info", store).output
    assert_matches_sklearn(store, "synthetic", db, "synthetic/clean/linear")
    assert_predictions_recompute(store, "synthetic", "clean", db, "synthetic/clean/linear", "linear@clean")


def test_linear_on_real_stored_features_matches_sklearn(digits_store, digits_linear):
    db, _ = digits_linear
    assert_matches_sklearn(digits_store, "resnet18", db, "resnet18/clean/linear")
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM anchors WHERE model = 'resnet18'").fetchone() == (12,)
    model_acc = con.execute("SELECT count(*) FROM model_outputs WHERE view = 'clean'").fetchone()[0]
    assert model_acc == FeatureStore(digits_store).num_images


def predictions(db, run_id: str) -> np.ndarray:
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT pred, conf FROM predictions WHERE run_id = ? ORDER BY image_id, anchor",
                       [run_id]).fetchnumpy()
    con.close()
    return np.stack([rows["pred"].astype(np.float64), rows["conf"].astype(np.float64)])


def test_a_streamed_fit_has_its_own_name_and_both_paths_agree(clusters, tmp_path):
    """Streamed chunks give other batches than a permutation of all rows, so other predictions: the run says so
    in its id and lands beside the in-memory run instead of replacing it. Rows held in memory without room for
    their prepared copy follow the streamed schedule exactly (same predictions, same name)."""
    store, _, _ = clusters
    db = tmp_path / "f.duckdb"
    in_memory = "synthetic/clean/linear"
    result = run_cli("probe", "--store", store, "--model", "synthetic", "--db", db)
    assert f"wrote run {in_memory}\n" in result.output and "streaming" not in result.output
    before = predictions(db, in_memory)
    result = run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--memory-budget", "0")
    assert "streaming" in result.output and f"wrote run {in_memory}/streamed" in result.output
    streamed = predictions(db, f"{in_memory}/streamed")
    assert np.array_equal(predictions(db, in_memory), before)  # the in-memory run is still there, unchanged
    rows, fit_rows = 2400 * sum(DIMS) * 4, 1680 * sum(DIMS) * 4  # every row in memory, but no room for the fit's copy
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--memory-budget", str(rows + fit_rows // 2),
            "--no-progress")
    assert np.array_equal(predictions(db, f"{in_memory}/streamed"), streamed)
    con = duckdb.connect(str(db), read_only=True)
    assert sorted(r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()) == [in_memory,
                                                                                       f"{in_memory}/streamed"]
    assert [s for (s,) in con.execute("SELECT streamed FROM runs ORDER BY run_id").fetchall()] == [False, True]
    con.close()
    accs = {run: probe_accuracy(db, run) for run in (in_memory, f"{in_memory}/streamed")}
    assert np.allclose(*accs.values(), atol=0.015), accs
    assert_matches_sklearn(store, "synthetic", db, f"{in_memory}/streamed")
    assert len(read_probe(store, "synthetic", "linear-streamed@clean", "anchor00")[0]) == 1


def test_cross_fit_predicts_every_image_once_out_of_sample(clusters, tmp_path):
    store, _, _ = clusters
    db = tmp_path / "f.duckdb"
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--cross-fit", "3", "--no-progress")
    run_id = "synthetic/clean/linear/cf3"
    con = duckdb.connect(str(db), read_only=True)
    folds = con.execute("SELECT fold, count(*), count(DISTINCT image_id) FROM folds WHERE run_id = ? "
                        "GROUP BY fold ORDER BY fold", [run_id]).fetchall()
    assert [f for f, _, _ in folds] == [0, 1, 2] and sum(c for _, c, _ in folds) == 2400
    assert con.execute("SELECT count(DISTINCT image_id) FROM folds WHERE run_id = ?", [run_id]).fetchone() == (2400,)
    con.close()
    assert_predictions_recompute(store, "synthetic", "clean", db, run_id, "linear-cf3@clean")
    # each fold's probe never saw its own images: refitting on them would make it far better than out-of-sample
    w, b, attrs = read_probe(store, "synthetic", "linear-cf3@clean", "anchor00")
    assert w.shape[0] == 3 and len(attrs["folds"]) == 3


def test_rerun_replaces_rows_and_views_use_clean_probes(clusters, tmp_path):
    store, _, _ = clusters
    db = tmp_path / "f.duckdb"
    for _ in range(2):
        out = run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--view", "all",
                      "--no-progress").output
    assert "synthetic/noisy/linear/train=clean" in out
    con = duckdb.connect(str(db), read_only=True)
    runs = con.execute("SELECT run_id, view, train_view FROM runs ORDER BY run_id").fetchall()
    assert runs == [("synthetic/clean/linear", "clean", "clean"),
                    ("synthetic/noisy/linear/train=clean", "noisy", "clean")]
    assert con.execute("SELECT count(*) FROM predictions").fetchone() == (2 * 2400 * 4,)
    con.close()
    assert_predictions_recompute(store, "synthetic", "noisy", db, "synthetic/noisy/linear/train=clean",
                                 "linear@clean")
    noisy = probe_accuracy(db, "synthetic/noisy/linear/train=clean")
    clean = probe_accuracy(db, "synthetic/clean/linear")
    assert np.mean(noisy) < np.mean(clean)
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--view", "noisy", "--train-on-view",
            "noisy", "--no-progress")
    con = duckdb.connect(str(db), read_only=True)
    assert ("noisy",) in con.execute("SELECT train_view FROM runs WHERE run_id = 'synthetic/noisy/linear'").fetchall()


def test_keep_landed_keeps_a_jobs_runs_only_while_nothing_about_them_changed(clusters, tmp_path, monkeypatch):
    """`ProbeConfig(keep_landed=True)` (the demo's rerun): the same job again keeps its runs (same weights version);
    a job of another featstore version, or one whose weights were deleted from the store, fits again."""
    from featstore.compute.specs import RunOptions
    from featstore.workflows import probe as probe_job

    src, _, _ = clusters
    store = tmp_path / "s.zarr"
    shutil.copytree(src, store)  # the weights are saved into the store: a copy of the module's
    db = tmp_path / "f.duckdb"
    cfg = probe_job.ProbeConfig(store=store, model="synthetic", db=db, view="all", keep_landed=True,
                                run=RunOptions(progress=False))

    def versions() -> dict:
        con = duckdb.connect(str(db), read_only=True)
        try:
            return dict(con.execute("SELECT run_id, probe_version FROM runs").fetchall())
        finally:
            con.close()

    first = probe_job.probe(cfg)
    landed = versions()
    assert sorted(first) == sorted(landed) == ["synthetic/clean/linear", "synthetic/noisy/linear/train=clean"]
    assert probe_job.probe(cfg) == first and versions() == landed  # kept: nothing fitted or written
    monkeypatch.setattr(probe_job, "__version__", "0.0.0+other")
    probe_job.probe(cfg)
    refitted = versions()
    assert all(refitted[r] != landed[r] for r in landed)  # another version's parameters: fitted again
    monkeypatch.undo()
    probe_job.probe(cfg)  # back to this version: fitted again (its params differ from the other version's)
    current = versions()
    name, version = "linear@clean", current["synthetic/clean/linear"]
    shutil.rmtree(store / "synthetic" / "probes" / name / version)
    probe_job.probe(cfg)
    assert versions()["synthetic/clean/linear"] != version  # its weights gone from the store: fitted again


def test_paper_variant_stops_with_patience_and_projected_folds_back(clusters, tmp_path):
    store, _, _ = clusters
    db = tmp_path / "f.duckdb"
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", "paper", "--no-progress")
    _, _, attrs = read_probe(store, "synthetic", "paper@clean", "anchor03")
    info = attrs["folds"][0]
    assert info["epochs"] <= 100 and info["epochs"] - 1 - info["best_epoch"] <= 10 and info["converged"]
    assert info["val_accuracy"] == max(info["val_accuracy_history"])
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", "projected:dim=16",
            "--no-progress")
    w, _, attrs = read_probe(store, "synthetic", "projected16@clean", "anchor03")
    assert w.shape == (1, 8, 128) and attrs["folds"][0]["projected_to"] == 16
    assert np.linalg.matrix_rank(w[0].astype(np.float64)) <= 8
    assert_predictions_recompute(store, "synthetic", "clean", db, "synthetic/clean/projected16", "projected16@clean")


def test_a_failed_write_leaves_no_partial_run(clusters, tmp_path, monkeypatch):
    store, _, _ = clusters
    db = tmp_path / "f.duckdb"
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress")
    fail_after_inserting(monkeypatch, "predictions", "disk full while writing")
    with pytest.raises(OSError, match="disk full"):
        run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", "projected:dim=16",
                "--no-progress")
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT run_id FROM runs").fetchall() == [("synthetic/clean/linear",)]
    assert con.execute("SELECT run_id, count(*) FROM predictions GROUP BY run_id").fetchall() == [
        ("synthetic/clean/linear", 2400 * 4)]


def test_refusals_write_nothing(clusters, tmp_path):
    store, feats, labels = clusters
    db = tmp_path / "f.duckdb"
    assert "no model 'resnet50'" in fails("probe", "--store", store, "--model", "resnet50", "--db", db)
    assert "no view 'fog-1'" in fails("probe", "--store", store, "--model", "synthetic", "--view", "fog-1", "--db", db)
    assert "unknown probe variant" in fails("probe", "--store", store, "--model", "synthetic", "--variant", "svm",
                                            "--db", db)
    assert not db.exists()

    partial = shutil.copytree(store, tmp_path / "partial.zarr")
    (partial / "synthetic" / "clean" / "done" / "c" / "3").unlink()
    line = fails("probe", "--store", partial, "--model", "synthetic", "--db", db)
    assert "incomplete" in line and "chunk 3" in line and "featstore build" in line
    assert not db.exists()

    run_cli("probe", "--store", store, "--model", "synthetic", "--db", tmp_path / "vf.duckdb", "--no-progress")
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", tmp_path / "vf.duckdb", "--val-frac",
                 "0.2")
    assert "val fraction of 0.1" in line

    other = write_feature_store(tmp_path / "other.zarr", [f[:300] for f in feats], labels[:300], 8)
    run_cli("probe", "--store", other, "--model", "synthetic", "--db", db, "--no-progress")
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", db)
    assert "another image set" in line and str(db) in line
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM predictions").fetchone() == (300 * 4,)
    con.close()


def test_streaming_steps_per_epoch_follow_the_chunks(clusters):
    from featstore.probing.source import FeatureSource

    store, _, _ = clusters
    fs = FeatureStore(store)
    rows = np.sort(np.random.default_rng(0).choice(2400, 1500, replace=False))
    streaming = FeatureSource(fs, "synthetic", "clean", fs.anchors("synthetic"), rows, torch.device("cpu"), 0)
    per_chunk = np.bincount(rows // 256)
    assert streaming.steps_per_epoch(rows, 100) == int(np.sum(np.ceil(per_chunk[per_chunk > 0] / 100)))


def test_a_database_locked_by_another_process(clusters, tmp_path):
    store, _, _ = clusters
    db = tmp_path / "f.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('ready', flush=True); time.sleep(60)", str(db)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        line = fails("probe", "--store", store, "--model", "synthetic", "--db", db)
        assert "in use by another process" in line and str(db) in line
    finally:
        holder.kill()
        holder.wait()


def test_runs_record_their_parameters(clusters, tmp_path):
    store, _, _ = clusters
    db = tmp_path / "f.duckdb"
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--seed", "0", "--no-progress")
    con = duckdb.connect(str(db), read_only=True)
    name, params = con.execute("SELECT probe_name, params FROM runs").fetchone()
    assert name == "linear@clean" and json.loads(params)["max_epochs"] == 200
    splits = dict(con.execute("SELECT split, count(*) FROM images GROUP BY split").fetchall())
    assert splits == {"train": 1512, "val": 168, "test": 720}
