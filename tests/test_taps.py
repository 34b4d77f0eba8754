"""Layer x module taps: every (block, tap) of a random-init timm ViT equals the block re-run by hand, for mean
and CLS pooling; the grid, best pairs, fixed taps and gain recovered equal a plain-Python computation."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import timm
import torch
from synthetic import read_probe, run_rows

from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.nets.anchors import TAPS
from featstore.records import DatasetInfo
from featstore.store.reader import FeatureStore

from conftest import assert_fp16_close, fails, reference_batch, run_cli

MODEL = "vit_tiny_patch16_224"


def tap_outputs_by_hand(model, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Re-run each block's submodules one by one, keeping every intermediate the seed's taps name."""
    out = {}
    t = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
    for i, blk in enumerate(model.blocks):
        ln1 = blk.norm1(t)
        attn = blk.ls1(blk.attn(ln1))
        mid = t + attn
        ln2 = blk.norm2(mid)
        fc1 = blk.mlp.fc1(ln2)
        act = blk.mlp.act(fc1)
        fc2 = blk.mlp.fc2(blk.mlp.norm(act))
        t = mid + blk.ls2(fc2)
        for name, value in zip(TAPS, (ln1, attn, mid, ln2, fc1, act, fc2, t), strict=True):
            out[f"blocks.{i}.{name}"] = value
    return out


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_every_tap_equals_the_block_rerun_by_hand(image_dir, tmp_path, pool):
    store = tmp_path / "s.zarr"
    run_cli("build", "--model", MODEL, "--weights", "none", "--image-size", "32", "--data", image_dir, "--store",
            store, "--taps", "all", "--pool", pool, "--batch-size", "3", "--chunk-rows", "6", "--workers", "0",
            "--no-progress")
    fs = FeatureStore(store)
    anchors = fs.anchors(MODEL)
    assert len(anchors) == 12 * 8 and anchors[10].name == "blocks.1.resid_mid"
    assert (anchors[10].block, anchors[10].tap, anchors[10].side, anchors[10].post) == (1, "resid_mid", "input", None)
    assert {a.dim for a in anchors if a.tap in ("fc1", "act")} == {768}
    torch.manual_seed(0)
    model = timm.create_model(MODEL, pretrained=False, img_size=32).eval()
    x = reference_batch([image_dir / p for p in fs.image_table()["path"]],
                        fs.model_attrs(MODEL)["config"]["preprocessing"])
    with torch.no_grad():
        parts = [tap_outputs_by_hand(model, b) for b in x.split(3)]
    for anchor in anchors:
        tokens = torch.cat([p[anchor.name] for p in parts])
        ref = tokens.mean(dim=1) if pool == "mean" else tokens[:, 0]
        assert_fp16_close(fs.read(MODEL, "clean", anchor.name), ref.numpy(), anchor.name)


def test_taps_refuse_models_without_vit_blocks(image_dir, tmp_path):
    line = fails("build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--data", image_dir,
                 "--store", tmp_path / "s.zarr", "--taps", "all")
    assert "--taps needs a timm VisionTransformer" in line
    line = fails("build", "--model", MODEL, "--weights", "none", "--image-size", "32", "--data", image_dir,
                 "--store", tmp_path / "s.zarr", "--taps", "ln1,mlp")
    assert "unknown tap(s) mlp" in line


L, N = 5, 200
GRID_TAPS = list(TAPS)


@pytest.fixture(scope="module")
def grid_db(tmp_path_factory):
    """Predictions built so that anchor (block, tap) is right on exactly counts[block, tap] of 200 images."""
    rng = np.random.default_rng(4)
    counts = rng.permutation(np.arange(40, 40 + 3 * L * len(GRID_TAPS), 3))[: L * len(GRID_TAPS)]
    counts = counts.reshape(L, len(GRID_TAPS))
    db = tmp_path_factory.mktemp("taps") / "f.duckdb"
    con = fsdb.connect(db)
    ids, labels = np.arange(N), np.zeros(N, dtype=int)
    fsdb.register_images(con, DatasetInfo("fp", "t", "-", 0), ids, np.array(["x"] * N), labels,
                         np.array(["test"] * N))
    anchors = [SimpleNamespace(index=b * len(GRID_TAPS) + j, name=f"blocks.{b}.{t}", module="m", dim=4,
                               depth_frac=b / (L - 1), block=b, tap=t)
               for b in range(L) for j, t in enumerate(GRID_TAPS)]
    fsdb.register_anchors(con, "vit", anchors)
    preds = np.ones((N, len(anchors)), dtype=int)  # wrong (label 0) ...
    for a in anchors:
        preds[: counts[a.block, GRID_TAPS.index(a.tap)], a.index] = 0  # ... except for the first counts images
    run = {"run_id": "vit/clean/linear", "model": "vit", "view": "clean", "train_view": "clean", "probe": "linear",
           "params": {}, "cross_fit": 0, "seed": 0, "store": "-"}
    fsdb.write_runs(con, [run_rows(run, ids, preds, np.full(preds.shape, 0.5))])
    con.close()
    return db, counts / N, preds


