"""Every definition of "when the network decides" beside l*(k), each against a plain loop image by image: prediction
depth (Baldock et al.), the joint stable-and-confident criterion (and min_conf := 0 is today's l*(k) exactly), and
their comparison (Spearman against scipy, the early/late cross-table against numpy)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from scipy.stats import spearmanr
from synthetic import run_rows

from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.records import DatasetInfo

from conftest import fails, run_cli

N, T = 240, 7
RUNS = ("m/clean/linear", "m/clean/knn", "m/clean/lens")


def timelines(rng: np.random.Generator, head: np.ndarray) -> np.ndarray:
    """Predictions that settle on the head's class (or another one) at a random anchor, with flicker before."""
    preds = rng.integers(0, 4, (len(head), T + 1))
    settle = rng.integers(0, T + 2, len(head))
    final = np.where(rng.random(len(head)) < 0.8, head, rng.integers(0, 4, len(head)))
    for i in range(len(head)):
        preds[i, min(settle[i], T + 1):] = final[i]
        if rng.random() < 0.2:  # an early stretch of one class that later changes
            preds[i, : rng.integers(1, T)] = rng.integers(0, 4)
    return preds


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Three runs of one model (T = 7) with confidences on a 1/8 grid (ties at every threshold) and the head."""
    rng = np.random.default_rng(5)
    db = tmp_path_factory.mktemp("defs") / "f.duckdb"
    con = fsdb.connect(db)
    ids = np.arange(N) * 2 + 1
    labels = rng.integers(0, 4, N)
    split = rng.choice(["train", "val", "test"], N, p=[0.6, 0.1, 0.3])
    fsdb.register_images(con, DatasetInfo("fp", "t", "-", 0), ids, np.array([f"{i}.png" for i in ids]),
                         labels, split)
    fsdb.register_anchors(con, "m", [SimpleNamespace(index=a, name=f"a{a}", module=f"a{a}", dim=2, depth_frac=a / T)
                                     for a in range(T + 1)])
    head = np.where(rng.random(N) < 0.7, labels, rng.integers(0, 4, N))
    fsdb.replace_model_outputs(con, "m", "clean", ids, head, np.full(N, 0.9))
    runs = {}
    for run_id in RUNS:
        preds = timelines(rng, head)
        confs = (rng.integers(1, 9, preds.shape) / 8).astype(np.float32)
        run = {"run_id": run_id, "model": "m", "view": "clean", "probe": run_id.split("/")[-1]}
        fsdb.write_runs(con, [run_rows(run, ids, preds, confs)])
        runs[run_id] = SimpleNamespace(preds=preds, confs=confs)
    con.close()
    reader = fsdb.connect(db, read_only=True)  # one connection for the module's queries (macros installed once)
    yield SimpleNamespace(db=reader, path=db, ids=ids, labels=labels, split=split, head=head, runs=runs)
    reader.close()


def depth_loop(preds: list[int], head: int) -> int:
    """Baldock et al. literally: the smallest l with preds[l..T] all equal to the head, else T + 1."""
    for layer in range(len(preds)):
        if all(p == head for p in preds[layer:]):
            return layer
    return len(preds)


def joint_loop(preds: list[int], confs: list[float], k: int, theta: float) -> tuple[int, int, bool]:
    """The first l in 0..T-k with equal predictions at l..l+k and conf[l] >= θ (float32), else T, never stable."""
    t = len(preds) - 1
    for layer in range(t - k + 1):
        if len(set(preds[layer : layer + k + 1])) == 1 and np.float32(confs[layer]) >= np.float32(theta):
            return layer, preds[layer], False
    return t, preds[t], True


def test_prediction_depth_equals_a_plain_loop(world):
    for run_id, run in world.runs.items():
        got = q.prediction_depth(world.db, run_id, "all")
        assert got["image_id"].to_list() == world.ids.tolist()
        expected = [depth_loop(list(p), h) for p, h in zip(run.preds, world.head, strict=True)]
        assert got["depth"].to_list() == expected
        assert got["settled"].to_list() == [d <= T for d in expected]
        assert set(got["depth"].to_list()) >= {0, T + 1}  # both ends occur
        test = q.prediction_depth(world.db, run_id)  # scope auto: the test split only
        assert test["image_id"].to_list() == world.ids[world.split == "test"].tolist()


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("theta", [0.25, 0.5, 0.875])
def test_joint_criterion_equals_a_plain_loop(world, k, theta):
    frame = q.decision_layers(world.db, k, "all", min_conf=theta)
    for run_id, run in world.runs.items():
        got = frame.filter(pl.col("run_id") == run_id).sort("image_id")
        rows = [joint_loop(list(p), list(c), k, theta) for p, c in zip(run.preds, run.confs, strict=True)]
        assert got["layer"].to_list() == [r[0] for r in rows]
        assert got["stable_pred"].to_list() == [r[1] for r in rows]
        assert got["never_stable"].to_list() == [r[2] for r in rows]
        assert got["correct"].to_list() == [r[1] == y for r, y in zip(rows, world.labels, strict=True)]
        layers = np.array([r[0] for r in rows])
        summary = q.decision_summary(world.db, k, "all", min_conf=theta).filter(pl.col("run_id") == run_id)
        assert summary["mean"][0] == pytest.approx(layers.mean())
        assert summary["f_late"][0] == pytest.approx(np.mean(layers >= 0.7 * T))
        mass = q.decision_mass(world.db, k, "all", min_conf=theta).filter(pl.col("run_id") == run_id)
        assert mass["n"].to_list() == np.bincount(layers, minlength=T + 1).tolist()


@pytest.mark.parametrize("k", [1, 3])
def test_min_conf_zero_is_todays_decision_layers_and_every_k_macro_takes_it(world, k):
    today = q.query(world.db, "SELECT * FROM decision_layers(?) ORDER BY run_id, image_id", [k])
    assert q.query(world.db, "SELECT * FROM decision_layers(?, min_conf := 0) ORDER BY run_id, image_id",
                   [k]).equals(today)
    tiny = q.decision_layers(world.db, k, "auto", min_conf=1e-9).sort("run_id", "image_id")  # recomputed, same
    assert tiny.select("layer", "stable_pred", "never_stable").equals(
        today.sort("run_id", "image_id").select("layer", "stable_pred", "never_stable"))
    for macro in ("decision_summary(?, min_conf := 0.5)", "decision_sweep(?, min_conf := 0.5)",
                  "decision_mass(?, min_conf := 0.5)", "cumulative_curve(?, min_conf := 0.5)",
                  "decision_examples(?, min_conf := 0.5)", "corruption_shift(?, min_conf := 0.5)",
                  "paper_table(?, min_conf := 0.5)", "seed_spread(?, min_conf := 0.5)"):
        q.query(world.db, f"SELECT * FROM {macro}", [k])  # binds and runs
    sweep = q.k_sweep(world.db, [k], "all", min_conf=0.5)
    assert sweep["mean"].to_list() == pytest.approx(
        [q.decision_summary(world.db, k, "all", min_conf=0.5).filter(pl.col("run_id") == r)["mean"][0]
         for r in sweep["run_id"].to_list()])


def definition_layers(world) -> dict[str, np.ndarray]:
    """Every definition's layer per image (k = 2, min_conf 0.5), by the plain loops above."""
    layers = {}
    for run_id, run in world.runs.items():
        layers[f"l*(2) {run_id}"] = np.array([joint_loop(list(p), [1.0] * (T + 1), 2, 0)[0] for p in run.preds])
        layers[f"joint(2, 0.5) {run_id}"] = np.array([joint_loop(list(p), list(c), 2, 0.5)[0]
                                                      for p, c in zip(run.preds, run.confs, strict=True)])
        layers[f"depth {run_id}"] = np.array([depth_loop(list(p), h) for p, h in zip(run.preds, world.head,
                                                                                        strict=True)])
    return layers


