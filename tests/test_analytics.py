"""Every SQL macro equals a plain-Python computation of docs/design.md §7, image by image, on prediction tables with
known structure (ties, runs, never-stable images, several T and k); `featstore sql` cannot write."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from synthetic import run_rows

from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.records import DatasetInfo

from conftest import fails, run_cli

N = 300


def decision_layer(preds: list[int], k: int) -> tuple[int, int, bool]:
    """docs/design.md §7 literally: min l in 0..T-k with equal predictions at l..l+k, else T (never stable)."""
    t = len(preds) - 1
    for layer in range(0, t - k + 1):
        if len(set(preds[layer : layer + k + 1])) == 1:
            return layer, preds[layer], False
    return t, preds[t], True


def make_predictions(rng: np.random.Generator, n: int, t: int, classes: int = 5) -> np.ndarray:
    """Timelines that settle at a random anchor, with flicker before it, some never settling."""
    preds = rng.integers(0, classes, (n, t + 1))
    settle = rng.integers(0, t + 2, n)  # t + 1: never settles on purpose
    final = rng.integers(0, classes, n)
    for i in range(n):
        if settle[i] <= t:
            preds[i, settle[i]:] = final[i]
        if rng.random() < 0.2:  # ties: long runs of one early class that later changes
            preds[i, : rng.integers(1, t + 1)] = rng.integers(0, classes)
    return preds


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A database with runs of T = 11 (clean, a corrupted view, a cross-fit run), T = 3 and T = 10."""
    rng = np.random.default_rng(0)
    db = tmp_path_factory.mktemp("db") / "f.duckdb"
    con = fsdb.connect(db)
    image_id = np.arange(N) * 3 + 7  # ids need not be contiguous
    labels = rng.integers(0, 5, N)
    split = rng.choice(["train", "val", "test"], N, p=[0.6, 0.1, 0.3])
    split[:4] = "skipped"
    paths = np.array([f"{i}.png" for i in image_id])
    fsdb.register_images(con, DatasetInfo("fp", "test", "-", 0), image_id, paths, labels, split)
    runs = {}
    specs = [("m11/clean/linear", "m11", "clean", 11, 0), ("m11/noise-1/linear/train=clean", "m11", "noise-1", 11, 0),
             ("m11/clean/linear/cf3", "m11", "clean", 11, 3), ("m3/clean/linear", "m3", "clean", 3, 0),
             ("m10/clean/linear", "m10", "clean", 10, 0)]  # T = 10: 0.3T and 0.7T fall on anchors
    for run_id, model, view, t, cross_fit in specs:
        fsdb.register_anchors(con, model, [SimpleNamespace(index=a, name=f"a{a}", module=f"a{a}", dim=4,
                                                           depth_frac=a / t) for a in range(t + 1)])
        keep = split != "skipped"
        preds = make_predictions(rng, N, t)[keep]
        probe_name = "linear-cf3@clean" if cross_fit else "linear@clean"
        run = {"run_id": run_id, "model": model, "view": view, "train_view": "clean", "probe": "linear",
               "params": {"probe_name": probe_name}, "cross_fit": cross_fit, "seed": 0, "store": "-"}
        fsdb.write_runs(con, [run_rows(run, image_id[keep], preds, rng.random(preds.shape))])
        runs[run_id] = SimpleNamespace(t=t, cross_fit=cross_fit, model=model, view=view, ids=image_id[keep],
                                       preds=preds, labels=labels[keep], split=split[keep])
    con.close()
    return db, runs


def scoped(run, scope: str = "auto") -> np.ndarray:
    if scope == "auto":
        return np.ones(len(run.ids), bool) if run.cross_fit else run.split == "test"
    return np.ones(len(run.ids), bool) if scope == "all" else run.split == scope


