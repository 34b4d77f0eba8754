"""The learned exit gate: its features equal a plain loop over each timeline, its fit scikit-learn's
LogisticRegression(C=1) on them, and exit-sim's 'learned' policy a plain simulation over the stored scores, on the
images the gate never saw; exit-sim writes nothing."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from sklearn.linear_model import LogisticRegression
from synthetic import register_toy_images, run_rows

from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.analytics.exit_policies import ExitPolicies
from featstore.records import AnchorCost, ModelCost
from featstore.workflows.gate import FEATURES, fit_logistic, gate_features

from conftest import fails, run_cli

N, T = 400, 5
RUN = "m/clean/linear"
PREFIX_MS, PROBE_MS, FULL_MS = [1.0, 2.0, 3.0, 5.0, 8.0, 9.0], 0.25, 10.0


def features_loop(preds: list[int], confs: list[float]) -> list[list[float]]:
    """The gate's features at every anchor, from the timeline up to it, one by one."""
    rows = []
    for layer in range(len(preds)):
        c, before = confs[layer], confs[:layer]
        stable = 0
        while stable < layer and preds[layer - stable - 1] == preds[layer]:
            stable += 1
        clipped = min(max(c, 1e-6), 1 - 1e-6)
        changes = sum(preds[j] != preds[j - 1] for j in range(1, layer + 1))
        rows.append([c, np.log(clipped / (1 - clipped)), float(layer > 0 and preds[layer] == preds[layer - 1]),
                     stable / T, c - confs[layer - 1] if layer else 0.0, c - max(before) if before else 0.0,
                     sum(confs[: layer + 1]) / (layer + 1), preds[: layer + 1].count(preds[layer]) / (layer + 1),
                     changes / T] + [float(a == layer) for a in range(len(preds))])
    return rows


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Timelines whose confidence tracks whether the prediction is already the head's and right, the head, costs."""
    rng = np.random.default_rng(11)
    db = tmp_path_factory.mktemp("gate") / "f.duckdb"
    con = fsdb.connect(db)
    ids = np.arange(N)
    labels = rng.integers(0, 3, N)
    split = rng.choice(["train", "val", "test"], N, p=[0.6, 0.1, 0.3])
    register_toy_images(con, labels, split, ("m",), T + 1)
    head = np.where(rng.random(N) < 0.8, labels, rng.integers(0, 3, N))
    settle = rng.integers(0, T + 1, N)
    preds = rng.integers(0, 3, (N, T + 1))
    for i in range(N):
        preds[i, settle[i]:] = head[i]
    good = (preds == labels[:, None]) & (preds == head[:, None])
    confs = np.clip(0.45 + 0.3 * good + rng.normal(0, 0.15, preds.shape), 0.01, 0.99).astype(np.float32)
    fsdb.write_runs(con, [run_rows({"run_id": RUN, "model": "m", "view": "clean"}, ids, preds, confs)])
    fsdb.replace_model_outputs(con, "m", "clean", ids, head, np.full(N, 0.9))
    fsdb.replace_costs(con, "m", ModelCost("dev", 1, FULL_MS, 100, [AnchorCost(a, ms, 10 * a, PROBE_MS, 1)
                                                                     for a, ms in enumerate(PREFIX_MS)]))
    con.close()
    return SimpleNamespace(db=db, ids=ids, labels=labels, split=split, head=head, preds=preds, confs=confs)


def test_features_equal_a_plain_loop(world):
    got, names = gate_features(world.preds[:50], world.confs[:50])
    assert names[: len(FEATURES)] == list(FEATURES) and len(names) == len(FEATURES) + T + 1
    for i in range(50):
        expected = features_loop(world.preds[i].tolist(), world.confs[i].astype(np.float64).tolist())
        assert np.allclose(got[i], expected, atol=1e-12), i


