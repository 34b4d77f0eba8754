"""The demo's generated image set: deterministic and cued as designed; the demo end to end, with its decision
layers recomputed by a plain loop."""

from __future__ import annotations

import gc
import re
import shutil
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
from PIL import Image

from featstore.analytics import queries as q
from featstore.store.reader import FeatureStore
from featstore.workflows.layouts import CUE_COLOURS, LAYOUTS, LayoutConfig, layout_image_folder

from conftest import fails, run_cli


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.png"))}


def test_same_seed_writes_the_same_bytes(tmp_path):
    cfg = LayoutConfig(per_class=3)
    first = _files(layout_image_folder(tmp_path / "a", cfg))
    assert len(first) == 3 * len(LAYOUTS) and first == _files(layout_image_folder(tmp_path / "b", cfg))
    other = _files(layout_image_folder(tmp_path / "c", LayoutConfig(per_class=3, seed=1)))
    assert first.keys() != other.keys() or first != other


def test_the_colour_cue_is_the_class_colour_in_cued_images_only(tmp_path):
    root = layout_image_folder(tmp_path / "l", LayoutConfig(per_class=20, cue_share=0.5))
    cued = 0
    for label, name in enumerate(LAYOUTS):
        for path in sorted((root / name).glob("*.png")):
            rgb = np.asarray(Image.open(path), dtype=np.float32).reshape(-1, 1, 3) / 255
            exact = (np.abs(rgb - CUE_COLOURS[None]).max(-1) < 1.5 / 255).sum(0)  # dot centres: no noise there
            if exact.any():
                cued += 1
                assert exact.argmax() == label and exact.sum() >= 5, (path, exact)
    assert 0.35 < cued / (20 * len(LAYOUTS)) < 0.65


def _decision_layer(preds: list[int], k: int) -> int:
    """l*(k) by a plain loop: the first anchor whose prediction the next k anchors repeat, else T."""
    t = len(preds) - 1
    return next((a for a in range(t - k + 1) if len(set(preds[a : a + k + 1])) == 1), t)


def test_the_demos_decision_layers_equal_a_plain_loop(demo):
    """l*(2) of every clean test image, and the early/late fractions the demo prints, recomputed from the stored
    timelines by a plain loop. (How far the demo is from a late mode is a measured limit, not a test: docs/demo.md,
    docs/benchmarks.md and bench/demo_depth.py.)"""
    out, _ = demo
    db = out / "layouts" / "featstore.duckdb"
    runs = q.timelines(db, "resnet18/clean/linear").filter(pl.col("split") == "test")
    layers = np.array([_decision_layer(p, 2) for p in runs["preds"].to_list()])
    t = len(runs["preds"][0]) - 1
    early, late = layers < 0.3 * t, layers >= 0.7 * t
    stored = q.decision_layers(db, 2).filter(pl.col("run_id") == "resnet18/clean/linear").sort("image_id")
    assert stored["image_id"].to_list() == runs["image_id"].to_list()
    assert stored["layer"].to_list() == layers.tolist()
    summary = q.decision_summary(db, 2).filter(pl.col("run_id") == "resnet18/clean/linear").row(0, named=True)
    assert summary["f_early"] == pytest.approx(early.mean()) and summary["f_late"] == pytest.approx(late.mean())
    assert early.mean() > 0.5  # the colour-cued half settles at the stem (docs/demo.md)


def test_demo_runs_offline_end_to_end_and_caches_the_network(demo, tmp_path):
    shared, text = demo
    out = tmp_path / "demo"
    shutil.copytree(shared, out)  # the rerun writes: into a copy of the session's demo, which other tests read
    assert "Where the clean test images decide" in text and "report: " in text and "decision_layers(2)" in text
    assert len(text.splitlines()) <= 25  # fits on one screen
    report = out / "layouts" / "report"
    page = (report / "report.html").read_text()
    assert "Images of resnet18/clean/linear that decide early" in page and page.count("class='plot-spec'") >= 7
    fs = FeatureStore(out / "layouts" / "store.zarr")
    assert fs.model_attrs("resnet18")["config"]["weights_id"].startswith("file:resnet18-e5.pth")
    assert sorted(fs.views("resnet18")) == ["clean", "gaussian_blur-1", "gaussian_noise-2"]
    runs_before = q.runs(out / "layouts" / "featstore.duckdb").select("run_id", "probe_version", "created_at")
    again = run_cli("demo", "--out", out, "--no-progress").output
    assert "train" not in again.split("time:")[1].split("\n")[0]  # the network is cached
    # the probe runs already landed are kept as they were (same weights version, same time written), so the
    # printed sweep is the first run's
    runs_after = q.runs(out / "layouts" / "featstore.duckdb").select("run_id", "probe_version", "created_at")
    assert runs_after.equals(runs_before) and len(runs_after) == 8  # 3 views + knn, lens, paper, C ± 1
    assert again.split("Where the clean")[1].split("time:")[0] == text.split("Where the clean")[1].split("time:")[0]


