"""`knn` against scikit-learn's KNeighborsClassifier on real stored features (the digits through a ResNet-18), same
k, metric and raw features. The default (k = 30, euclidean, ties to the lowest class, a train row left out of its
own neighbours) is scikit-learn's `KNeighborsClassifier(n_neighbors=30, metric="euclidean")`: test rows are its
`predict(X)`, train rows its leave-one-out `predict()` (no X: "points are not considered their own neighbors"),
identical per image and anchor except where the k-th and (k+1)-th neighbours are equally far at float32 precision
(the k nearest are then not unique; counted here independently); prediction depth read from those predictions by a
plain loop equals `prediction_depth`. The old rule (`metric=cosine,ties=nearer,leave_out=none`) is checked against
scikit-learn's neighbours voting by that rule in numpy. The store keeps which rows were the references, not the
features."""

from __future__ import annotations

import duckdb
import numpy as np
from sklearn.neighbors import KNeighborsClassifier
from synthetic import read_probe_arrays

from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.probing.split import make_split
from featstore.store.reader import FeatureStore

from conftest import fails, run_cli


def stored(db, run_id: str) -> tuple[np.ndarray, np.ndarray]:
    con = duckdb.connect(str(db), read_only=True)
    got = con.execute("SELECT pred, conf FROM predictions WHERE run_id = ? ORDER BY image_id, anchor",
                      [run_id]).fetchnumpy()
    con.close()
    return got["pred"], got["conf"]


def explained(gap: float, tolerance: float, labels: np.ndarray, k: int) -> bool:
    """A row on which two correct k-NN rules may differ: its k-th and (k+1)-th neighbours are equally far at float32
    precision (the set of k nearest is not unique: `gap` <= `tolerance`), or two classes share the top vote count
    (scikit-learn takes the lower label, knn the one whose voters are nearer)."""
    if gap <= tolerance:
        return True
    counts = np.bincount(labels[:k])
    return int((counts == counts.max()).sum()) > 1


def nearer_voters(labels: np.ndarray, distance: np.ndarray, k: int) -> int:
    """knn's vote by hand: the most votes among the k nearest, a tie to the class with the smaller distance sum."""
    counts = np.bincount(labels[:k])
    tied = np.flatnonzero(counts == counts.max())
    sums = [distance[:k][labels[:k] == c].sum() for c in tied]
    return int(tied[int(np.argmin(sums))])