def test_comparison_equals_scipy_and_numpy(world):
    result = q.compare(world.db, list(RUNS), k=2, min_conf=0.5, scope="all", per_pair=3)
    layers = definition_layers(world)
    assert sorted(result.summary["definition"].to_list()) == sorted(layers)
    assert result.summary["definition"].to_list()[:3] == [f"l*(2) {RUNS[0]}", f"joint(2, 0.5) {RUNS[0]}",
                                                          f"depth {RUNS[0]}"]
    # an unsettled depth (T + 1) is in no band of the three: 'unsettled', not late
    band = {name: np.where(v > T, "unsettled", np.where(v < 0.3 * T, "early", np.where(v >= 0.7 * T, "late", "mid")))
            for name, v in layers.items()}
    for row in result.summary.iter_rows(named=True):
        shares = {b: float(np.mean(band[row["definition"]] == b)) for b in ("early", "mid", "late", "unsettled")}
        assert (row["f_early"], row["f_mid"], row["f_late"]) == pytest.approx(
            (shares["early"], shares["mid"], shares["late"]))
        if row["kind"] == "depth":  # every depth run here has unsettled images
            assert row["f_unsettled"] == pytest.approx(shares["unsettled"]) and row["f_unsettled"] > 0
        else:  # l* and joint have no unsettled category
            assert row["f_unsettled"] is None and shares["unsettled"] == 0
    for run_id in RUNS:
        depths = result.depths.filter(pl.col("run_id") == run_id).row(0, named=True)
        unsettled = int(np.sum(layers[f"depth {run_id}"] > T))
        assert (depths["unsettled"], depths["n"], depths["t"]) == (unsettled, N, T)
        assert (depths["layer0"], depths["input_layer0"]) == ("a0", False)
        assert depths["reference_rows"] == "the train split of view clean"
    for row in result.agreement.iter_rows(named=True):
        a, b = layers[row["a"]], layers[row["b"]]
        assert row["n"] == N
        assert row["spearman"] == pytest.approx(spearmanr(a, b).statistic, abs=1e-9)
        assert row["same_band"] == pytest.approx(np.mean(band[row["a"]] == band[row["b"]]))
        assert row["early_a_late_b"] == int(np.sum((band[row["a"]] == "early") & (band[row["b"]] == "late")))
    assert len(result.agreement) == len(layers) * (len(layers) - 1) // 2
    cells = result.crosstab.filter((pl.col("a") == f"depth {RUNS[1]}") & (pl.col("b") == f"l*(2) {RUNS[0]}"))
    assert len(cells) == 12 and cells["n"].sum() == N  # depth's rows: early, mid, late and unsettled
    assert len(result.crosstab.filter((pl.col("a") == f"joint(2, 0.5) {RUNS[0]}")
                                      & (pl.col("b") == f"l*(2) {RUNS[0]}"))) == 9
    for row in cells.iter_rows(named=True):
        expected = np.sum((band[row["a"]] == row["band_a"]) & (band[row["b"]] == row["band_b"]))
        assert row["n"] == expected
    for row in result.disagreements.iter_rows(named=True):
        i = int(np.flatnonzero(world.ids == row["image_id"])[0])
        early, late = (row["a"], row["b"]) if row["side"] == "a early, b late" else (row["b"], row["a"])
        assert band[early][i] == "early" and band[late][i] == "late"
        assert (row["layer_a"], row["layer_b"]) == (layers[row["a"]][i], layers[row["b"]][i])
    decided = {name: v <= T - (0 if name.startswith("depth") else 2) for name, v in layers.items()}
    expected = []
    for row in result.agreement.iter_rows(named=True):
        a, b = row["a"], row["b"]
        opposite = ((band[a] == "early") & (band[b] == "late")) | ((band[a] == "late") & (band[b] == "early"))
        expected.append((-int(np.sum(opposite & decided[a] & decided[b])), row["same_band"], a, b))
    expected.sort()
    assert list(zip(-result.ranking["early_late_decided"], result.ranking["same_band"], result.ranking["a"],
                    result.ranking["b"], strict=True)) == expected
    assert_frame_equal(result.ranking.drop("early_late_decided").sort("a", "b"), result.agreement)  # ρ to 1e-5
    matrix = result.shortened().matrix("spearman")
    assert matrix.shape == (len(layers), len(layers) + 1)
    assert matrix["definition"][0] == "#1 l*(2) linear"


