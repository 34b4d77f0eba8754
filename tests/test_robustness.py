"""Robustness as a readout (docs/design.md §5, "Robustness"): per image l*(k) and band under every probe of a set
and whether the band holds under all, per probe and k the fractions with a seeded bootstrap interval and their
range over the set. Checked against a plain loop over the probe set and a numpy bootstrap of the same seed and
rows; the neighbour-C runs against scikit-learn's optimum at the neighbouring C."""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl
import pytest
from synthetic import class_clusters, register_toy_images, run_rows, write_feature_store
from test_probe_optimum import _run, exact, standardised

from featstore.analytics import db as fsdb
from featstore.analytics import robustness as rb
from featstore.errors import FeatstoreError
from featstore.probing.split import make_split
from featstore.probing.strength import StrengthGrid

from conftest import copy_db, fails, run_cli

N, T = 300, 9
DEFAULT_SET = ("m/clean/knn", "m/clean/linear", "m/clean/linear:C_step=-1", "m/clean/linear:C_step=1")


def layer_loop(row: np.ndarray, k: int) -> tuple[int, bool]:
    """docs/design.md §7 by hand: the first l <= T-k with ŷ equal on l..l+k, else (T, never stable)."""
    t = len(row) - 1
    for a in range(t - k + 1):
        if all(row[j] == row[a] for j in range(a, a + k + 1)):
            return a, False
    return t, True


def band_of(layer: int, t: int) -> str:
    return "early" if layer < 0.3 * t else "late" if layer >= 0.7 * t else "mid"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One model (T = 9): four runs of seed 0 on clean (the default set; knn misses 20 images), a seed-1 and a
    cross-fit run (left out by default), and a noisy view's run (a set of its own)."""
    rng = np.random.default_rng(11)
    db = tmp_path_factory.mktemp("robust") / "f.duckdb"
    con = fsdb.connect(db)
    labels = rng.integers(0, 4, N)
    split = rng.choice(["train", "val", "test"], N, p=[0.55, 0.1, 0.35])
    register_toy_images(con, labels, split, ("m",), T + 1)
    base = rng.integers(0, 4, (N, T + 1))
    settle = rng.integers(0, T + 2, N)
    for i in range(N):
        base[i, min(settle[i], T + 1):] = labels[i]
    runs = {}
    specs = [("m/clean/linear", "linear", "clean", 0, 0), ("m/clean/linear:C_step=-1", "linear", "clean", 0, 0),
             ("m/clean/linear:C_step=1", "linear", "clean", 0, 0), ("m/clean/knn", "knn", "clean", 0, 0),
             ("m/clean/linear/seed1", "linear", "clean", 1, 0), ("m/clean/linear/cf3", "linear", "clean", 0, 3),
             ("m/gaussian_noise-1/linear", "linear", "gaussian_noise-1", 0, 0)]
    for run_id, probe, view, seed, cross_fit in specs:
        preds = base.copy()
        flip = rng.random(preds.shape) < 0.08  # each probe reads some anchors of some images otherwise
        preds[flip] = rng.integers(0, 4, int(flip.sum()))
        ids = np.arange(N) if probe != "knn" else np.arange(20, N)
        preds = preds[ids]
        probe_id = run_id.split("/")[2]
        run = {"run_id": run_id, "model": "m", "view": view, "probe": probe, "seed": seed, "cross_fit": cross_fit,
               "params": {"probe_id": probe_id, "probe_name": f"{probe_id}@clean"}}
        fold = (ids % 3).astype(np.int16) if cross_fit else None
        fsdb.write_runs(con, [run_rows(run, ids, preds, np.full(preds.shape, 0.5, np.float32), fold)])
        runs[run_id] = dict(zip(ids.tolist(), preds, strict=True))
    con.close()
    reader = fsdb.connect(db, read_only=True)
    yield reader, db, runs, split
    reader.close()


def loop_bands(runs: dict, split: np.ndarray, members: tuple[str, ...], k: int) -> dict[int, dict[str, tuple]]:
    """Per image of the set's population (predicted by every member; test split, as scope 'auto' counts a single
    split), per member: (l*(k), band, never stable)."""
    common = set.intersection(*(set(runs[r]) for r in members))
    out = {}
    for i in sorted(common):
        if split[i] != "test":
            continue
        out[i] = {}
        for r in members:
            layer, never = layer_loop(runs[r][i], k)
            out[i][r] = (layer, band_of(layer, T), never)
    return out


