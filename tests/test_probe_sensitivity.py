"""The report's probe-sensitivity and definitions sections, checked against independent computations: a second
seed is found by the probe's identity (its recorded name and version left out), the differing parameters are named,
a second seed is advised only for probes whose results depend on it (measured by probing twice), run_agreement counts
the test split by default as the page does (recounted in numpy), and the definitions gallery shows the pairs with the
most early/late disagreements between two decisions (recounted by a plain loop), its images linked to their
timelines."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from synthetic import class_clusters, run_rows, settling_timelines, toy_database, write_feature_store
from test_window import Page

from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.analytics.report import probe_identity, seed_dependence, write_report
from featstore.version import __version__

from conftest import run_cli

N, T, K, THETA = 360, 7, 2, 0.5  # late starts at anchor 5 = T - k: stable l*(2) can be late
LINEAR, SEED1, PINNED, PAPER, KNN = ("m/clean/linear", "m/clean/linear/seed1", "m/clean/linear:C=1", "m/clean/paper",
                                     "m/clean/knn")
SHARED = {"split_seed": 0, "val_frac": 0.1, "streamed": False, "featstore": __version__, "weights_id": "file:w.pth"}


def params(probe_id: str, name: str, version: str, **values) -> dict:
    """What `featstore probe` records of a run: the variant's parameters, its identity, name and version."""
    return {**values, "probe_id": probe_id, "probe_name": name, "probe_version": version, **SHARED}


LINEAR_PARAMS = {"C": 0.0, "full_batch": 1, "max_iterations": 1000}
RUNS = {  # run id -> probe, seed, recorded params, share of predictions changed from the reference's
    LINEAR: ("linear", 0, params("linear", "linear@clean", "v1", **LINEAR_PARAMS), 0.0),
    SEED1: ("linear", 1, params("linear", "linear-seed1@clean", "v2", **LINEAR_PARAMS), 0.0),  # bit for bit
    PINNED: ("linear", 0, params("linear:C=1", "linear:C=1@clean", "v3", **{**LINEAR_PARAMS, "C": 1.0}), 0.1),
    PAPER: ("paper", 0, params("paper", "paper@clean", "v4", epochs=100, lr=0.1), 0.2),
    KNN: ("knn", 0, params("knn", "knn@clean", "v5", k=30, metric="cosine"), 0.15),
}


def make_world(path, runs: tuple[str, ...]):
    toy = toy_database(path, N, T + 1, seed=3)
    con, rng, ids = toy.con, toy.rng, np.arange(N)
    base = settling_timelines(rng, toy.head, T + 1, T + 2)
    preds, confs = {}, {}
    for run_id, (probe, seed, recorded, rate) in RUNS.items():
        flip = rng.random(base.shape) < rate
        pred = np.where(flip, (base + rng.integers(1, 3, base.shape)) % 3, base)
        conf = rng.uniform(0.2, 1.0, base.shape).astype(np.float32)
        if run_id in runs:
            fsdb.write_runs(con, [run_rows({"run_id": run_id, "model": "m", "view": "clean", "probe": probe,
                                            "seed": seed, "params": recorded}, ids, pred, conf)])
        preds[run_id], confs[run_id] = pred, conf
    fsdb.replace_model_outputs(con, "m", "clean", ids, toy.head, np.full(N, 0.9))
    con.close()
    return SimpleNamespace(db=path, split=toy.split, head=toy.head, preds=preds, confs=confs, runs=runs)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("sensitivity") / "f.duckdb", tuple(RUNS))


@pytest.fixture(scope="module")
def page(world, tmp_path_factory):
    return Page(write_report(world.db, tmp_path_factory.mktemp("report") / "r", ks=[1, 2]).read_text())


# -- independent computations: plain loops over the predictions ----------------------------------------------------


def stable_layer(timeline, k: int = K, confs=None, theta: float = 0.0) -> int | None:
    """l*(k) (with confs and theta: the joint criterion) of one timeline; None when there is none."""
    return next((j for j in range(T - k + 1) if len(set(timeline[j : j + k + 1])) == 1
                 and (confs is None or confs[j] >= np.float32(theta))), None)