def test_grid_best_pairs_and_gain_recovered(grid_db):
    db, acc, _ = grid_db
    grid = q.tap_grid(db, "vit/clean/linear")
    for block, tap, value, depth in grid.select("block", "tap", "accuracy", "depth_pct").rows():
        assert value == pytest.approx(acc[block, GRID_TAPS.index(tap)])
        assert depth == pytest.approx(100 * block / (L - 1))
    base = acc[L - 1, GRID_TAPS.index("resid")]
    oracle = acc.max()
    gain = lambda a: (a - base) / (oracle - base)  # noqa: E731
    best_block, best_tap = np.unravel_index(acc.argmax(), acc.shape)
    expected = {"base resid@100": (L - 1, "resid", base), "oracle": (int(best_block), GRID_TAPS[best_tap], oracle),
                "act@100": (L - 1, "act", acc[L - 1, GRID_TAPS.index("act")]),
                "ln2@60": (round(0.6 * (L - 1)), "ln2", acc[round(0.6 * (L - 1)), GRID_TAPS.index("ln2")])}
    for b in range(L):
        expected[f"best@{b}"] = (b, GRID_TAPS[int(acc[b].argmax())], acc[b].max())
    gains = {row["strategy"]: row for row in q.tap_gains(db, "vit/clean/linear").to_dicts()}
    assert set(gains) == set(expected)
    for strategy, (block, tap, value) in expected.items():
        row = gains[strategy]
        assert (row["block"], row["tap"]) == (block, tap), strategy
        assert row["accuracy"] == pytest.approx(value)
        assert row["gain_recovered"] == pytest.approx(gain(value)), strategy


@pytest.mark.parametrize("tap", ["act", "resid"])
def test_decision_layers_over_one_taps_block_sequence(grid_db, tap):
    db, _, preds = grid_db
    got = q.tap_decision_layers(db, "vit/clean/linear", tap, 2)
    column = [b * len(GRID_TAPS) + GRID_TAPS.index(tap) for b in range(L)]
    for row in got.iter_rows(named=True):
        seq = preds[row["image_id"], column].tolist()
        layer = next((s for s in range(L - 2) if len(set(seq[s : s + 3])) == 1), L - 1)
        assert row["layer"] == layer and row["never_stable"] == (layer == L - 1)
        assert row["stable_pred"] == seq[layer]


def test_taps_command_and_projected_probes(image_dir, tmp_path):
    store, db = tmp_path / "s.zarr", tmp_path / "f.duckdb"
    run_cli("build", "--model", MODEL, "--weights", "none", "--image-size", "32", "--data", image_dir, "--store",
            store, "--taps", "ln2,act,resid", "--workers", "0", "--no-progress")
    run_cli("probe", "--store", store, "--model", MODEL, "--db", db, "--no-progress")
    run_cli("probe", "--store", store, "--model", MODEL, "--db", db, "--project-dim", "64", "--no-progress")
    out = run_cli("taps", "--db", db, "--run", f"{MODEL}/clean/linear").output
    assert "block x tap" in out and "act@100" in out and "ln2@60" in out
    assert "act@100" in run_cli("taps", "--db", db, "--run", f"{MODEL}/clean/projected64").output
    w, _, attrs = read_probe(store, MODEL, "projected64@clean", "blocks.3.act")
    assert w.shape[-1] == 768 and attrs["folds"][0]["projected_to"] == 64
    assert "no (block, tap) anchors" in fails("taps", "--db", db, "--run", "nope")


def test_gains_without_a_resid_tap_keep_their_rows(tmp_path):
    db = tmp_path / "f.duckdb"
    con = fsdb.connect(db)
    fsdb.register_images(con, DatasetInfo("fp", "t", "-", 0), np.arange(10), np.array(["x"] * 10),
                         np.zeros(10, int), np.array(["test"] * 10))
    anchors = [SimpleNamespace(index=2 * b + j, name=f"blocks.{b}.{t}", module="m", dim=4, depth_frac=b / 2,
                               block=b, tap=t) for b in range(3) for j, t in enumerate(["ln2", "act"])]
    fsdb.register_anchors(con, "vit", anchors)
    preds = np.ones((10, 6), dtype=int)
    for a in range(6):
        preds[: a + 1, a] = 0
    run = {"run_id": "vit/clean/linear", "model": "vit", "view": "clean", "train_view": "clean", "probe": "linear",
           "params": {}, "cross_fit": 0, "seed": 0, "store": "-"}
    fsdb.write_runs(con, [run_rows(run, np.arange(10), preds, np.full(preds.shape, 0.5))])
    con.close()
    gains = q.tap_gains(db, "vit/clean/linear")
    assert gains["strategy"].to_list() == ["oracle", "act@100", "ln2@60", "best@0", "best@1", "best@2"]
    assert gains["gain_recovered"].null_count() == len(gains)
    assert gains.filter(gains["strategy"] == "oracle")["accuracy"][0] == 0.6
