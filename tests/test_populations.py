"""One population per comparison, and the probe's share of the timeline in view: exit-sim counts every policy of a
cross-fit run on the images its learned gate did not learn from (recounted in numpy), prints that population, and
run_agreement's per-anchor and l*(2)/band agreement equal a plain numpy loop over the `predictions` table."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from synthetic import register_toy_images, run_rows

from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.analytics.exit_policies import ExitPolicies
from featstore.records import AnchorCost, ModelCost

from conftest import fails, run_cli

N, T = 360, 5
CF = "m/clean/linear/cf3"  # the default probe of a cross-fit run
PAPER = "m/clean/paper/cf3"
SEED = "m/clean/linear/cf3/seed1"
SINGLE = "m/clean/linear"  # a single 70/30 split run of the same model and view
NOISE = "m/noise/linear/cf3"
ALONE = "m2/clean/linear"  # a model with the default probe only
PREFIX_MS, PROBE_MS, FULL_MS = [1.0, 2.0, 3.0, 5.0, 8.0, 9.0], 0.25, 10.0
POLICIES = ExitPolicies(thresholds=(0.4, 0.6, 0.8), combined=(0.5,))


def perturbed(preds: np.ndarray, rng: np.random.Generator, rate: float) -> np.ndarray:
    """The same timelines with a share `rate` of the (image, anchor) predictions replaced by another class."""
    out = preds.copy()
    flip = rng.random(preds.shape) < rate
    out[flip] = (out[flip] + rng.integers(1, 3, int(flip.sum()))) % 3
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Timelines that settle on the head's answer at a random anchor, a cross-fit run with a paper twin and a
    second seed that disagree at some anchors (the paper twin misses 30 images), a single-split run, a noise
    view, a lone second model; costs; a gate fitted by `featstore gate` on the cross-fit run's train split."""
    rng = np.random.default_rng(5)
    db = tmp_path_factory.mktemp("populations") / "f.duckdb"
    con = fsdb.connect(db)
    ids = np.arange(N)
    labels = rng.integers(0, 3, N)
    split = rng.choice(["train", "val", "test"], N, p=[0.6, 0.1, 0.3])
    register_toy_images(con, labels, split, ("m", "m2"), T + 1)
    head = np.where(rng.random(N) < 0.8, labels, rng.integers(0, 3, N))
    settle = rng.integers(0, T + 1, N)
    preds = rng.integers(0, 3, (N, T + 1))
    for i in range(N):
        preds[i, settle[i]:] = head[i]
    good = (preds == labels[:, None]) & (preds == head[:, None])
    confs = np.clip(0.45 + 0.3 * good + rng.normal(0, 0.15, preds.shape), 0.01, 0.99).astype(np.float32)
    folds = rng.integers(0, 3, N)
    kept = np.sort(rng.choice(N, N - 30, replace=False))  # the paper twin predicted 330 images
    runs = {CF: (ids, preds, {"cross_fit": 3}, folds),
            PAPER: (kept, perturbed(preds, rng, 0.15)[kept], {"probe": "paper", "cross_fit": 3}, folds[kept]),
            SEED: (ids, perturbed(preds, rng, 0.05), {"cross_fit": 3, "seed": 1}, folds),
            SINGLE: (ids, perturbed(preds, rng, 0.10), {}, None),
            NOISE: (ids, perturbed(preds, rng, 0.20), {"view": "noise", "cross_fit": 3}, folds),
            ALONE: (ids, preds, {"model": "m2"}, None)}
    for run_id, (image_id, pred, fields, fold) in runs.items():
        run = {"run_id": run_id, "model": "m", "view": "clean", **fields}
        fsdb.write_runs(con, [run_rows(run, image_id, pred, confs[image_id], fold)])
    for model in ("m", "m2"):
        fsdb.replace_model_outputs(con, model, "clean", ids, head, np.full(N, 0.9))
        fsdb.replace_costs(con, model, ModelCost("dev", 1, FULL_MS, 100, [AnchorCost(a, ms, 10 * a, PROBE_MS, 1)
                                                                           for a, ms in enumerate(PREFIX_MS)]))
    con.close()
    run_cli("gate", "--db", db, "--run", CF)
    return SimpleNamespace(db=db, ids=ids, labels=labels, split=split, head=head, confs=confs, runs=runs)