def test_the_demos_lens_knn_gate_and_comparison(demo):
    """The demo lands every definition: `head-probe` on the last pre-logits anchor (avgpool, which the head reads
    linearly) agrees with the trained network's own head on >= 95% of the held-out images (computed here from the
    stored rows); the knn, head-probe and paper runs sit beside linear in `compare`, and exit-sim prices their
    learned gates."""
    out, _ = demo
    db = out / "layouts" / "featstore.duckdb"
    rows = q.query(db, "SELECT p.pred, mo.pred AS head FROM predictions p JOIN images i USING (image_id) JOIN "
                       "model_outputs mo ON mo.image_id = p.image_id AND mo.model = 'resnet18' AND mo.view = 'clean' "
                       "WHERE p.run_id = 'resnet18/clean/head-probe' AND p.anchor = 11 AND i.split = 'test'")
    agreement = float((rows["pred"] == rows["head"]).mean())
    assert len(rows) == 360 and agreement >= 0.95, agreement
    text = run_cli("compare", "--db", db).output
    for definition in ("l*(2) linear", "joint(2, 0.5) head-probe", "depth knn", "l*(2) paper"):
        assert definition in text
    sim = run_cli("exit-sim", "--db", db, "--run", "resnet18/clean/knn:metric=euclidean,ties=lowest", "--format",
                  "csv").output
    assert sim.count("\nlearned,") >= 10


BANDS = ["early", "mid", "late"]