def band(layer: int) -> str:
    return "early" if layer < 0.3 * T else "late" if layer >= 0.7 * T else "mid"


def agreement_on_test(world, run_a: str, run_b: str) -> dict:
    test = np.flatnonzero(world.split == "test")
    la = [stable_layer(world.preds[run_a][i].tolist()) for i in test]
    lb = [stable_layer(world.preds[run_b][i].tolist()) for i in test]
    la, lb = [T if x is None else x for x in la], [T if x is None else x for x in lb]
    return {"n": len(test), "same_layer": np.mean([a == b for a, b in zip(la, lb, strict=True)]),
            "same_band": np.mean([band(a) == band(b) for a, b in zip(la, lb, strict=True)]),
            "same_pred": [np.mean(world.preds[run_a][test, j] == world.preds[run_b][test, j]) for j in range(T + 1)]}


# -- run_agreement's population --------------------------------------------------------------------------------------


def test_run_agreement_counts_the_test_split_by_default_as_the_page_does(world, page):
    ref = agreement_on_test(world, LINEAR, PAPER)
    got = q.run_agreement(world.db, LINEAR, PAPER)
    overall = got.filter(pl.col("anchor").is_null()).row(0, named=True)
    assert overall["n"] == ref["n"] == int((world.split == "test").sum())
    assert overall["same_layer"] == pytest.approx(ref["same_layer"], abs=1e-12)
    assert overall["same_band"] == pytest.approx(ref["same_band"], abs=1e-12)
    assert got.filter(pl.col("anchor").is_not_null()).sort("anchor")["same_pred"].to_list() == pytest.approx(
        ref["same_pred"], abs=1e-12)
    sql = q.query(world.db, f"SELECT n, same_layer FROM run_agreement('{LINEAR}', '{PAPER}') WHERE anchor IS NULL")
    assert sql.row(0) == (ref["n"], pytest.approx(ref["same_layer"], abs=1e-12))  # a plain SQL client alike
    assert q.run_agreement(world.db, LINEAR, PAPER, scope="all")["n"][0] == N  # 'all' is still there, asked for
    row = next(r for r in page.table("How much does the timeline depend on the probe?") if r["run"] == PAPER)
    assert int(row["n"]) == ref["n"] and row[f"same l*({K})"] == f"{ref['same_layer']:.3f}"


# -- seeds, parameters and advice -------------------------------------------------------------------------------------


def test_the_report_finds_a_second_seed_by_identity_and_names_changed_parameters(world, page):
    rows = {r["run"]: r for r in page.table("How much does the timeline depend on the probe?")}
    assert set(rows) == {SEED1, PINNED, PAPER, KNN}  # the reference is the unpinned seed-0 linear run
    assert rows[SEED1]["differs in"] == "seed 1"
    assert rows[PINNED]["differs in"] == "C 1.0 (reference 0.0)"
    assert rows[PAPER]["differs in"] == "probe paper" and rows[KNN]["differs in"] == "probe knn"
    for run_id, row in rows.items():
        ref = agreement_on_test(world, LINEAR, run_id)
        assert row["same band"] == f"{ref['same_band']:.3f}", run_id
    advice = next(p for p in page.paragraphs if p.startswith("This database has"))
    assert f"no second seed of {PAPER}" in advice and "featstore probe --variant paper --seed 1" in advice
    assert f"no second seed of {KNN}" in advice and "only at ties" in advice  # knn: at equally distant neighbours
    assert "--variant linear" not in advice  # linear cannot differ by seed, and has a second one anyway
    assert not any("no seed spread" in p for p in page.paragraphs)


def test_without_a_second_seed_the_report_says_why_linear_needs_none(tmp_path):
    world = make_world(tmp_path / "f.duckdb", (LINEAR, PAPER))
    text = Page(write_report(world.db, tmp_path / "r", ks=[2]).read_text())
    advice = next(p for p in text.paragraphs if p.startswith("This database has"))
    assert "--variant paper --seed 1" in advice and "--seed 1" not in advice.replace("--variant paper --seed 1", "")
    assert "--variant linear" not in advice
    assert any(p.startswith("The reference has no seed spread to show: linear is solved full-batch by L-BFGS")
               for p in text.paragraphs)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    feats, labels = class_clusters(900, 5, [8, 16, 32], seed=4)
    path = tmp_path_factory.mktemp("seeded") / "s.zarr"
    write_feature_store(path, feats, labels, 5, chunk_rows=300)
    return path