def boundary(x: np.ndarray, refs: np.ndarray, distance: np.ndarray, index: np.ndarray, k: int,
             metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Per row the distance gap between the (k+1)-th and k-th neighbour, and what float32 can resolve of it: cosine
    distances to ~1e-5; squared euclidean distances (|x|^2 + |r|^2 - 2 x.r) to ~1e-5 of |x|^2 + |r|^2."""
    if metric == "cosine":
        return distance[:, k] - distance[:, k - 1], np.full(len(x), 1e-5)
    terms = (x * x).sum(axis=1) + (refs[index[:, k]] ** 2).sum(axis=1)
    return distance[:, k] ** 2 - distance[:, k - 1] ** 2, 1e-5 * terms


def depth_loop(preds: np.ndarray, head: int) -> int:
    """Prediction depth of one image by hand: the first anchor from which every prediction is the head's."""
    depth = len(preds)
    for layer in range(len(preds) - 1, -1, -1):
        if preds[layer] != head:
            break
        depth = layer
    return depth


def test_knn_default_is_scikit_learns_classifier_per_image_and_anchor(digits_store, tmp_path):
    store, db, k = digits_store, tmp_path / "f.duckdb", 30
    run_id = "resnet18/clean/knn:metric=euclidean,ties=lowest"
    assert f"wrote run {run_id}" in run_cli("probe", "--store", store, "--model", "resnet18", "--db", db,
                                            "--variant", "knn", "--no-progress").output
    fs = FeatureStore(store)
    labels = fs.image_table()["label"]
    train = make_split(fs.image_table()["image_id"]) == "train"
    anchors = fs.anchors("resnet18")
    pred, conf = stored(db, run_id)
    pred, conf = pred.reshape(len(labels), len(anchors)), conf.reshape(len(labels), len(anchors))
    expected = np.empty_like(pred)
    unique = np.ones(pred.shape, dtype=bool)  # the k nearest are one set at float32 precision
    same = total = 0
    for anchor in anchors:
        arrays = read_probe_arrays(store, "resnet18", "knn:metric=euclidean,ties=lowest@clean", anchor.name)
        assert set(arrays) == {"reference"} and np.array_equal(arrays["reference"][0], train)  # rows, not features
        x = fs.read("resnet18", "clean", anchor.name).astype(np.float64)
        sk = KNeighborsClassifier(n_neighbors=k, metric="euclidean", algorithm="brute").fit(x[train], labels[train])
        a = anchor.index
        expected[~train, a] = sk.predict(x[~train])
        expected[train, a] = sk.predict(None)  # leave-one-out: no X
        share = np.empty(len(x))
        share[~train], share[train] = sk.predict_proba(x[~train]).max(axis=1), sk.predict_proba(None).max(axis=1)
        for rows, queries in ((~train, x[~train]), (train, None)):
            distance, index = sk.kneighbors(queries, n_neighbors=k + 1)
            gap, tolerance = boundary(x[rows], x[train], distance, index, k, "euclidean")
            unique[rows, a] = gap > tolerance
        differ = np.flatnonzero(pred[:, a] != expected[:, a])
        assert not unique[differ, a].any(), f"{anchor.name}: rows {differ[unique[differ, a]][:5]} differ"
        assert np.allclose(conf[unique[:, a], a], share[unique[:, a]], atol=1e-6), anchor.name  # the vote share
        same += len(x) - len(differ)
        total += len(x)
    print(f"knn: {same}/{total} predictions identical to scikit-learn's, {int(unique.sum())} with a unique k nearest")
    assert same / total >= 0.999  # measured: 21,564 of 21,564
    # a random-init network's head agrees with no probe (every depth T + 1): give the database a head that agrees
    # with the last anchors mostly, so that depth takes many values
    rng = np.random.default_rng(0)
    head = np.where(rng.random(len(labels)) < 0.8, expected[:, -1], expected[:, rng.integers(0, len(anchors))])
    con = fsdb.connect(db)
    fsdb.replace_model_outputs(con, "resnet18", "clean", fs.image_table()["image_id"], head, np.full(len(head), 0.5))
    con.close()
    depth = q.prediction_depth(duckdb.connect(str(db), read_only=True), run_id, "all")
    got = dict(zip(depth["image_id"].to_list(), depth["depth"].to_list(), strict=True))
    ids = fs.image_table()["image_id"]
    agreed = np.flatnonzero((pred == expected).all(axis=1))  # images where no float32 tie made the two differ
    assert len(agreed) >= 0.99 * len(ids)
    assert all(got[int(ids[i])] == depth_loop(expected[i], head[i]) for i in agreed)
    assert len({got[int(ids[i])] for i in agreed}) > 3  # many depths, unsettled ones among them
    assert max(got.values()) == len(anchors)


def test_knn_old_rule_is_reachable(digits_store, tmp_path):
    """`knn:metric=cosine,ties=nearer,leave_out=none` (a plain `knn` run of an older database): scikit-learn's
    neighbours (the train rows their own nearest) voting by the nearer voters' rule, in numpy."""
    store, db, k = digits_store, tmp_path / "f.duckdb", 7
    variant = "knn:k=7,metric=cosine,ties=nearer,leave_out=none"
    run_id = "resnet18/clean/knn:k=7,leave_out=none,metric=cosine,ties=nearer"
    assert f"wrote run {run_id}" in run_cli("probe", "--store", store, "--model", "resnet18", "--db", db,
                                            "--variant", variant, "--no-progress").output
    fs = FeatureStore(store)
    labels = fs.image_table()["label"]
    train = make_split(fs.image_table()["image_id"]) == "train"
    pred, _ = stored(db, run_id)
    pred = pred.reshape(len(labels), -1)
    same_rule = total = 0
    for anchor in fs.anchors("resnet18"):
        x = fs.read("resnet18", "clean", anchor.name).astype(np.float64)
        sk = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute").fit(x[train], labels[train])
        distance, index = sk.kneighbors(x, n_neighbors=k + 1)
        gap, tolerance = boundary(x, x[train], distance, index, k, "cosine")
        by_rule = np.array([nearer_voters(labels[train][index[i]], distance[i], k) for i in range(len(x))])
        clear = gap > tolerance
        assert (pred[clear, anchor.index] == by_rule[clear]).all(), anchor.name
        same_rule += int((pred[:, anchor.index] == by_rule).sum())
        total += len(x)
    assert same_rule / total >= 0.995


def test_knn_vote_ties_by_either_rule():
    """The tie rules, by hand: two classes with 2 votes each of k = 4; `nearer`: the class with nearer voters wins,
    whichever label is lower; `lowest`: class 0 wins, wherever its voters are."""
    import torch

    from featstore.probing.knn import NeighbourFit, Vote

    refs = torch.tensor([[1.0], [2.0], [3.5], [4.0], [50.0]]).T.contiguous().half()  # [D=1, n=5]
    for labels, winner in (([1, 1, 0, 0, 2], 1), ([0, 0, 1, 1, 2], 0)):
        fit = NeighbourFit(refs, torch.tensor(labels), Vote(4, "euclidean", "nearer", 2), np.zeros(5, bool))
        pred, conf = fit.predict(torch.tensor([[0.0]]))
        assert int(pred[0]) == winner and float(conf[0]) == 0.5
        lowest = NeighbourFit(refs, torch.tensor(labels), Vote(4, "euclidean", "lowest", 2), np.zeros(5, bool))
        pred, conf = lowest.predict(torch.tensor([[0.0]]))
        assert int(pred[0]) == 0 and float(conf[0]) == 0.5  # scikit-learn's rule: the lowest class among the tied


def test_knn_options_are_checked(digits_store, tmp_path):
    store = digits_store
    assert "metric" in fails("probe", "--store", store, "--model", "resnet18", "--db", tmp_path / "f.duckdb",
                             "--variant", "knn:metric=manhattan")
    assert "knn:k=many: k=many must be a whole number >= 1" in fails(
        "probe", "--store", store, "--model", "resnet18", "--db", tmp_path / "f.duckdb", "--variant", "knn:k=many")
    line = fails("probe", "--store", store, "--model", "resnet18", "--db", tmp_path / "f.duckdb", "--variant",
                 "knn:k=5000")  # more neighbours than the train split has rows: scikit-learn refuses it too
    assert "knn:k=5000 needs 5001 reference rows (a row is not its own neighbour); the probe-train split has" in line
    assert not (tmp_path / "f.duckdb").exists()