def _definition_layers(db, k: int, theta: float) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """Every definition's layer per test image of the demo's clean runs, from the predictions and the head's
    outputs in numpy (first l with predictions l..l+k equal, and conf >= θ at l for the joint; else T; depth: first
    l from which every prediction is the head's, else T + 1), and whether it is a decision (not that fallback)."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    runs = [r for (r,) in con.execute("SELECT run_id FROM runs WHERE view = 'clean' ORDER BY run_id").fetchall()]
    rows = con.sql(
        "SELECT p.run_id, p.image_id, p.anchor, p.pred, p.conf, mo.pred AS head FROM predictions p JOIN images i "
        "USING (image_id) JOIN model_outputs mo ON mo.image_id = p.image_id AND mo.view = 'clean' "
        "WHERE i.split = 'test' ORDER BY p.run_id, p.image_id, p.anchor").pl()
    con.close()
    layers, decided = {}, {}
    for run in runs:
        part = rows.filter(pl.col("run_id") == run)
        t = int(part["anchor"].max())
        preds = part["pred"].to_numpy().reshape(-1, t + 1)
        confs = part["conf"].to_numpy().reshape(-1, t + 1)
        head = part["head"].to_numpy().reshape(-1, t + 1)[:, 0]
        stable = np.stack([(preds[:, l_ : l_ + k + 1] == preds[:, [l_]]).all(1) for l_ in range(t - k + 1)], 1)
        confident = stable & (confs[:, : t - k + 1] >= np.float32(theta))
        settled = np.flip(np.cumprod(np.flip(preds == head[:, None], 1), 1), 1).astype(bool)
        name = run.removeprefix("resnet18/clean/")
        for kind, hits, fallback in ((f"l*({k})", stable, t), (f"joint({k}, {theta:g})", confident, t),
                                     ("depth", settled, t + 1)):
            layer = np.where(hits.any(1), hits.argmax(1), fallback)
            layers[f"{kind} {name}"], decided[f"{kind} {name}"] = layer, hits.any(1)
    return layers, decided, t


def test_compare_fits_120_columns_and_prints_the_predictions_numbers(demo):
    """`featstore compare` on the demo (six clean runs: 18 definitions, long knn names) prints no line over 120
    characters, and its definitions, its 10 most disagreeing pairs (ranked by the images early by one and late by
    the other, both layers decisions) and its 3x3 cross-tables are those numpy counts from the predictions."""
    from scipy.stats import spearmanr

    out, _ = demo
    db = out / "layouts" / "featstore.duckdb"
    layers, decided, t = _definition_layers(db, 2, 0.5)
    # an unsettled depth (T + 1) is in no band of the three
    band = {d: np.where(v > t, "unsettled", np.where(v < 0.3 * t, "early", np.where(v >= 0.7 * t, "late", "mid")))
            for d, v in layers.items()}
    text = run_cli("compare", "--db", db).output
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120 and "#1" not in text
    for name, v in layers.items():  # the summary's rows start at column 0, the pairs' are indented
        row = next(line for line in lines if line[:1].isdigit() and line.endswith(f"  {name}")).split()
        shares = [np.mean(band[name] == b) for b in ("early", "mid", "late", "unsettled")]
        assert int(row[0]) == len(v) and float(row[1]) == pytest.approx(v.mean(), abs=0.005)
        assert float(row[2]) == pytest.approx(np.median(v), abs=0.05)
        assert [float(x) for x in row[3:6]] == pytest.approx(shares[:3], abs=0.0005), name
        if name.startswith("depth"):  # unsettled images: a share of their own, not in late
            assert float(row[6]) == pytest.approx(shares[3], abs=0.0005), name
        else:
            assert row[6] == "-", name
    pairs = []
    for a, b in ((a, b) for a in layers for b in layers if a < b):
        early_late = int(np.sum((band[a] == "early") & (band[b] == "late")))
        late_early = int(np.sum((band[a] == "late") & (band[b] == "early")))
        both = decided[a] & decided[b]
        count = int(np.sum(both & (band[a] != band[b]) & (band[a] != "mid") & (band[b] != "mid")))
        pairs.append((-count, np.mean(band[a] == band[b]), a, b, early_late, late_early,
                      spearmanr(layers[a], layers[b]).statistic))
    pairs.sort(key=lambda p: p[:4])
    start = lines.index("the 10 of 153 pairs of definitions that disagree most:") + 2
    printed: list[list[str]] = []
    for line in lines[start:]:
        if not line.strip() or not line.startswith((" ", *"0123456789")):
            break
        if line.lstrip()[:1].isdigit():
            printed.append(line.split(None, 6))
        else:  # a pair's name wrapped under itself
            printed[-1][6] += "  " + line.strip()
    assert len(printed) == 10 and "143 more pairs not shown" in text
    for row, (negative, same, a, b, early_late, late_early, rho) in zip(printed, pairs, strict=False):
        assert row[6] == f"{a}  vs  {b}"
        assert [int(x) for x in row[:3]] == [-negative, early_late, late_early]
        assert float(row[3]) == pytest.approx(same, abs=0.0005) and float(row[4]) == pytest.approx(rho, abs=0.0005)
        assert int(row[5]) == len(layers[a])
    crosstab = run_cli("compare", "--db", db, "--part", "crosstab").output
    assert max(len(line) for line in crosstab.splitlines()) <= 120
    blocks = crosstab.split("\n\n")[1:]
    assert len(blocks) == 153
    assert any((band[d] == "unsettled").any() for d in layers)  # the demo has unsettled images (knn's, linear's)
    for block in blocks:
        title, grid = re.split(r"\n +a \\ b", block)  # the header's indent: the widest band's name
        a, b = title.replace("\n", "  ").removeprefix("a = ").split("  (")[0].split("  vs  b = ")
        rows, columns = ([*BANDS, "unsettled"] if name.startswith("depth") else BANDS for name in (a, b))
        assert grid.splitlines()[0].split() == columns
        for line, x in zip(grid.splitlines()[1:], rows, strict=True):
            assert line.split() == [x, *(str(int(np.sum((band[a] == x) & (band[b] == y)))) for y in columns)], (a, b)


def test_demo_refuses_an_unknown_dataset_before_writing(tmp_path):
    assert "--dataset" in fails("demo", "--out", tmp_path / "d", "--dataset", "cifar")
    assert not (tmp_path / "d").exists()


def test_the_command_leaves_its_objects_frozen_to_the_exit_and_a_call_in_process_keeps_its_collector(tmp_path):
    """`featstore` as a process freezes what it made before Python's exit cleanup (the collector's passes over
    torch's objects there took seconds); the same command called in this process (a test, a notebook) leaves the
    collector as it found it."""
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, 'collecting', gc.isenabled()))\n"
            f"sys.argv = ['featstore', 'demo', '--out', {str(tmp_path / 'd')!r}, '--epochs', '0']\n"
            "from featstore.cli.main import main\nmain()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2 and "--epochs" in done.stderr, done.stderr
    assert done.stdout.strip() == "frozen True collecting True"
    frozen = gc.get_freeze_count()
    assert "--epochs" in fails("demo", "--out", tmp_path / "d", "--epochs", "0")
    assert gc.get_freeze_count() == frozen and gc.isenabled() and not (tmp_path / "d").exists()