def test_logistic_fit_equals_scikit_learn():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (3000, 6)) * [1, 10, 0.1, 1, 5, 2] + [0, 3, 0, 1, 0, 0]
    y = (x @ [1.0, 0.2, -8.0, 0.5, 0.0, 0.3] + rng.logistic(0, 1, 3000) > 0.5).astype(float)
    fit = fit_logistic(x, y)
    z = (x - x.mean(axis=0)) / x.std(axis=0)
    ref = LogisticRegression(C=1.0, tol=1e-10, max_iter=10_000).fit(z, y)
    assert np.allclose(fit.weight, ref.coef_[0], atol=1e-5) and fit.bias == pytest.approx(ref.intercept_[0], abs=1e-5)
    assert np.allclose(fit.score(x), ref.predict_proba(z)[:, 1], atol=1e-6)


def test_gate_scores_and_the_learned_policy_match_plain_computations(world):
    out = run_cli("gate", "--db", world.db, "--run", RUN).output
    assert f"gate for {RUN}: fitted on {int((world.split == 'train').sum())} train images" in out
    assert "featstore exit-sim" in out
    scores = q.query(world.db, "SELECT image_id, anchor, score, learnt FROM gate_scores ORDER BY image_id, anchor")
    score = scores["score"].to_numpy().reshape(N, T + 1)
    learnt = scores["learnt"].to_numpy().reshape(N, T + 1)[:, 0]
    assert np.array_equal(learnt, world.split == "train")
    # independent: the plain-loop features, scikit-learn's logistic regression on the train images
    x = np.array([features_loop(p.tolist(), c.astype(np.float64).tolist())
                  for p, c in zip(world.preds, world.confs, strict=True)])
    y = (world.preds == world.labels[:, None]) & (world.preds == world.head[:, None])
    flat = x[learnt].reshape(-1, x.shape[-1])
    mean, std = flat.mean(axis=0), flat.std(axis=0)
    std[std < 1e-12] = 1.0
    ref = LogisticRegression(C=1.0, tol=1e-10, max_iter=10_000).fit((flat - mean) / std, y[learnt].ravel())
    expected = ref.predict_proba(((x - mean) / std).reshape(-1, x.shape[-1]))[:, 1].reshape(N, T + 1)
    assert np.allclose(score, expected, atol=1e-4)

    thetas = [0.3, 0.6, 0.9]
    sim = q.exit_simulation(world.db, RUN, "dev", policies=ExitPolicies(thresholds=tuple(thetas)), scope="all")
    learned = sim.filter(pl.col("policy") == "learned").sort("theta")
    assert learned["theta"].to_list() == thetas
    unseen = ~learnt
    for row in learned.iter_rows(named=True):
        exits = [next((a for a in range(T + 1) if np.float32(score[i, a]) >= np.float32(row["theta"])), None)
                 for i in np.flatnonzero(unseen)]
        outputs = [world.head[i] if e is None else world.preds[i, e] for i, e in zip(np.flatnonzero(unseen), exits,
                                                                                      strict=True)]
        ms = [FULL_MS + PROBE_MS * (T + 1) if e is None else PREFIX_MS[e] + PROBE_MS * (e + 1) for e in exits]
        assert row["n"] == int(unseen.sum())  # the images the gate learnt from are left out
        assert row["accuracy"] == pytest.approx(np.mean(np.array(outputs) == world.labels[unseen]))
        assert row["mean_ms"] == pytest.approx(np.mean(ms))


def test_exit_sim_writes_nothing_and_a_rerun_run_drops_its_gate(world, tmp_path):
    run_cli("gate", "--db", world.db, "--run", RUN)
    before = hashlib.sha256(world.db.read_bytes()).hexdigest()
    out = run_cli("exit-sim", "--db", world.db, "--run", RUN, "--thresholds", "0.5,0.9").output
    assert "learned" in out
    assert hashlib.sha256(world.db.read_bytes()).hexdigest() == before
    assert "no run 'm/clean/nope'" in fails("gate", "--db", world.db, "--run", "m/clean/nope")
    con = fsdb.connect(world.db)
    try:
        fsdb.write_runs(con, [run_rows({"run_id": RUN, "model": "m", "view": "clean"}, world.ids, world.preds,
                                       world.confs)])
        assert q.query(con, "SELECT count(*) AS n FROM gate_scores")["n"][0] == 0  # it learnt the old predictions
    finally:
        con.close()