@pytest.mark.parametrize("k", [1, 2, 4])
def test_per_image_bands_equal_a_plain_loop_over_the_probe_set(world, k):
    con, _, runs, split = world
    got = rb.robust_bands(con, kmax=4).filter((pl.col("k") == k) & (pl.col("view") == "clean"))
    expected = loop_bands(runs, split, DEFAULT_SET, k)
    assert sorted(set(got["run_id"])) == sorted(DEFAULT_SET)  # seed 1 and cross-fit are no default members
    assert sorted(set(got["image_id"])) == sorted(expected) and got.height == len(expected) * len(DEFAULT_SET)
    holds_somewhere = moves_somewhere = False
    for row in got.iter_rows(named=True):
        layer, band, never = expected[row["image_id"]][row["run_id"]]
        assert (row["layer"], row["band"], row["never_stable"], row["t"]) == (layer, band, never, T), row
        bands = {b for _, b, _ in expected[row["image_id"]].values()}
        layers = {lay for lay, _, _ in expected[row["image_id"]].values()}
        assert row["band_holds"] == (len(bands) == 1) and row["layer_holds"] == (len(layers) == 1)
        assert row["probes"] == len(DEFAULT_SET)
        holds_somewhere |= row["band_holds"]
        moves_somewhere |= not row["band_holds"]
    assert holds_somewhere and moves_somewhere  # the data can fail either way
    noisy = rb.robust_bands(con, kmax=4).filter(pl.col("view") == "gaussian_noise-1")
    assert set(noisy["run_id"]) == {"m/gaussian_noise-1/linear"} and noisy["band_holds"].all()


def test_sweep_fractions_range_and_bootstrap_equal_numpy(world):
    """Each member's fractions and the set's range and holding share as a loop counts them; the intervals those
    of a numpy bootstrap with the same seed over the same rows (images by id, one integers(0, n, n) per replicate),
    each replicate's fractions counted image by image."""
    con, _, runs, split = world
    replicates, seed = 200, 7
    sweep = rb.robust_sweep(con, [1, 2, 3], replicates=replicates, seed=seed).filter(pl.col("view") == "clean")
    assert sorted(set(sweep["k"])) == [1, 2, 3]
    for k in (1, 2, 3):
        expected = loop_bands(runs, split, DEFAULT_SET, k)
        images = sorted(expected)
        n = len(images)
        rng = np.random.default_rng(seed)
        draws = {r: [] for r in DEFAULT_SET}
        holds_draws = []
        for _ in range(replicates):
            idx = rng.integers(0, n, n)
            for r in DEFAULT_SET:
                counts = {"early": 0, "mid": 0, "late": 0, "never": 0}
                for j in idx:
                    _, band, never = expected[images[j]][r]
                    counts[band] += 1
                    counts["never"] += never
                draws[r].append([counts["early"] / n, counts["mid"] / n, counts["late"] / n, counts["never"] / n])
            holds_draws.append(sum(len({b for _, b, _ in expected[images[j]].values()}) == 1 for j in idx) / n)
        holds = np.mean([len({b for _, b, _ in expected[i].values()}) == 1 for i in images])
        points = {r: np.mean([[b == "early", b == "mid", b == "late", nv] for i in images
                              for _, b, nv in [expected[i][r]]], axis=0) for r in DEFAULT_SET}
        rows = sweep.filter(pl.col("k") == k)
        assert sorted(rows["run_id"]) == sorted(DEFAULT_SET)
        for row in rows.iter_rows(named=True):
            r = row["run_id"]
            assert row["n"] == n and row["probes"] == len(DEFAULT_SET)
            assert [row[f] for f in ("f_early", "f_mid", "f_late", "never_stable")] == pytest.approx(points[r])
            assert row["band_holds"] == pytest.approx(holds)
            for j, name in enumerate(("f_early", "f_mid", "f_late", "never_stable")):
                column = np.array(draws[r])[:, j]
                assert row[f"{name}_lo"] == pytest.approx(np.percentile(column, 2.5)), (k, r, name)
                assert row[f"{name}_hi"] == pytest.approx(np.percentile(column, 97.5)), (k, r, name)
                assert row[f"{name}_min"] == pytest.approx(min(p[j] for p in points.values()))
                assert row[f"{name}_max"] == pytest.approx(max(p[j] for p in points.values()))
            assert row["band_holds_lo"] == pytest.approx(np.percentile(holds_draws, 2.5))
            assert row["band_holds_hi"] == pytest.approx(np.percentile(holds_draws, 97.5))
        assert rows["f_early_max"][0] > rows["f_early_min"][0]  # the probes do differ here
    again = rb.robust_sweep(con, [1, 2, 3], replicates=replicates, seed=seed).filter(pl.col("view") == "clean")
    assert again.equals(sweep)  # seeded
    other = rb.robust_sweep(con, [2], replicates=replicates, seed=seed + 1).filter(pl.col("view") == "clean")
    assert not np.allclose(other["f_early_lo"], sweep.filter(pl.col("k") == 2)["f_early_lo"])