# -- independent computations, from the predictions table -----------------------------------------------------


def timelines(db, run_id: str) -> dict[int, list[int]]:
    """image id -> predictions in anchor order, read from the plain `predictions` table."""
    rows = q.query(db, "SELECT image_id, anchor, pred FROM predictions WHERE run_id = ?", [run_id])
    out: dict[int, list[int | None]] = {}
    for image, anchor, pred in rows.iter_rows():
        out.setdefault(image, [None] * (T + 1))[anchor] = pred
    return out


def decision_layer(timeline: list[int], k: int) -> int:
    """docs/design.md §7, one image: the first l whose predictions l..l+k are equal, else T."""
    return next((j for j in range(T - k + 1) if len(set(timeline[j : j + k + 1])) == 1), T)


def band(layer: int) -> str:
    return "early" if layer < 0.3 * T else "late" if layer >= 0.7 * T else "mid"


def agreement_loop(world, run_a: str, run_b: str, counted: np.ndarray, k: int = 2) -> tuple[list[float], dict]:
    """Per anchor the share of identical predictions, and the shares of identical l*(k) and band, over the images
    both runs predicted that `counted` (a mask over image ids) keeps."""
    a, b = timelines(world.db, run_a), timelines(world.db, run_b)
    both = [i for i in sorted(a) if i in b and counted[i]]
    per_anchor = [float(np.mean([a[i][j] == b[i][j] for i in both])) for j in range(T + 1)]
    la, lb = ({i: decision_layer(t[i], k) for i in both} for t in (a, b))
    overall = {"n": len(both), "same_pred": float(np.mean([a[i] == b[i] for i in both])),
               "same_layer": float(np.mean([la[i] == lb[i] for i in both])),
               "same_band": float(np.mean([band(la[i]) == band(lb[i]) for i in both])),
               "mean_a": float(np.mean([la[i] for i in both])), "mean_b": float(np.mean([lb[i] for i in both])),
               "late_a": float(np.mean([band(la[i]) == "late" for i in both])),
               "late_b": float(np.mean([band(lb[i]) == "late" for i in both]))}
    return per_anchor, overall


# -- run_agreement ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("other", "scope"), [(PAPER, "all"), (SEED, "all"), (PAPER, "test"), (SINGLE, "auto")])
def test_run_agreement_equals_a_numpy_loop_over_the_predictions(world, other, scope):
    got = q.run_agreement(world.db, CF, other, scope=scope)
    counted = {"all": np.ones(N, bool), "test": world.split == "test",
               "auto": world.split == "test"}[scope]  # auto: the cross-fit run counts all, the single split test
    per_anchor, overall = agreement_loop(world, CF, other, counted)
    anchors = got.filter(pl.col("anchor").is_not_null()).sort("anchor")
    assert anchors["anchor"].to_list() == list(range(T + 1))
    assert anchors["n"].to_list() == [overall["n"]] * (T + 1)
    assert anchors["same_pred"].to_list() == pytest.approx(per_anchor, abs=1e-12)
    assert all(anchors[c].null_count() == T + 1 for c in ("same_layer", "same_band", "mean_a", "late_b"))
    row = got.filter(pl.col("anchor").is_null()).row(0, named=True)
    assert {c: row[c] for c in overall} == pytest.approx(overall, abs=1e-12)
    assert 0 < row["same_layer"] < 1 and 0 < row["same_band"] < 1 and min(per_anchor) < 1  # the data tells apart
    if other == PAPER and scope == "all":
        assert overall["n"] == N - 30  # only the images both runs predicted