@pytest.mark.parametrize("variant", ["linear", "knn", "paper:epochs=20", "projected:dim=8"])
def test_the_seed_rule_is_what_probing_twice_measures(store, tmp_path, variant):
    """Probe seeds 0 and 1 of each variant on one store: their predictions are identical exactly where
    `seed_dependence` (which decides the report's advice) says a seed cannot change them."""
    db = tmp_path / "f.duckdb"
    for seed in (0, 1):
        run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress", "--variant", variant,
                "--seed", seed, "--threads", "1")
    runs = q.runs(db).sort("seed")
    assert runs["seed"].to_list() == [0, 1]
    preds = [q.query(db, "SELECT pred FROM predictions WHERE run_id = ? ORDER BY image_id, anchor", [r])["pred"]
             for r in runs["run_id"]]
    differ = int((preds[0] != preds[1]).sum())
    depends, why = seed_dependence(runs["probe"][0], probe_identity(runs["params"][0]), runs["streamed"][0])
    if why.startswith("only at ties"):  # knn: the seed orders equally far neighbours, which this store may lack
        assert depends and variant == "knn", (variant, differ, why)
    else:
        assert depends == (differ > 0), (variant, differ, why)


# -- the definitions' disagreements ------------------------------------------------------------------------------------


def definitions(world) -> dict[str, tuple[list[int], list[bool]]]:
    """Every definition of the report's comparison (names without the runs' common 'm/clean/'), per test image:
    its layer and whether it is a decision (not a never-stable l* or joint layer at T, nor a depth of T + 1)."""
    test = np.flatnonzero(world.split == "test")
    out = {}
    for run_id in world.runs:
        short = run_id.removeprefix("m/clean/")
        timelines, confs = world.preds[run_id][test].tolist(), world.confs[run_id][test]
        for name, theta in ((f"l*({K}) {short}", None), (f"joint({K}, {THETA}) {short}", THETA)):
            layers = [stable_layer(t, K, c if theta else None, theta or 0.0) for t, c in zip(timelines, confs,
                                                                                              strict=True)]
            out[name] = ([T if la is None else la for la in layers], [la is not None for la in layers])
        depths = []
        for t, h in zip(timelines, world.head[test], strict=True):
            depths.append(T + 1 if t[T] != h else min(j for j in range(T + 1) if all(p == h for p in t[j:])))
        out[f"depth {short}"] = (depths, [d <= T for d in depths])
    return out


def test_the_gallery_shows_the_pairs_most_split_between_two_decisions_and_links_them(world, page):
    test = np.flatnonzero(world.split == "test")
    found = definitions(world)
    counts, images = {}, {}
    for a in found:
        for b in found:
            if a >= b:
                continue
            (la, da), (lb, db) = found[a], found[b]
            split = [int(test[i]) for i in range(len(test)) if da[i] and db[i]
                     and {band(la[i]), band(lb[i])} == {"early", "late"}]
            if split:
                counts[a, b], images[a, b] = len(split), set(split)
    top = sorted(counts, key=lambda pair: (-counts[pair], pair))[:3]
    shown = page.table("The pairs that disagree most")
    assert [(r["a"], r["b"], int(r["early_late_decided"])) for r in shown] == [(a, b, counts[a, b]) for a, b in top]
    picked = q.compare(world.db, list(world.runs), K, THETA, per_pair=2).shortened().decided
    linked = {int(h.removeprefix("#image-")) for h in page.links if h.startswith("#image-")}
    for a, b in top:
        ids = set(picked.filter((pl.col("a") == a) & (pl.col("b") == b))["image_id"].to_list())
        assert ids and ids <= images[a, b] and ids <= linked
    assert all(f"image-{i}" in page.ids for i in linked)  # every link has its timeline on the page
    caption = next(c for c in page.captions if c.startswith("Images of m early"))
    assert "image id" in caption