def test_the_comparison_is_one_query_whose_picks_are_plain_counts(world):
    """definition_comparison, compare's one query (the definitions and their pairs computed once): one row whose
    lists hold every table; Spearman's ρ from the pairs' counts per pair of layers is scipy's to 1e-12, the
    cross-table's shares its counts over n, and per pair and side the disagreements listed are the first per_pair
    by the id's hash of a plain loop's images early by one definition and late by the other (all of them, and
    those where both layers are decisions, with their count n)."""
    packed = q.query(world.db, "SELECT * FROM definition_comparison(?, k := 2, min_conf := 0.5, per_pair := 3, "
                               "scope := 'all')", [list(RUNS)])
    assert packed.columns == ["summary", "ranking", "crosstab", "disagreements", "decided"] and packed.height == 1
    table = {c: packed.select(pl.col(c).explode()).unnest(c) for c in packed.columns}
    layers = definition_layers(world)
    band = {name: np.where(v > T, "unsettled", np.where(v < 0.3 * T, "early", np.where(v >= 0.7 * T, "late", "mid")))
            for name, v in layers.items()}
    decided = {name: v <= T - (0 if name.startswith("depth") else 2) for name, v in layers.items()}
    hashes = dict(q.query(world.db, "SELECT image_id, hash(image_id) AS h FROM images").rows())
    assert len(table["ranking"]) == 36 and table["crosstab"]["share"].to_list() == pytest.approx(
        (table["crosstab"]["n"] / N).to_list(), rel=1e-15)
    for row in table["ranking"].iter_rows(named=True):
        a, b = row["a"], row["b"]
        assert row["spearman"] == pytest.approx(spearmanr(layers[a], layers[b]).statistic, abs=1e-12)
        both = decided[a] & decided[b]
        for side, (early, late) in (("a early, b late", (a, b)), ("a late, b early", (b, a))):
            opposite = (band[early] == "early") & (band[late] == "late")
            for name, among, n in (("disagreements", opposite, None),
                                   ("decided", opposite & both, row["early_late_decided"])):
                ids = sorted(world.ids[among].tolist(), key=lambda i: (hashes[i], i))[:3]
                listed = table[name].filter((pl.col("a") == a) & (pl.col("b") == b) & (pl.col("side") == side))
                assert sorted(listed["image_id"].to_list()) == sorted(ids), (name, a, b, side)
                if n is not None:
                    assert n == int(np.sum((band[a] != band[b]) & np.isin(band[a], ["early", "late"])
                                           & np.isin(band[b], ["early", "late"]) & both))
                    assert set(listed["n"].to_list()) <= {n}
    assert table["decided"]["n"].to_list() == sorted(table["decided"]["n"].to_list(), reverse=True)