def test_run_agreement_of_a_run_with_itself_and_its_other_k(world):
    self_ = q.run_agreement(world.db, CF, CF)
    assert self_["same_pred"].to_list() == [1.0] * (T + 2) and self_["n"].to_list() == [N] * (T + 2)
    got = q.run_agreement(world.db, CF, SEED, k=1).filter(pl.col("anchor").is_null()).row(0, named=True)
    _, overall = agreement_loop(world, CF, SEED, np.ones(N, bool), k=1)
    assert got["same_layer"] == pytest.approx(overall["same_layer"], abs=1e-12)


def test_run_agreement_refuses_runs_of_other_views_and_unknown_runs(world):
    with pytest.raises(Exception, match="different models or views"):
        q.run_agreement(world.db, CF, NOISE)
    with pytest.raises(Exception, match="different models or views"):
        q.run_agreement(world.db, SINGLE, ALONE)
    with pytest.raises(Exception, match="no run 'm/clean/nope'"):
        q.run_agreement(world.db, CF, "m/clean/nope")
    out = run_cli("sql", "--db", world.db, "--format", "csv",
                  f"SELECT n, same_layer FROM run_agreement('{CF}', '{SEED}') WHERE anchor IS NULL").output
    assert out.splitlines()[1].startswith(f"{N},")  # a plain SQL client gets the same macro


# -- one population for every exit policy -----------------------------------------------------------------------


def stability_loop(world, images: np.ndarray, k: int) -> tuple[float, float]:
    """Accuracy and mean ms of the stability gate at k over `images` (docs/design.md §7), from the predictions."""
    preds = timelines(world.db, CF)
    right, ms = [], []
    for i in images:
        t = preds[i]
        exit_at = next((j for j in range(k, T + 1) if len(set(t[j - k : j + 1])) == 1), None)
        out = world.head[i] if exit_at is None else t[exit_at]
        right.append(out == world.labels[i])
        ms.append(FULL_MS + PROBE_MS * (T + 1) if exit_at is None else PREFIX_MS[exit_at] + PROBE_MS * (exit_at + 1))
    return float(np.mean(right)), float(np.mean(ms))


def test_every_exit_policy_of_a_cross_fit_run_counts_the_gates_images(world):
    scores = q.query(world.db, "SELECT image_id, learnt FROM gate_scores WHERE run_id = ?", [CF])
    unseen = np.unique(scores.filter(~pl.col("learnt"))["image_id"].to_numpy())
    assert np.array_equal(unseen, np.flatnonzero(world.split != "train"))  # the gate learnt from the train split
    sim = q.exit_simulation(world.db, CF, "dev", policies=POLICIES)
    assert {"stability", "confidence", "combined", "learned", "oracle", "full depth"} <= set(sim["policy"])
    assert sim["n"].to_list() == [len(unseen)] * len(sim)  # before: every policy but the learned one counted N
    for k in (1, 2, 4):
        row = sim.filter((pl.col("policy") == "stability") & (pl.col("k") == k)).row(0, named=True)
        assert (row["accuracy"], row["mean_ms"]) == pytest.approx(stability_loop(world, unseen, k), abs=1e-12)
    full = sim.filter(pl.col("policy") == "full depth").row(0, named=True)
    assert full["accuracy"] == pytest.approx(np.mean(world.head[unseen] == world.labels[unseen]), abs=1e-12)
    front = q.exit_pareto(world.db, CF, "dev", policies=POLICIES)
    assert not front.is_empty() and front["n"].to_list() == [len(unseen)] * len(front)
    shares = q.exit_shares(world.db, CF, POLICIES)
    assert shares.group_by("policy", "k", "theta").agg(pl.col("share").sum())["share"].to_list() == \
        pytest.approx([1.0] * shares.select("policy", "k", "theta").unique().height)

    population = q.exit_population(world.db, CF, POLICIES).row(0, named=True)
    counts = {s: int((world.split[unseen] == s).sum()) for s in ("val", "test")}
    assert population == {"run_id": CF, "scope": "auto", "cross_fit": 3, "gate_learnt_on": "train",
                          "n": len(unseen), "splits": f"val {counts['val']}, test {counts['test']}", "scoped": N,
                          "left_out": int((world.split == "train").sum())}


