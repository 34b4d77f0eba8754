"""What a newcomer reaches for: `connect(db).decision_layers(k)` with each image's band, the nearest macro of a
misspelled one, and a store's class names (`model(m).class_names`, `info`)."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import register_toy_images, run_rows, write_feature_store

import featstore as fs
from featstore.analytics import db as fsdb

from conftest import fails, run_cli


def hand_band(layer: int, t: int, k: int) -> str:
    """docs/design.md §5 and §7 by hand: thirds of t - k (k = 0: the paper's thirds of t), 'never' past t - k."""
    if k > 0 and layer > t - k:
        return "never"
    if layer < 0.3 * (t - k):
        return "early"
    return "late" if layer >= 0.7 * (t - k) else "mid"


@pytest.fixture(scope="module")
def settled(tmp_path_factory):
    rng = np.random.default_rng(3)
    n, anchors = 80, 10
    labels = rng.integers(0, 3, n)
    settle = rng.integers(0, anchors + 1, n)  # anchor from which the prediction stays put (anchors: never)
    preds = rng.integers(0, 3, (n, anchors))
    for i in range(n):
        preds[i, settle[i]:] = labels[i]
        if settle[i] > 0:  # the anchor just before it holds another class
            preds[i, settle[i] - 1] = (labels[i] + 1) % 3
    db = tmp_path_factory.mktemp("bands") / "f.duckdb"
    con = fsdb.connect(db)
    register_toy_images(con, labels, np.array(["test"] * n), ("m",), anchors)
    fsdb.write_runs(con, [run_rows({"run_id": "m/clean/linear", "model": "m", "view": "clean"}, np.arange(n), preds,
                                   np.full((n, anchors), 0.9, dtype=np.float32))])
    con.close()
    return db, preds


def hand_layer(row: np.ndarray, k: int) -> int:
    """l*(k) by hand: the first anchor from which the prediction holds for k more anchors; T when none does."""
    t = len(row) - 1
    return next((a for a in range(t - k + 1) if (row[a:a + k + 1] == row[a]).all()), t)


@pytest.mark.parametrize("k,band", [(1, "paper"), (2, "paper"), (3, "window")])
def test_decision_layers_from_python_carry_the_band(settled, k, band):
    db, preds = settled
    frame = fs.connect(db).decision_layers(k, band=band).sort("image_id")
    t = preds.shape[1] - 1
    assert frame["t"].to_list() == [t] * len(preds)
    assert frame["layer"].to_list() == [hand_layer(row, k) for row in preds]
    window = k if band == "window" else 0
    assert frame["band"].to_list() == [hand_band(hand_layer(row, k), t, window) for row in preds]
    assert set(frame["band"]) > {"early", "late"}


def test_a_misspelled_macro_is_answered_with_the_nearest_name(settled):

    db, _ = settled
    assert fails("sql", "--db", db, "SELECT * FROM decison_layers(2)") == (
        "featstore: error: SQL error: no table function named decison_layers; did you mean decision_layers? "
        "(featstore's macros: docs/analytics.md)")
    assert "did you mean decision_layers?" in fails("sql", "--db", db, "SELECT * FROM decision_layer")
    assert "did you mean" not in fails("sql", "--db", db, "SELECT * FROM zzzqqq")
    with pytest.raises(fs.FeatstoreError, match="no scalar function named decison_band; did you mean decision_band"):
        fs.connect(db).sql("SELECT decison_band(1, 9)")


def test_a_store_names_its_classes(tmp_path):
    """Five recorded classes, images of three of them: the model's class names index its labels, and `info` names
    the three the images carry (its JSON too)."""
    import json

    labels = np.array([0, 2, 4, 2, 0, 4, 4, 2])
    feats = [np.random.default_rng(0).normal(size=(len(labels), 3)).astype(np.float32)]
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, n_classes=5)
    model = fs.open_store(store).model("synthetic")
    assert model.class_names == ["class_0", "class_1", "class_2", "class_3", "class_4"]
    assert model.label_space == "folder-rank"
    assert [model.class_names[y] for y in model.labels] == [f"class_{y}" for y in labels]
    shown = run_cli("info", "--store", store).output.splitlines()
    assert "classes class_0, class_2, class_4" in shown
    summary = json.loads(run_cli("info", "--store", store, "--format", "json").output)
    assert summary["images"]["class_names"] == ["class_0", "class_2", "class_4"]