def test_compare_and_timeline_commands(world):
    out = run_cli("compare", "--db", world.path, "--run", ",".join(RUNS), "--scope", "all").output
    assert "the 10 of 36 pairs of definitions that disagree most" in out and "joint(2, 0.5) knn" in out
    assert "#1" not in out and "26 more pairs not shown; --part agreement lists every pair" in out
    every = run_cli("compare", "--db", world.path, "--scope", "all", "--part", "agreement").output
    assert sum(line.lstrip()[:1].isdigit() and "  vs  " in line for line in every.splitlines()) == 36
    matrix = run_cli("compare", "--db", world.path, "--run", ",".join(RUNS), "--scope", "all", "--part",
                     "matrix").output
    assert "Spearman correlation" in matrix and "#1 l*(2) linear" in matrix
    assert "--part matrix" in fails("compare", "--db", world.path, "--part", "matrix", "--format", "csv")
    csv = run_cli("compare", "--db", world.path, "--part", "crosstab", "--format", "csv").output
    assert csv.splitlines()[0] == "a,b,band_a,band_b,n,share"
    assert run_cli("compare", "--db", world.path, "--format", "csv").output.splitlines()[0] == \
        "a,b,n,spearman,same_band,early_a_late_b,late_a_early_b"
    assert "mean" in run_cli("timeline", "--db", world.path, "--min-conf", "0.5").output
    assert "--min-conf" in fails("timeline", "--db", world.path, "--min-conf", "1.5")
    assert "no run 'm/clean/nope'" in fails("compare", "--db", world.path, "--runs", "m/clean/nope")


