"""`tuned-lens` and `head-probe` on tiny sets: each case right, checked against code written apart from
featstore, or refused in one line (exit 2) naming the field and the fix, before anything is written. 6 cases:

1. one image per class at the default val fraction: no val rows, refused naming `--val-frac`;
2. one image per class at --val-frac 0.5: right (tuned-lens: the reference loop of tests/test_tuned_lens.py, full
   batch since the rows are fewer than a batch; head-probe: the head's own class at its input, where the identity
   start is the optimum; elsewhere unchecked: the exact solver does not converge on three standardised rows);
3. a val fraction that leaves no train rows: refused naming `--val-frac` (was: tuned-lens "trained" on no rows and
   exited 0, head-probe a LinAlgError from the head's metric at a NaN marginal);
4. one class only (every label the same) read through a 4-way head: right (tuned-lens as in 2; head-probe: the
   exact optimum of tests/test_translator_lens.py at the C it chose, every anchor); the lenses learn the head's
   distribution, not the labels;
5. a head of one class: refused naming the head (was: head-probe a RuntimeError from an empty reduction; any
   readout through it is that class with probability 1);
6. one image in all: refused naming `--val-frac`."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest
import torch
from synthetic import class_clusters, write_feature_store
from test_translator_lens import exact_lens
from test_tuned_lens import linear_head, reference_lens

from featstore.store.reader import FeatureStore

from conftest import fails, run_cli

CLASSES, WIDTH = 4, 12


def tiny_store(path, n: int, label_classes: int, head_classes: int = CLASSES):
    """n images of `label_classes` classes at three 12-wide anchors; a seeded head of `head_classes` classes whose
    logits are its own on the last anchor."""
    feats, labels = class_clusters(max(n, label_classes), label_classes, [WIDTH] * 3, seed=3)
    rng = np.random.default_rng(5)
    head = (rng.normal(0, 0.4, (head_classes, WIDTH)).astype(np.float32),
            rng.normal(0, 0.5, head_classes).astype(np.float32))
    return write_feature_store(path, [f[:n] for f in feats], labels[:n], head_classes, head=head), head


def probe(store, db, variant: str, *extra) -> tuple[np.ndarray, dict, np.ndarray]:
    """(pred [images, anchors], probe_fits.info by anchor, split by image) of a run of `variant`."""
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", variant, "--no-progress",
            "--threads", "1", *extra)
    con = duckdb.connect(str(db), read_only=True)
    (run,) = con.execute("SELECT run_id FROM runs").fetchone()
    pred = con.execute("SELECT pred FROM predictions WHERE run_id = ? ORDER BY image_id, anchor", [run]).fetchnumpy()
    infos = {a: json.loads(i) for a, i in con.execute("SELECT anchor, info FROM probe_fits WHERE run_id = ?",
                                                       [run]).fetchall()}
    split = dict(con.execute("SELECT image_id, split FROM images").fetchall())
    con.close()
    ids = FeatureStore(store).image_table()["image_id"]
    return pred["pred"].reshape(len(ids), 3), infos, np.array([split[int(i)] for i in ids])


def features_and_targets(store) -> tuple[list[np.ndarray], np.ndarray]:
    fs = FeatureStore(store)
    xs = [fs.read("synthetic", "clean", a.name).astype(np.float64) for a in fs.anchors("synthetic")]
    logits = fs.read_logits("synthetic", "clean").astype(np.float32)
    return xs, torch.softmax(torch.from_numpy(logits), dim=-1).double().numpy()


@pytest.mark.parametrize("variant", ["tuned-lens", "head-probe"])
@pytest.mark.parametrize("n, extra, says", [
    (CLASSES, (), "--val-frac 0.1: the split holds no val rows (3 train rows of 4 usable images)"),
    (CLASSES, ("--val-frac", "0.9"), "--val-frac 0.9: the split holds no train rows (3 val rows of 4 usable images)"),
    (1, ("--val-frac", "0.5"), "--val-frac 0.5: the split holds no val rows (1 train rows of 1 usable images)"),
])
def test_a_split_without_train_or_val_rows_is_one_line(variant, n, extra, says, tmp_path):
    store, _ = tiny_store(tmp_path / "s.zarr", n, min(n, CLASSES))
    db = tmp_path / "f.duckdb"
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", variant, *extra)
    assert says in line and "pass a " in line and "--val-frac" in line.split(":", 2)[-1], line
    assert not db.exists() and "probes" not in FeatureStore(store).listed("synthetic")


@pytest.mark.parametrize("label_classes, n", [(CLASSES, CLASSES), (1, 12)], ids=["one per class", "one class"])
def test_the_tuned_lens_on_a_tiny_set_is_the_reference_loop(label_classes, n, tmp_path):
    store, head = tiny_store(tmp_path / "s.zarr", n, label_classes)
    steps = 12
    pred, infos, split = probe(store, tmp_path / "f.duckdb", f"tuned-lens:steps={steps}", "--val-frac", "0.5")
    xs, p = features_and_targets(store)
    train = split == "train"
    assert 0 < train.sum() < 128  # fewer rows than a batch: every step the full batch
    lens, history = reference_lens([x[train] for x in xs[:2]], p[train], linear_head(*head), steps, 128)
    weight, bias = (v.astype(np.float64) for v in head)
    for a in range(3):
        if a < 2:
            with torch.no_grad():
                h = torch.from_numpy(xs[a])
                theirs = (h + lens[a](h)).numpy() @ weight.T + bias
            assert np.allclose(infos[a]["train_kl_per_step"], history[a], rtol=1e-4, atol=1e-6), a
        else:  # the head's input: no translator, the head's own output
            theirs = xs[a] @ weight.T + bias
        top2 = np.sort(theirs, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 1e-4
        assert (pred[clear, a] == theirs[clear].argmax(axis=1)).all(), a


def test_the_head_probe_on_one_class_is_the_exact_optimum(tmp_path):
    store, head = tiny_store(tmp_path / "s.zarr", 12, 1)
    pred, infos, split = probe(store, tmp_path / "f.duckdb", "head-probe", "--val-frac", "0.5")
    xs, p = features_and_targets(store)
    weight, bias = (v.astype(np.float64) for v in head)
    fit, train = np.isin(split, ["train", "val"]), split == "train"
    for a in range(3):
        theirs = exact_lens(xs[a], p, weight, bias, fit, train, infos[a]["C"], infos[a]["init"] == "identity",
                            gtol=1e-7)
        top2 = np.sort(theirs, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 1e-3
        assert clear.any() and (pred[clear, a] == theirs[clear].argmax(axis=1)).all(), (a, infos[a]["C"])


def test_the_head_probe_on_one_image_per_class_reads_the_head_at_its_input(tmp_path):
    """Three fit rows (one train): at the head's input the identity start is the optimum (KL 0), so the lens gives
    the head's own class (numpy) on every image. At the other anchors the exact solver of
    tests/test_translator_lens.py does not reach a small gradient on features standardised over three rows, so they
    are not checked here."""
    store, head = tiny_store(tmp_path / "s.zarr", CLASSES, CLASSES)
    pred, infos, split = probe(store, tmp_path / "f.duckdb", "head-probe", "--val-frac", "0.5")
    xs, _ = features_and_targets(store)
    theirs = xs[2] @ head[0].T.astype(np.float64) + head[1]
    assert (split == "train").sum() == 1 and infos[2]["init"] == "identity"
    assert (pred[:, 2] == theirs.argmax(axis=1)).all()


@pytest.mark.parametrize("variant", ["tuned-lens", "head-probe"])
def test_a_head_of_one_class_is_one_line(variant, tmp_path):
    store, _ = tiny_store(tmp_path / "s.zarr", 12, 1, head_classes=1)
    db = tmp_path / "f.duckdb"
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", variant)
    assert f"--variant {variant}: the head of 'synthetic' has 1 class" in line and "2 classes or more" in line
    assert not db.exists()
