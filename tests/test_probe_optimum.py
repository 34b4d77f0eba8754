"""The default `linear` probe is a measurement: an L2 strength chosen on the val rows, solved to the optimum of
that objective, so its predictions are an exact solver's (scikit-learn at tol 1e-8) and do not move with the
thread count; its recorded val accuracy is on rows it did not learn from."""

from __future__ import annotations

import copy
import json
import warnings

import duckdb
import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.preprocessing import StandardScaler
from synthetic import class_clusters, write_feature_store

from featstore.probing.split import make_split
from featstore.store.reader import FeatureStore

from conftest import fails, run_cli


def _run(db, run_id: str) -> tuple[np.ndarray, np.ndarray, list[dict], np.ndarray]:
    """Predictions [images, anchors] (image-id order), image ids, each anchor's fit record, val accuracies."""
    con = duckdb.connect(str(db), read_only=True)
    got = con.execute("SELECT image_id, anchor, pred FROM predictions WHERE run_id = ? ORDER BY image_id, anchor",
                      [run_id]).fetchnumpy()
    fits = con.execute("SELECT info, val_accuracy FROM probe_fits WHERE run_id = ? ORDER BY anchor",
                       [run_id]).fetchall()
    con.close()
    ids = np.unique(got["image_id"])
    return (got["pred"].reshape(len(ids), -1), ids, [json.loads(info) for info, _ in fits],
            np.array([v for _, v in fits], dtype=float))


def decision_layers(preds: np.ndarray, k: int) -> np.ndarray:
    """docs/design.md §7 by hand: the first l <= T-k with the same prediction at l..l+k, else T (never stable)."""
    t = preds.shape[1] - 1
    return np.array([next((a for a in range(t - k + 1) if (row[a : a + k + 1] == row[a]).all()), t) for row in preds])


def fractions(preds: np.ndarray, k: int) -> np.ndarray:
    """Early (l < 0.3T), mid, late (l >= 0.7T) and never-stable shares of l*(k), as the macros define them."""
    t = preds.shape[1] - 1
    layer = decision_layers(preds, k)
    never = np.array([not any((row[a : a + k + 1] == row[a]).all() for a in range(t - k + 1)) for row in preds])
    return np.array([(layer < 0.3 * t).mean(), ((layer >= 0.3 * t) & (layer < 0.7 * t)).mean(),
                     (layer >= 0.7 * t).mean(), never.mean()])


def standardised(x: np.ndarray, fit: np.ndarray) -> np.ndarray:
    return StandardScaler().fit(x[fit].astype(np.float64)).transform(x.astype(np.float64))


# scikit-learn's Newton-CG solver: at tol 1e-8 it reaches the optimum L-BFGS reaches, with the same predictions on
# every test image at the anchors measured, in 2-10x less time (0.15-0.35 s vs 0.3-2.1 s on the digits' anchors)
EXACT = dict(tol=1e-8, max_iter=10_000, solver="newton-cg")


