"""Robustness as a readout (docs/design.md §5, "Robustness"): per image l*(k) and band under every probe of a set,
the probes grouped in families that vote once (a probe's neighbour-C runs and seeds are one family), whether the
band holds under every family's vote, Fleiss' kappa of those votes, per probe and k the fractions with a seeded
bootstrap interval (over images, or images and probe seeds) and their range over the set; the late share flagged
where it can only count never-stable images. Checked against a plain loop over the probe set, Fleiss' kappa from
the textbook formula and a numpy bootstrap of the same seed and rows; the neighbour-C runs against scikit-learn's
optimum at the neighbouring C."""

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
DEFAULT_SET = ("m/clean/knn", "m/clean/linear", "m/clean/linear:C_step=-1", "m/clean/linear:C_step=1", "m/clean/paper")
VOTERS = ("m/clean/knn", "m/clean/linear", "m/clean/paper")  # one run per family: linear at its chosen C
FAMILY = {r: "linear" if "linear" in r else r.split("/")[2] for r in DEFAULT_SET}
BANDS = ("early", "mid", "late")


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
    """One model (T = 9): five runs of seed 0 on clean in three families (the default set: linear and its two
    neighbour-C runs, knn, which misses 20 images, and paper), a seed-1 and a cross-fit run (left out by default),
    and a noisy view's run (a set of its own)."""
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
             ("m/clean/paper", "paper", "clean", 0, 0),
             ("m/clean/linear/seed1", "linear", "clean", 1, 0), ("m/clean/linear/cf3", "linear", "clean", 0, 3),
             ("m/gaussian_noise-1/linear", "linear", "gaussian_noise-1", 0, 0)]
    for run_id, probe, view, seed, cross_fit in specs:
        preds = base.copy()
        flip = rng.random(preds.shape) < (0.04 if "C_step" in run_id else 0.08)  # each probe reads some otherwise
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
    """Each run's band as a loop reads it; band_holds over the families' votes only (the neighbour-C runs do not
    vote), family_holds over every run of the family."""
    con, _, runs, split = world
    got = rb.robust_bands(con, kmax=4).filter((pl.col("k") == k) & (pl.col("view") == "clean"))
    expected = loop_bands(runs, split, DEFAULT_SET, k)
    assert sorted(set(got["run_id"])) == sorted(DEFAULT_SET)  # seed 1 and cross-fit are no default members
    assert sorted(set(got["image_id"])) == sorted(expected) and got.height == len(expected) * len(DEFAULT_SET)
    holds_somewhere = moves_somewhere = differs_from_all = False
    for row in got.iter_rows(named=True):
        layer, band, never = expected[row["image_id"]][row["run_id"]]
        assert (row["layer"], row["band"], row["never_stable"], row["t"]) == (layer, band, never, T), row
        votes = {r: expected[row["image_id"]][r] for r in VOTERS}
        family = [expected[row["image_id"]][r] for r in DEFAULT_SET if FAMILY[r] == FAMILY[row["run_id"]]]
        assert row["votes"] == (row["run_id"] in VOTERS) and row["family"] == f"m/clean/{FAMILY[row['run_id']]}"
        assert row["band_holds"] == (len({b for _, b, _ in votes.values()}) == 1)
        assert row["layer_holds"] == (len({lay for lay, _, _ in votes.values()}) == 1)
        assert row["family_holds"] == ((len({b for _, b, _ in family}) == 1) if len(family) > 1 else None)
        assert (row["probes"], row["families"]) == (len(DEFAULT_SET), len(VOTERS))
        holds_somewhere |= row["band_holds"]
        moves_somewhere |= not row["band_holds"]
        differs_from_all |= row["band_holds"] != (len({b for _, b, _ in expected[row["image_id"]].values()}) == 1)
    assert holds_somewhere and moves_somewhere and differs_from_all  # the data can fail either way
    noisy = rb.robust_bands(con, kmax=4).filter(pl.col("view") == "gaussian_noise-1")
    assert set(noisy["run_id"]) == {"m/gaussian_noise-1/linear"} and noisy["band_holds"].is_null().all()