def reference(run, k: int, scope: str = "auto") -> dict:
    mask = scoped(run, scope)
    rows = [decision_layer(list(p), k) for p in run.preds[mask]]
    layers = np.array([r[0] for r in rows])
    stable_pred = np.array([r[1] for r in rows])
    never = np.array([r[2] for r in rows])
    labels, t = run.labels[mask], run.t
    stable = layers < t
    return {"ids": run.ids[mask], "layers": layers, "stable_pred": stable_pred, "never": never,
            "correct": stable_pred == labels, "n": int(mask.sum()), "mean": layers.mean(),
            "median": float(np.median(layers)), "std": layers.std(), "f_early": np.mean(layers < 0.3 * t),
            "f_mid": np.mean((layers >= 0.3 * t) & (layers < 0.7 * t)), "f_late": np.mean(layers >= 0.7 * t),
            "never_stable": never.mean(),
            "stable_but_wrong": np.mean(stable_pred[stable] != labels[stable]) if stable.any() else None}


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_decision_layers_image_by_image(world, k):
    db, runs = world
    frame = q.decision_layers(db, k)
    for run_id, run in runs.items():
        if k > run.t:
            continue
        ref = reference(run, k)
        got = frame.filter(frame["run_id"] == run_id).sort("image_id")
        order = np.argsort(ref["ids"])
        assert got["image_id"].to_list() == ref["ids"][order].tolist()
        assert got["layer"].to_list() == ref["layers"][order].tolist()
        assert got["stable_pred"].to_list() == ref["stable_pred"][order].tolist()
        assert got["never_stable"].to_list() == ref["never"][order].tolist()
        assert got["correct"].to_list() == ref["correct"][order].tolist()
        assert set(got["t"].to_list()) == {run.t}


@pytest.mark.parametrize("scope", ["auto", "all", "train"])
def test_summary_and_sweep(world, scope):
    db, runs = world
    sweep = q.k_sweep(db, [1, 2, 3, 4], scope)
    for run_id, run in runs.items():
        for k in range(1, min(4, run.t) + 1):
            ref = reference(run, k, scope)
            row = sweep.filter((sweep["run_id"] == run_id) & (sweep["k"] == k)).to_dicts()
            assert len(row) == 1, (run_id, k)
            row = row[0]
            assert row["n"] == ref["n"]
            for key in ("mean", "median", "std", "f_early", "f_mid", "f_late", "never_stable"):
                assert row[key] == pytest.approx(ref[key], abs=1e-12), (run_id, k, key)
            if ref["stable_but_wrong"] is None:
                assert row["stable_but_wrong"] is None
            else:
                assert row["stable_but_wrong"] == pytest.approx(ref["stable_but_wrong"], abs=1e-12)
        summary = q.decision_summary(db, 2, scope).filter(lambda_run(run_id))
        assert summary["mean"][0] == pytest.approx(reference(run, 2, scope)["mean"])


def lambda_run(run_id):
    import polars as pl

    return pl.col("run_id") == run_id


@pytest.mark.parametrize("k", [1, 2, 4])
def test_mass_and_cumulative_curve(world, k):
    db, runs = world
    mass, curve = q.decision_mass(db, k), q.cumulative_curve(db, k)
    for run_id, run in runs.items():
        if k > run.t:
            continue
        ref = reference(run, k)
        m = mass.filter(lambda_run(run_id)).sort("layer")
        c = curve.filter(lambda_run(run_id)).sort("layer")
        assert m["layer"].to_list() == list(range(run.t + 1)) == c["layer"].to_list()
        for layer in range(run.t + 1):
            assert m["n"][layer] == int(np.sum(ref["layers"] == layer))
            assert m["share"][layer] == pytest.approx(np.mean(ref["layers"] == layer))
            assert m["never_stable"][layer] == int(np.sum(ref["never"] & (ref["layers"] == layer)))
            assert c["f"][layer] == pytest.approx(np.mean(ref["layers"] <= layer))


def test_probe_accuracy_per_anchor_and_split(world):
    db, runs = world
    acc = q.probe_accuracy(db)
    by_split = q.query(db, "SELECT * FROM probe_accuracy_by_split")
    for run_id, run in runs.items():
        mask = scoped(run)
        got = acc.filter(lambda_run(run_id)).sort("anchor")
        expected = (run.preds[mask] == run.labels[mask, None]).mean(axis=0)
        assert np.allclose(got["accuracy"].to_numpy(), expected)
        assert got["name"].to_list() == [f"a{a}" for a in range(run.t + 1)]
        train = run.split == "train"
        got_train = by_split.filter(lambda_run(run_id) & (by_split["split"] == "train")).sort("anchor")
        assert np.allclose(got_train["accuracy"].to_numpy(), (run.preds[train] == run.labels[train, None]).mean(0))