def test_without_the_gate_every_policy_counts_the_whole_scope(world):
    sim = q.exit_simulation(world.db, CF, "dev", policies=ExitPolicies(thresholds=(0.6,), learned=()))
    assert "learned" not in sim["policy"].to_list() and sim["n"].to_list() == [N] * len(sim)
    row = sim.filter((pl.col("policy") == "stability") & (pl.col("k") == 2)).row(0, named=True)
    assert (row["accuracy"], row["mean_ms"]) == pytest.approx(stability_loop(world, world.ids, 2), abs=1e-12)
    test = np.flatnonzero(world.split == "test")
    named = q.exit_simulation(world.db, CF, "dev", policies=POLICIES, scope="test")
    assert named["n"].to_list() == [len(test)] * len(named)  # the gate learnt from none of the test images
    single = q.exit_simulation(world.db, SINGLE, "dev", policies=POLICIES)  # no gate: the test split
    assert single["n"].to_list() == [len(test)] * len(single)
    paper = q.exit_simulation(world.db, PAPER, "dev", policies=POLICIES)  # the full-depth baseline included
    assert paper["n"].to_list() == [N - 30] * len(paper)
    population = q.exit_population(world.db, PAPER, POLICIES).row(0, named=True)
    assert (population["n"], population["scoped"], population["left_out"]) == (N - 30, N, 30)
    assert f"population: {N - 30} images" in q.describe_population(population)
    assert "less the 30 the run did not predict" in q.describe_population(population)


def test_exit_sim_prints_the_population_with_the_table(world):
    unseen = int((world.split != "train").sum())
    counts = {s: int((world.split == s).sum()) for s in ("train", "val", "test")}
    out = run_cli("exit-sim", "--db", world.db, "--run", CF, "--thresholds", "0.5,0.9").output
    assert (f"population: {unseen} images (val {counts['val']}, test {counts['test']}): every image of this "
            f"cross-fit run (--scope auto), less the {counts['train']} the learned gate learnt from (train split) "
            "or the run did not predict") in out
    assert out.index("population:") < out.index("Pareto front")
    out = run_cli("exit-sim", "--db", world.db, "--run", CF, "--thresholds", "0.5,0.9", "--no-gate").output
    assert f"population: {N} images (train {counts['train']}, val {counts['val']}, test {counts['test']})" in out
    assert "learned" not in out
    csv = run_cli("exit-sim", "--db", world.db, "--run", CF, "--thresholds", "0.5", "--format", "csv")
    assert csv.stdout.startswith("policy,") and csv.stderr.startswith(f"population: {unseen} images")
    line = fails("exit-sim", "--db", world.db, "--run", CF, "--scope", "train")
    assert "learned gate" in line and "--no-gate" in line


# -- the report -------------------------------------------------------------------------------------------------


def test_the_report_shows_the_population_and_the_probe_sensitivity(world, tmp_path):
    from featstore.analytics.report import write_report

    page = write_report(world.db, tmp_path / "report", ks=[1, 2]).read_text()
    unseen = int((world.split != "train").sum())
    assert f"population: {unseen} images" in page  # beside the early-exit table of the cross-fit run
    section, alone = page.split("How much does the timeline depend on the probe?")[1:]
    for other in (PAPER, SEED, SINGLE):
        # the section counts each pair on the images both count (scope auto: all of two cross-fit runs, else test)
        counted = np.ones(N, bool) if other != SINGLE else world.split == "test"
        _, overall = agreement_loop(world, CF, other, counted)
        assert f"{overall['same_layer']:.3f}" in section and f"{overall['same_band']:.3f}" in section, other
        assert other.removeprefix("m/clean/") in section
    assert "no paper run" not in section and "no second seed of <code>m/clean/linear" not in section
    assert "--variant paper --seed 1" in section  # the paper run's SGD depends on its seed, and it has one seed
    assert alone.startswith(" m2<") and "no paper run" in alone and "no second seed" not in alone  # linear only:
    assert "The reference has no seed spread to show" in alone  # its full-batch solve is the same whatever the seed