def test_a_declared_set_and_the_sql_macro(world, tmp_path):
    """run_set declares the members (a seed-1 run among them, knn left out: all 300 images then count); the
    macro answers any DuckDB client the same; an unknown run is one line."""
    con, db, runs, split = world
    members = ("m/clean/linear", "m/clean/linear/seed1")
    got = rb.robust_bands(con, kmax=2, run_set=list(members)).filter(pl.col("k") == 2)
    expected = loop_bands(runs, split, members, 2)
    assert sorted(set(got["image_id"])) == sorted(expected) and len(expected) == (split == "test").sum()
    plain = duckdb.connect(str(copy_db(db, tmp_path / "c.duckdb")), read_only=True)  # the macros it persisted
    share = plain.execute("SELECT band_holds FROM robust_sweep(2, run_set := ['m/clean/linear', "
                          "'m/clean/linear/seed1']) WHERE k = 2 LIMIT 1").fetchone()[0]
    plain.close()
    assert share == pytest.approx(np.mean([len({b for _, b, _ in expected[i].values()}) == 1 for i in expected]))
    with pytest.raises(FeatstoreError, match="no run 'm/clean/nope'"):
        rb.robust_sweep(con, run_set=["m/clean/nope"])


def test_timeline_spread_prints_intervals_and_the_range(world):
    _, db, _, _ = world
    text = run_cli("timeline", "--db", db, "--spread", "--k", "2").output
    assert "range over 4 probes" in text and "m/clean/linear:C_step=-1" in text and "[" in text
    assert "range over 1 probe " in text  # the noisy view's set of one
    frame = run_cli("timeline", "--db", db, "--spread", "--format", "csv").output
    assert frame.splitlines()[0].startswith("model,view,k,run_id") and "f_early_lo" in frame
    assert "--spread and --image" in fails("timeline", "--db", db, "--spread", "--image", "3")


def test_neighbour_c_runs_are_scikit_learns_optimum_at_the_neighbouring_c(tmp_path):
    """linear:C_step=±1 solves each anchor at the grid value next to the one its val rows choose (the same choice
    as the default run's), to scikit-learn's optimum there; its own run id and probe identity, so seed_spread and
    clean_pairs never take it for the chosen run; a pinned C with a step is one line before anything is written."""
    feats, labels = class_clusters(1500, 6, [16, 48], seed=5)
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, 6, chunk_rows=512)
    db = tmp_path / "f.duckdb"
    for variant in ("linear", "linear:C_step=-1", "linear:C_step=1"):
        run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress", "--variant", variant)
    _, _, chosen, _ = _run(db, "synthetic/clean/linear")
    grid = list(StrengthGrid().values())
    split = make_split(np.arange(len(labels)))
    fit, test = np.isin(split, ["train", "val"]), split == "test"
    moved = 0
    for step in (-1, 1):
        ours, _, fits, val_accuracy = _run(db, f"synthetic/clean/linear:C_step={step}")
        for a, x in enumerate(feats):
            c = grid[min(max(grid.index(chosen[a]["C"]) + step, 0), len(grid) - 1)]
            assert fits[a]["C_chosen"] == chosen[a]["C"] and fits[a]["C"] == c, (step, a, fits[a])
            z = standardised(x, fit)
            assert (ours[test, a] == exact(z, labels, fit, c).predict(z[test])).mean() >= 0.995, (step, a)
            assert np.isnan(val_accuracy[a])
            moved += c != chosen[a]["C"]
    assert moved >= 2  # a step clamped at an end of the grid stays at the chosen C
    con = duckdb.connect(str(db), read_only=True)
    ids = dict(con.execute("SELECT run_id, probe_id FROM runs").fetchall())
    seeds = con.execute("SELECT max(seeds) FROM seed_spread()").fetchone()[0]
    con.close()
    assert ids == {"synthetic/clean/linear": "linear", "synthetic/clean/linear:C_step=-1": "linear:C_step=-1",
                   "synthetic/clean/linear:C_step=1": "linear:C_step=1"} and seeds == 1
    bad = tmp_path / "bad.duckdb"
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", bad, "--variant", "linear:C=1,C_step=1")
    assert "C_step=1" in line and "search" in line and len(line.strip().splitlines()) == 1 and not bad.exists()