def exact(z: np.ndarray, labels: np.ndarray, rows: np.ndarray, c: float) -> LogisticRegression:
    """scikit-learn solved to tol 1e-8: the independent exact optimum of the same objective."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return LogisticRegression(C=c, **EXACT).fit(z[rows], labels[rows])


def exact_path(z: np.ndarray, labels: np.ndarray, rows: np.ndarray, cs: list[float]) -> dict[float, LogisticRegression]:
    """`exact` at each C, solved in ascending C, each solve starting at the last one's optimum (scikit-learn's
    warm_start): the same optima to tol 1e-8 (the objective is strictly convex), in fewer iterations."""
    model, out = LogisticRegression(warm_start=True, **EXACT), {}
    for c in sorted(cs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            out[c] = copy.deepcopy(model.set_params(C=c).fit(z[rows], labels[rows]))
    return out


@pytest.fixture(scope="module")
def digits_run(digits_store, digits_linear):
    db, _ = digits_linear
    fs = FeatureStore(digits_store)
    table = fs.image_table()
    feats = [fs.read("resnet18", "clean", a.name) for a in fs.anchors("resnet18")]
    return db, feats, table["label"], make_split(table["image_id"]), table["image_id"]


def test_predictions_are_an_exact_solvers_at_the_chosen_strength(digits_run):
    """Per anchor >= 99.5% of test images as scikit-learn at tol 1e-8 with featstore's C on the same standardised
    train + val rows; the decision-layer fractions at k = 1..4 within 0.005; accuracy no worse than scikit-learn's
    own default (C = 1, tol 1e-4) less 0.5 pp."""
    db, feats, labels, split, ids = digits_run
    ours, got_ids, fits, _ = _run(db, "resnet18/clean/linear")
    assert np.array_equal(got_ids, ids)
    fit, test = np.isin(split, ["train", "val"]), split == "test"
    theirs = np.empty_like(ours)
    for a, x in enumerate(feats):
        z = standardised(x, fit)
        c = fits[a]["C"]
        assert c in (0.001, 0.00316, 0.01, 0.0316, 0.1, 0.316, 1, 3.16, 10, 31.6, 100), c  # the declared grid
        theirs[:, a] = exact(z, labels, fit, c).predict(z)
        agree = (ours[test, a] == theirs[test, a]).mean()
        assert agree >= 0.995, f"anchor {a} (C={c}): {agree:.4f} of test images as scikit-learn's optimum"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            default = LogisticRegression().fit(z[fit], labels[fit]).score(z[test], labels[test])
        accuracy = (ours[test, a] == labels[test]).mean()
        assert accuracy >= default - 0.005, f"anchor {a}: {accuracy:.4f} vs scikit-learn's default {default:.4f}"
    for k in (1, 2, 3, 4):
        assert np.abs(fractions(ours[test], k) - fractions(theirs[test], k)).max() <= 0.005, k


def test_the_strength_is_the_val_loss_minimum_and_val_accuracy_is_held_out(digits_run):
    """The chosen C is, among the C values the path tried, the one whose model fitted on the train rows alone has
    the lowest val cross-entropy by scikit-learn's own fits (up to a near tie); probe_fits.val_accuracy is that
    train-only model's accuracy on the val rows (to a row or two: the path solves to 1e-4)."""
    db, feats, labels, split, _ = digits_run
    _, _, fits, val_accuracy = _run(db, "resnet18/clean/linear")
    fit, train, val = np.isin(split, ["train", "val"]), split == "train", split == "val"
    for a in (0, len(feats) // 2, len(feats) - 1):
        z = standardised(feats[a], fit)
        tried = [float(c) for c in fits[a]["val_loss_per_C"]]
        models = exact_path(z, labels, train, tried)
        losses = {c: log_loss(labels[val], m.predict_proba(z[val]), labels=m.classes_) for c, m in models.items()}
        best = min(losses.values())
        assert losses[fits[a]["C"]] <= best * (1 + 1e-3), (a, fits[a]["C"], losses)
        for c in tried:  # the path's value of each C is scikit-learn's to a few % (the path is a search, not exact)
            assert fits[a]["val_loss_per_C"][format(c, "g")] == pytest.approx(losses[c], rel=0.05, abs=2e-3)
        held_out = models[fits[a]["C"]].score(z[val], labels[val])
        assert abs(val_accuracy[a] - held_out) <= 2.5 / val.sum(), (a, val_accuracy[a], held_out)


def test_the_same_probe_at_one_and_two_threads(digits_store, digits_linear, tmp_path):
    """The same decision-layer table and >= 99.99% identical predictions (here: all of them) at --threads 1 and 2:
    the solve goes to where float sums split over another thread count no longer move a prediction."""
    runs = {}
    for threads in (1, 2):  # the session's fit is the one at --threads 1
        db = digits_linear[0] if threads == 1 else tmp_path / f"t{threads}.duckdb"
        if threads == 2:
            run_cli("probe", "--store", digits_store, "--model", "resnet18", "--db", db, "--no-progress",
                    "--threads", threads)
        con = duckdb.connect(str(db), read_only=True)
        layers = con.execute("SELECT * FROM decision_layers(2) ORDER BY run_id, image_id").fetchall()
        con.close()
        runs[threads] = (*_run(db, "resnet18/clean/linear"), layers)
    one, two = runs[1], runs[2]
    assert (one[0] == two[0]).mean() >= 0.9999
    assert [f["C"] for f in one[2]] == [f["C"] for f in two[2]]
    assert [f["threads"] for f in one[2]] == [1] * len(one[2]) and [f["threads"] for f in two[2]] == [2] * len(two[2])
    assert one[4] == two[4]


def test_a_pinned_strength_skips_the_search(tmp_path):
    """`linear:C=1` solves scikit-learn's C = 1 objective to its optimum: its own run id, C recorded as pinned."""
    feats, labels = class_clusters(1500, 6, [16, 48], seed=5)
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, 6, chunk_rows=512)
    db = tmp_path / "f.duckdb"
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress", "--variant", "linear:C=1")
    ours, _, fits, val_accuracy = _run(db, "synthetic/clean/linear:C=1")
    split = make_split(np.arange(len(labels)))
    fit, test = np.isin(split, ["train", "val"]), split == "test"
    for a, x in enumerate(feats):
        assert fits[a]["C"] == 1 and fits[a]["C_chosen_on"] == "pinned" and list(fits[a]["val_loss_per_C"]) == ["1"]
        z = standardised(x, fit)
        assert (ours[test, a] == exact(z, labels, fit, 1.0).predict(z[test])).mean() >= 0.995
        assert np.isfinite(val_accuracy[a])