def fleiss_by_hand(table: np.ndarray) -> float:
    """Fleiss (1971) as the textbook writes it: n_ij raters put subject i in category j, n raters per subject, N
    subjects; P_i = (sum_j n_ij^2 - n) / (n (n - 1)), p_j = sum_i n_ij / (N n), kappa = (P - P_e) / (1 - P_e)."""
    big_n, n = table.shape[0], table[0].sum()
    p_i = [(sum(x * x for x in row) - n) / (n * (n - 1)) for row in table]
    p_j = [sum(table[i][j] for i in range(big_n)) / (big_n * n) for j in range(table.shape[1])]
    p_bar, p_e = sum(p_i) / big_n, sum(p * p for p in p_j)
    return (p_bar - p_e) / (1 - p_e)


def test_fleiss_kappa_is_the_textbook_figure():
    """Fleiss' own worked table (10 subjects, 14 raters, 5 categories; kappa 0.210 in the literature)."""
    table = np.array([[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
                      [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]])
    assert rb.fleiss_kappa(table) == pytest.approx(fleiss_by_hand(table)) == pytest.approx(0.2099, abs=1e-4)
    weights = np.array([2, 0, 1, 1, 1, 3, 0, 1, 1, 0])  # a bootstrap draw: each subject as often as drawn
    assert rb.fleiss_kappa(table, weights.astype(float)) == pytest.approx(fleiss_by_hand(np.repeat(table, weights, 0)))


def vote_table(expected: dict, images: list[int], voters: tuple[str, ...] = VOTERS) -> np.ndarray:
    """images x bands: how many of the voters put each image in each band."""
    return np.array([[sum(expected[i][r][1] == band for r in voters) for band in BANDS] for i in images])


def test_sweep_fractions_range_kappa_and_bootstrap_equal_numpy(world):
    """Each member's fractions and the set's range as a loop counts them; band_holds over the families' votes,
    kappa = Fleiss' kappa of those votes by hand, the chance share from each voter's own band shares; the intervals
    those of a numpy bootstrap with the same seed over the same rows (images by id, one integers(0, n, n) per
    replicate), each replicate's figures counted image by image."""
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
        holds_draws, kappa_draws = [], []
        for _ in range(replicates):
            idx = rng.integers(0, n, n)
            for r in DEFAULT_SET:
                counts = {"early": 0, "mid": 0, "late": 0, "never": 0}
                for j in idx:
                    _, band, never = expected[images[j]][r]
                    counts[band] += 1
                    counts["never"] += never
                draws[r].append([counts["early"] / n, counts["mid"] / n, counts["late"] / n, counts["never"] / n])
            drawn = [images[j] for j in idx]
            holds_draws.append(sum(len({expected[i][r][1] for r in VOTERS}) == 1 for i in drawn) / n)
            kappa_draws.append(fleiss_by_hand(vote_table(expected, drawn)))
        holds = np.mean([len({expected[i][r][1] for r in VOTERS}) == 1 for i in images])
        points = {r: np.mean([[b == "early", b == "mid", b == "late", nv] for i in images
                              for _, b, nv in [expected[i][r]]], axis=0) for r in DEFAULT_SET}
        chance = sum(np.prod([points[r][j] for r in VOTERS]) for j in range(3))
        kappa = fleiss_by_hand(vote_table(expected, images))
        rows = sweep.filter(pl.col("k") == k)
        assert sorted(rows["run_id"]) == sorted(DEFAULT_SET)
        for row in rows.iter_rows(named=True):
            r = row["run_id"]
            assert row["n"] == n and (row["probes"], row["families"]) == (len(DEFAULT_SET), len(VOTERS))
            assert list(row["probe_set"]) == list(VOTERS) and row["interval_over"] == "images (probes fixed)"
            assert [row[f] for f in ("f_early", "f_mid", "f_late", "never_stable")] == pytest.approx(points[r])
            assert row["band_holds"] == pytest.approx(holds)
            assert row["kappa"] == pytest.approx(kappa) and row["band_holds_chance"] == pytest.approx(chance)
            for j, name in enumerate(("f_early", "f_mid", "f_late", "never_stable")):
                column = np.array(draws[r])[:, j]
                assert row[f"{name}_lo"] == pytest.approx(np.percentile(column, 2.5)), (k, r, name)
                assert row[f"{name}_hi"] == pytest.approx(np.percentile(column, 97.5)), (k, r, name)
                assert row[f"{name}_min"] == pytest.approx(min(p[j] for p in points.values()))
                assert row[f"{name}_max"] == pytest.approx(max(p[j] for p in points.values()))
            assert row["band_holds_lo"] == pytest.approx(np.percentile(holds_draws, 2.5))
            assert row["band_holds_hi"] == pytest.approx(np.percentile(holds_draws, 97.5))
            assert row["kappa_lo"] == pytest.approx(np.percentile(kappa_draws, 2.5))
            assert row["kappa_hi"] == pytest.approx(np.percentile(kappa_draws, 97.5))
        assert rows["f_early_max"][0] > rows["f_early_min"][0]  # the probes do differ here
        assert 0 < kappa < 1 and holds > chance  # agreement beyond chance, short of complete
    again = rb.robust_sweep(con, [1, 2, 3], replicates=replicates, seed=seed).filter(pl.col("view") == "clean")
    assert again.equals(sweep)  # seeded
    other = rb.robust_sweep(con, [2], replicates=replicates, seed=seed + 1).filter(pl.col("view") == "clean")
    assert not np.allclose(other["f_early_lo"], sweep.filter(pl.col("k") == 2)["f_early_lo"])


def test_near_duplicate_probes_do_not_decide_the_agreement(world):
    """The family rule: a probe's neighbour-C runs share its family (robust_family drops C and C_step from the probe
    id), so the set with them and without them gives the same agreement, kappa and interval; the same three runs
    without their family (a set of one family) give no agreement figure at all, only family_holds."""
    con, _, runs, split = world
    family = ["m/clean/linear", "m/clean/linear:C_step=-1", "m/clean/linear:C_step=1"]
    with_neighbours = rb.robust_sweep(con, [2], replicates=50).filter(pl.col("view") == "clean")
    voters_only = rb.robust_sweep(con, [2], run_set=list(VOTERS), replicates=50)
    columns = ["band_holds", "layer_holds", "kappa", "band_holds_chance", "band_holds_lo", "kappa_hi"]
    assert with_neighbours.filter(pl.col("run_id") == "m/clean/linear").select(columns).equals(
        voters_only.filter(pl.col("run_id") == "m/clean/linear").select(columns))
    alone = rb.robust_sweep(con, [2], run_set=family, replicates=50)
    expected = loop_bands(runs, split, tuple(family), 2)
    assert alone["families"].to_list() == [1] * 3 and alone["probe_set"][0].to_list() == ["m/clean/linear"]
    blank = alone.select("band_holds", "kappa", "band_holds_lo", "band_holds_hi", "kappa_lo").null_count().row(0)
    assert blank == (3,) * 5
    assert alone["family_holds"][0] == pytest.approx(
        np.mean([len({b for _, b, _ in expected[i].values()}) == 1 for i in expected]))
    assert not alone["f_early_lo"].is_null().any()  # a run's own fractions keep their interval
    ids = {"linear": "linear", "linear:C_step=-1": "linear", "linear:C=0.25,max_epochs=7": "linear:max_epochs=7",
           "knn:metric=euclidean,ties=lowest": "knn:metric=euclidean,ties=lowest", "head-probe:C=0.1": "head-probe",
           "x:Cx=1": "x:Cx=1"}
    got = con.execute("SELECT p, robust_family(p) FROM unnest(?) t(p)", [list(ids)]).fetchall()
    assert dict(got) == ids


def test_refits_put_the_probe_seeds_in_the_interval(world):
    """refits=True: every seed of each run joins the set (m/clean/linear/seed1 here, a member of the linear family
    with no vote of its own), and each replicate draws, after the images, one seed per refit group with one
    integers(0, sizes) call; the point figures stay those of the seed-0 votes."""
    con, _, runs, split = world
    replicates, seed, k = 120, 3, 2
    got = rb.robust_sweep(con, [k], replicates=replicates, seed=seed, refits=True).filter(pl.col("view") == "clean")
    members = tuple(sorted((*DEFAULT_SET, "m/clean/linear/seed1")))
    assert sorted(got["run_id"]) == list(members) and set(got["interval_over"]) == {"images and probe seeds"}
    expected = loop_bands(runs, split, members, k)
    images = sorted(expected)
    n = len(images)
    groups = [[r] for r in members if r != "m/clean/linear/seed1"]  # each run its own group but linear's
    groups[[g[0] for g in groups].index("m/clean/linear")] = ["m/clean/linear", "m/clean/linear/seed1"]
    group_of = {r: g for g in groups for r in g}
    rng = np.random.default_rng(seed)
    early, kappas = {r: [] for r in members}, []
    for _ in range(replicates):
        drawn = [images[j] for j in rng.integers(0, n, n)]
        pick = rng.integers(0, [len(g) for g in groups])
        stands = {r: group_of[r][pick[groups.index(group_of[r])]] for r in members}
        for r in members:
            early[r].append(np.mean([expected[i][stands[r]][1] == "early" for i in drawn]))
        kappas.append(fleiss_by_hand(vote_table(expected, drawn, tuple(stands[v] for v in VOTERS))))
    for row in got.iter_rows(named=True):
        assert row["f_early_lo"] == pytest.approx(np.percentile(early[row["run_id"]], 2.5)), row["run_id"]
        assert row["f_early_hi"] == pytest.approx(np.percentile(early[row["run_id"]], 97.5)), row["run_id"]
        assert row["kappa_lo"] == pytest.approx(np.percentile(kappas, 2.5))
        assert row["kappa_hi"] == pytest.approx(np.percentile(kappas, 97.5))
        assert row["kappa"] == pytest.approx(fleiss_by_hand(vote_table(expected, images)))
    fixed = rb.robust_sweep(con, [k], replicates=replicates, seed=seed).filter(pl.col("view") == "clean")
    assert got.filter(pl.col("run_id") == "m/clean/linear")["kappa_lo"][0] != fixed["kappa_lo"][0]
    with pytest.raises(FeatstoreError, match="refits='yes'"):
        rb.robust_sweep(con, [k], refits="yes")


def test_a_declared_set_and_the_sql_macro(world, tmp_path):
    """run_set declares the members (a seed-1 run among them, knn left out: all 300 images then count); the two are
    one family, so no agreement between families, and family_holds the share the seeds agree on; the macro answers
    any DuckDB client the same; an unknown run is one line."""
    con, db, runs, split = world
    members = ("m/clean/linear", "m/clean/linear/seed1")
    got = rb.robust_bands(con, kmax=2, run_set=list(members)).filter(pl.col("k") == 2)
    expected = loop_bands(runs, split, members, 2)
    assert sorted(set(got["image_id"])) == sorted(expected) and len(expected) == (split == "test").sum()
    plain = duckdb.connect(str(copy_db(db, tmp_path / "c.duckdb")), read_only=True)  # the macros it persisted
    holds, kappa, share = plain.execute("SELECT band_holds, kappa, family_holds FROM robust_sweep(2, run_set := "
                                        "['m/clean/linear', 'm/clean/linear/seed1']) WHERE k = 2 LIMIT 1").fetchone()
    plain.close()
    assert holds is None and kappa is None
    assert share == pytest.approx(np.mean([len({b for _, b, _ in expected[i].values()}) == 1 for i in expected]))
    with pytest.raises(FeatstoreError, match="no run 'm/clean/nope'"):
        rb.robust_sweep(con, run_set=["m/clean/nope"])


def test_timeline_spread_prints_intervals_and_the_range(world):
    _, db, _, _ = world
    text = run_cli("timeline", "--db", db, "--spread", "--k", "2").output
    assert "set: 3 families (votes: knn; linear; paper) of 5 runs" in text and "m/clean/linear:C_step=-1" in text
    assert "set: 1 family (votes: linear) of 1 run" in text and "1.0 [1.0, 1.0]" not in text  # the noisy view
    assert "Fleiss' kappa" in text and "interval over images (probes fixed)" in text
    frame = run_cli("timeline", "--db", db, "--spread", "--format", "csv").output
    assert frame.splitlines()[0].startswith("model,view,k,run_id") and "f_early_lo" in frame
    assert "--spread and --image" in fails("timeline", "--db", db, "--spread", "--image", "3")
    refit = run_cli("timeline", "--db", db, "--spread", "--refits", "--k", "2", "--format", "csv").output
    assert "m/clean/linear/seed1" in refit and "images and probe seeds" in refit  # the seed joins the set
    line = fails("timeline", "--db", db, "--refits")
    assert "--refits needs --spread" in line and len(line.strip().splitlines()) == 1


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


def late_only_never_stable(t: int, k: int) -> bool:
    """Independently of the SQL: no anchor a stable l*(k) can take (0..T-k) is in the paper's late band (>= 0.7T)."""
    return not any(layer >= 0.7 * t for layer in range(t - k + 1))


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_a_late_share_that_can_only_be_never_stable_is_flagged_everywhere_it_prints(world, k):
    """robust_sweep, paper_table, run_agreement and compare's summary say where late = never stable (T = 9: from
    k = 3 on), and where they say it the late share is the never-stable share; compare's text marks the share."""
    from featstore.analytics import queries as q

    con, db, _, _ = world
    flagged = late_only_never_stable(T, k)
    sweep = rb.robust_sweep(con, [k], replicates=10)
    assert set(sweep["late_is_never_stable"]) == {flagged}
    if flagged:
        assert sweep["f_late"].to_list() == pytest.approx(sweep["never_stable"].to_list())
    table = q.paper_table(con, k)
    assert table.height >= 5 and set(table["late_is_never_stable"]) == {flagged}
    overall = q.run_agreement(con, "m/clean/linear", "m/clean/knn", k).filter(pl.col("anchor").is_null())
    assert overall["late_is_never_stable"].to_list() == [flagged]
    summary = q.compare(con, ["m/clean/linear", "m/clean/knn"], k, 0.5).summary
    assert summary.height >= 4 and {"l*", "joint"} <= set(summary["kind"])  # (no depth: no model outputs here)
    for row in summary.iter_rows(named=True):  # prediction depth is no windowed layer: never flagged
        assert row["late_is_never_stable"] == (flagged and row["kind"] != "depth"), row
    text = run_cli("compare", "--db", db, "--run", "m/clean/linear,m/clean/knn", "--k", str(k)).output
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["n", "mean"])
    rows = [line.split() for line in lines[header + 1: lines.index("", header)] if line.split()[0].isdigit()]
    assert len(rows) == summary.height and all(row[7].startswith(("l*", "joint")) for row in rows), text
    assert all(row[5].endswith("*") == flagged for row in rows), text
    assert ("late = never stable" in text) == flagged


@pytest.mark.parametrize(("n", "replicates"), [(301, 130), (7, 3)])
def test_bootstrap_counts_are_a_plain_loop_of_draws(n, replicates):
    """The image counts every bootstrap shares (the robustness intervals', calibration's) are those of one
    generator's `integers(0, n, n)` calls in order, block boundaries and a second (remembered) call alike."""
    rng = np.random.default_rng(11)
    expected = np.zeros((replicates, n), dtype=int)
    for b in range(replicates):
        for i in rng.integers(0, n, n):
            expected[b, i] += 1
    for _ in range(2):
        assert np.array_equal(np.vstack(rb.bootstrap_counts(11, n, replicates)), expected)