def test_corruption_shift_and_paper_table(world):
    db, runs = world
    clean, noisy = runs["m11/clean/linear"], runs["m11/noise-1/linear/train=clean"]
    for k in (1, 2, 3):
        shift = q.corruption_shift(db, k)
        assert shift["run_id"].to_list() == ["m11/noise-1/linear/train=clean"]
        assert shift["clean_run_id"].to_list() == ["m11/clean/linear"]
        expected = reference(noisy, k)["mean"] - reference(clean, k)["mean"]  # same images: same test split
        assert shift["delta"][0] == pytest.approx(expected)
    table = q.paper_table(db, 2)
    row = table.filter(lambda_run("m11/clean/linear")).to_dicts()[0]
    ref = reference(clean, 2)
    mask = scoped(clean)
    assert row["last_anchor_accuracy"] == pytest.approx(np.mean(clean.preds[mask, -1] == clean.labels[mask]))
    assert row["mean_layer"] == pytest.approx(ref["mean"]) and row["never_stable"] == pytest.approx(ref["never_stable"])
    assert row["corruption_delta"] == pytest.approx(reference(noisy, 2)["mean"] - ref["mean"])
    stable_wrong = (ref["layers"] < clean.t) & ~ref["correct"]
    assert row["stable_but_wrong_among_stable"] == pytest.approx(ref["stable_but_wrong"])
    assert row["stable_but_wrong_of_all"] == pytest.approx(stable_wrong.mean())
    assert row["stable_but_wrong_of_all"] < row["stable_but_wrong_among_stable"]
    assert table.filter(lambda_run("m3/clean/linear"))["corruption_delta"][0] is None


def test_timelines_view(world):
    db, runs = world
    run = runs["m3/clean/linear"]
    frame = q.timelines(db, "m3/clean/linear")
    order = np.argsort(run.ids)
    assert frame["preds"].to_list() == run.preds[order].tolist()


def test_sql_is_read_only_and_macros_live_in_the_file(world, tmp_path):
    db, _ = world
    for statement in ["DROP TABLE runs", "INSERT INTO runs (run_id) VALUES ('x')", "DELETE FROM predictions"]:
        line = fails("sql", "--db", db, statement)
        assert "read-only" in line
    out = run_cli("sql", "--db", db, "SELECT run_id, n FROM decision_summary(2) ORDER BY run_id", "--format", "csv")
    assert out.output.splitlines()[0] == "run_id,n" and len(out.output.splitlines()) == 6
    import duckdb

    con = duckdb.connect(str(db), read_only=True)  # a plain client, no featstore code: the macros are persisted
    assert con.execute("SELECT count(*) FROM decision_summary(2)").fetchone() == (5,)
    con.close()  # featstore's sealed read-only config differs: DuckDB refuses a second in-process connection
    assert "no database" in fails("sql", "--db", tmp_path / "missing.duckdb", "SELECT 1")
    assert "SQL error" in fails("sql", "--db", db, "SELECT * FROM no_such_table")


def test_timeline_and_report_commands(world, tmp_path):
    db, _ = world
    out = run_cli("timeline", "--db", db, "--k", "1,2", "--format", "csv").stdout.splitlines()  # notes: stderr
    assert out[0].startswith("run_id,k,n,mean,median,std,f_early")
    assert len(out) == 1 + 5 * 2
    run_cli("report", "--db", db, "--out", tmp_path / "rep", "--figures", "png")
    page = (tmp_path / "rep" / "report.html").read_text()
    pngs = sorted((tmp_path / "rep").glob("*.png"))
    assert len(pngs) >= 4 * 4 + 1 and all(p.stat().st_size > 5000 for p in pngs)
    assert page.count("<figure") == len(pngs)  # the same figures: plots drawn from their data, galleries in HTML
    assert "m11/clean/linear" in page and "Corruption shift" in page and "Cross-model" in page