def test_average_rank_is_scipys_and_band_limits_are_the_bands_ends():
    """average_rank (the one Spearman rank of css_grid, zoo_stats, definition_agreement) equals scipy's rankdata
    with ties averaged, per partition of one or two columns; band_limits(t) equals the bands of docs/design.md §7
    computed by a plain loop."""
    import duckdb
    from scipy.stats import rankdata

    rng = np.random.default_rng(4)
    x, a, b = rng.integers(0, 6, 90), rng.integers(0, 3, 90), rng.integers(0, 2, 90)  # many ties
    con = duckdb.connect()
    for name in ("average_rank", "decision_band", "band_limits"):
        con.execute(fsdb.sql_text(name))
    con.execute("CREATE TABLE t AS SELECT unnest(?::INT[]) AS i, unnest(?::INT[]) AS x, unnest(?::INT[]) AS a, "
                "unnest(?::INT[]) AS b", [list(range(90)), x.tolist(), a.tolist(), b.tolist()])
    one = dict(con.execute("SELECT i, average_rank(x, a) FROM t").fetchall())
    two = dict(con.execute("SELECT i, average_rank(x, (a, b)) FROM t").fetchall())
    for got, groups in ((one, a), (two, a * 2 + b)):
        for g in np.unique(groups):
            rows = np.flatnonzero(groups == g)
            assert [got[int(i)] for i in rows] == rankdata(x[rows]).tolist(), g
    for t in range(1, 40):
        early = [layer for layer in range(t + 1) if layer < 0.3 * t]
        late = [layer for layer in range(t + 1) if layer >= 0.7 * t]
        assert con.execute("SELECT * FROM band_limits(?)", [t]).fetchall() == [(max(early, default=None), min(late))]
    con.close()


def test_every_depth_names_its_layer_0_and_the_rows_its_probes_learnt_from(tmp_path):
    """prediction_depths names what each run read: anchor 0's name, and the rows its probes learnt from (knn: the
    rows that vote), for a probe-train split, a train+val fit, cross-fit folds and another store's rows."""
    db = tmp_path / "f.duckdb"
    con = fsdb.connect(db)
    ids = np.arange(6)
    fsdb.register_images(con, DatasetInfo("fp", "t", "-", 0), ids, np.array([f"{i}.png" for i in ids]),
                         np.zeros(6, dtype=int), np.array(["test"] * 6))
    fsdb.register_anchors(con, "m", [SimpleNamespace(index=a, name=n, module="", dim=2, depth_frac=a / 2)
                                     for a, n in enumerate(["input", "b", "c"])])
    fsdb.replace_model_outputs(con, "m", "clean", ids, np.zeros(6, dtype=int), np.full(6, 0.9))
    runs = {"m/clean/knn": ({"probe": "knn", "params": {"refs": ""}}, "the train split of view clean"),
            "m/clean/paper": ({"probe": "paper", "params": {"train_on_val": 1}},
                              "the train and val splits of view clean"),
            "m/clean/linear/cf5": ({"cross_fit": 5}, "the other 4 of 5 cross-fit folds of view clean, less their "
                                                     "val rows"),
            "m/clean/knn:refs=x": ({"probe": "knn", "params": {"refs": "/data/train.zarr"}},
                                   "every row of view clean of store /data/train.zarr")}
    for run_id, (fields, _) in runs.items():
        fsdb.write_runs(con, [run_rows({"run_id": run_id, "model": "m", "view": "clean", **fields}, ids,
                                       np.zeros((6, 3), dtype=int), np.ones((6, 3), dtype=np.float32))])
    con.close()
    got = q.query(db, "SELECT DISTINCT run_id, layer0, reference_rows FROM prediction_depths('all') ORDER BY run_id")
    assert got.rows() == sorted((run_id, "input", said) for run_id, (_, said) in runs.items())