def test_classes_without_fit_rows_are_left_out_as_scikit_learn_leaves_them(tmp_path):
    """A 40-way store whose images are of 6 classes (a 1,000-way head on ten ImageNet classes): the solve is over
    the classes present, as scikit-learn's, which knows only the classes in y; the others are never predicted,
    their probability is 0, and the fit record counts them."""
    import featstore as fs

    feats, labels = class_clusters(1200, 6, [16, 48], seed=7)
    present = np.array([0, 3, 9, 17, 25, 39])
    named = present[labels]
    store = write_feature_store(tmp_path / "s.zarr", feats, named, 40, chunk_rows=512)
    db = tmp_path / "f.duckdb"
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress")
    ours, ids, fits, _ = _run(db, "synthetic/clean/linear")
    split = make_split(np.arange(len(labels)))
    fit, test = np.isin(split, ["train", "val"]), split == "test"
    loaded = fs.load_probe(store, "synthetic", "synthetic/clean/linear", db=db)
    for a, x in enumerate(feats):
        assert fits[a]["classes_without_rows"] == 34
        z = standardised(x, fit)
        assert (ours[test, a] == exact(z, named, fit, fits[a]["C"]).predict(z[test])).mean() >= 0.995, a
        proba = loaded.predict_proba(a, x[ids])
        assert proba.shape == (len(ids), 40) and not proba[:, np.setdiff1d(np.arange(40), present)].any()
        assert np.allclose(proba.sum(axis=1), 1, atol=1e-5)


def test_no_val_rows_to_choose_on_is_one_line(tmp_path):
    """Five images leave no val row: the search (and a pinned C's held-out figure) is refused in one line before
    anything is written."""
    feats, labels = class_clusters(5, 2, [4, 8], seed=1)
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, 2)
    db = tmp_path / "f.duckdb"
    for variant in ("linear", "linear:C=1"):
        line = fails("probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress", "--variant",
                     variant)
        assert "holds no val rows" in line and "--val-frac" in line, line
        assert not db.exists()


def test_the_solver_itself_refuses_a_search_without_val_rows():
    """Called directly (no split check before it), the search names the two ways out."""
    import torch

    from featstore.errors import FeatstoreError
    from featstore.probing.strength import Softmax, StrengthGrid, Tolerances, choose_and_solve

    x, y, no_val = torch.randn(1, 20, 3), torch.arange(20) % 2, torch.zeros(20, dtype=torch.bool)
    with pytest.raises(FeatstoreError, match="no val rows to choose the probe's L2 strength on.*linear:C=1"):
        choose_and_solve(x, y, no_val, Softmax(2), StrengthGrid(), Tolerances())
    solved = choose_and_solve(x, y, no_val, Softmax(2), StrengthGrid(pinned=1.0), Tolerances())
    assert solved.c == [1.0] and solved.states[0].stop == "gradient"
