"""Prediction depth with the input as layer 0 (Baldock, Maennel and Neyshabur, NeurIPS 2021): the opt-in `input`
anchor stores the preprocessed image averaged over an 8x8 grid, equal to torch's `adaptive_avg_pool2d` of the batch
torchvision's own transforms make; prediction depth read from k-NN probes over it equals a plain loop over
scikit-learn's `KNeighborsClassifier` on the stored rows, the input counted as layer 0; an image no anchor settles
is counted unsettled, apart from late, and every depth says its layer 0 and the rows that voted."""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl
import pytest
import torch.nn.functional as F
from sklearn.neighbors import KNeighborsClassifier

from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.nets.anchors import PRESETS
from featstore.store.reader import FeatureStore
from featstore.workflows.demo import digits_image_folder

from conftest import assert_fp16_close, fails, reference_batch, run_cli

KEY = "resnet18"
RUN = "resnet18/clean/knn:metric=euclidean,ties=lowest"
K = 30


@pytest.fixture(scope="module")
def input_store(tmp_path_factory):
    """300 of scikit-learn's digits through a random-init resnet18 with the input before its preset anchors."""
    root = tmp_path_factory.mktemp("depth_input")
    images = digits_image_folder(root / "images", size=32, limit=300)
    run_cli("build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--data", images,
            "--store", root / "s.zarr", "--anchors", "input,default", "--workers", "0", "--no-progress")
    return root / "s.zarr", images


def test_input_anchor_is_the_preprocessed_image_on_an_8x8_grid(input_store):
    store, images = input_store
    fs = FeatureStore(store)
    anchors = fs.anchors(KEY)
    assert [a.name for a in anchors] == ["input", *PRESETS["resnet18"]]  # `default` stands for the preset
    assert (anchors[0].dim, anchors[0].depth_frac, anchors[0].side, anchors[0].module) == (192, 0.0, "input", "")
    x = reference_batch([images / p for p in fs.image_table()["path"]], fs.model_attrs(KEY)["config"]["preprocessing"])
    expected = F.adaptive_avg_pool2d(x, 8).flatten(1).numpy()  # [N, 3 x 8 x 8], channel-major
    assert_fp16_close(fs.read(KEY, "clean", "input"), expected, "input")


def test_input_goes_first_and_is_listed(input_store, tmp_path):
    store, images = input_store
    message = fails("build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--data", images,
                    "--store", tmp_path / "s.zarr", "--anchors", "relu,input", "--limit", "2")
    assert "input" in message and "first" in message
    assert not (tmp_path / "s.zarr").exists()
    assert run_cli("anchors", "--model", "resnet18", "--all").output.splitlines()[0] == "input"


def baldock_depth(preds: np.ndarray, head: int) -> int:
    """The earliest layer l from which the prediction equals the final one at every layer l..T (layer 0 = the input);
    T + 1 when even layer T differs."""
    for layer in range(len(preds)):
        if all(p == head for p in preds[layer:]):
            return layer
    return len(preds)


def test_prediction_depth_counts_the_input_as_layer_0(input_store, tmp_path):
    store, _ = input_store
    db = tmp_path / "f.duckdb"
    run_cli("probe", "--store", store, "--model", KEY, "--db", db, "--variant", "knn", "--no-progress")
    fs = FeatureStore(store)
    ids, labels = fs.image_table()["image_id"], fs.image_table()["label"]
    con = duckdb.connect(str(db), read_only=True)
    split = dict(con.execute("SELECT image_id, split FROM images").fetchall())
    stored = con.execute("SELECT pred FROM predictions WHERE run_id = ? ORDER BY image_id, anchor",
                         [RUN]).fetchnumpy()["pred"]
    con.close()
    anchors = fs.anchors(KEY)
    stored = stored.reshape(len(ids), len(anchors))
    test = np.array([split[int(i)] == "test" for i in ids])
    train = np.array([split[int(i)] == "train" for i in ids])
    for a in anchors:  # the stored rows are k-NN votes of the train split: scikit-learn's on the stored features
        x = fs.read(KEY, "clean", a.name).astype(np.float64)
        sk = KNeighborsClassifier(n_neighbors=K, metric="euclidean", algorithm="brute").fit(x[train], labels[train])
        same = np.mean(sk.predict(x[test]) == stored[test, a.index])
        assert same >= 0.97, f"{a.name}: {same:.3f} of the test images as scikit-learn votes"  # float32 distance ties
    expected = stored[test]
    # a random-init head agrees with no probe: a head that is the last anchor's answer for most images, another
    # anchor's for the rest, so that depths spread and some images stay unsettled
    rng = np.random.default_rng(1)
    head_all = rng.integers(0, 10, len(ids))
    head_all[test] = np.where(rng.random(test.sum()) < 0.85, expected[:, -1],
                              expected[np.arange(test.sum()), rng.integers(0, len(anchors), test.sum())])
    head_all[test & (rng.random(len(ids)) < 0.05)] = 10  # a class no probe predicts: surely unsettled
    writer = fsdb.connect(db)
    fsdb.replace_model_outputs(writer, KEY, "clean", ids, head_all, np.full(len(ids), 0.5))
    writer.close()

    depth = q.prediction_depth(fsdb.connect(db, read_only=True), RUN)  # scope auto: the test split
    assert depth["image_id"].to_list() == ids[test].tolist()
    want = np.array([baldock_depth(p, h) for p, h in zip(expected, head_all[test], strict=True)])
    assert depth["depth"].to_list() == want.tolist()
    t = len(anchors) - 1
    assert set(depth["t"].to_list()) == {t} and depth["settled"].to_list() == (want <= t).tolist()
    assert (want == 0).any() and (want == t + 1).any()  # the input already agrees for some; some never settle
    assert set(depth["layer0"].to_list()) == {"input"}
    assert set(depth["reference_rows"].to_list()) == {"the train split of view clean"}

    result = q.compare(db, [RUN], k=2, min_conf=0.5)
    row = result.summary.filter(pl.col("kind") == "depth").row(0, named=True)
    late = np.mean((want >= 0.7 * t) & (want <= t))
    assert (row["f_late"], row["f_unsettled"]) == pytest.approx((late, np.mean(want > t)))
    assert row["f_early"] + row["f_mid"] + row["f_late"] + row["f_unsettled"] == pytest.approx(1)
    summary = result.depths.row(0, named=True)
    assert (summary["input_layer0"], summary["unsettled"], summary["n"]) == (True, int((want > t).sum()), len(want))
    text = " ".join(line.strip() for line in result.shortened().lines(None, 2, 0.5))  # unwrapped
    assert "layer 0 = the input image" in text and "references: the train split of view clean" in text
    assert f"{int((want > t).sum())} of {len(want)}" in text
