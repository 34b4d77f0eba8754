"""Early exit: every policy on a hand-made prediction table equals a plain-Python simulation; measured
prefix costs grow along the network and the full model's FLOPs equal an independent count."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch
import torchvision
from synthetic import run_rows

from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.compute.prefix_costs import AnchorCost, ModelCost, measure_costs
from featstore.errors import FeatstoreError
from featstore.nets.anchors import PRESETS, resolve_anchors
from featstore.records import DatasetInfo

from conftest import fails, run_cli

# five images, anchors 0..4 (T = 4); labels 1; the model's own head says 1, 1, 2, 1, 1
PREDS = [[0, 1, 1, 1, 1],   # stable from 1
         [2, 2, 2, 1, 1],   # stable from 0 (k<=2), never for k=4
         [3, 0, 3, 0, 3],   # never stable, never right at an anchor... (head: 2)
         [1, 1, 1, 1, 1],   # right everywhere
         [4, 4, 1, 2, 1]]   # flicker
CONFS = [[0.2, 0.6, 0.9, 0.95, 0.99],
         [0.8, 0.7, 0.6, 0.9, 0.97],
         [0.1, 0.2, 0.3, 0.4, 0.5],
         [0.55, 0.65, 0.75, 0.85, 0.95],
         [0.9, 0.3, 0.92, 0.5, 0.6]]
HEAD = [1, 1, 2, 1, 1]
PREFIX_MS, PROBE_MS, FULL_MS = [1.0, 2.0, 4.0, 7.0, 9.0], 0.5, 10.0
PREFIX_FLOPS, PROBE_FLOPS, FULL_FLOPS = [10, 20, 40, 70, 90], 5, 100
DEVICE = "test-device"


def exit_database(path, preds, confs, head, labels):
    """A database of one run (anchors 0..4) with the given predictions, confidences, head and labels, its images all
    in the test split, and the costs above measured at batch 1 and 4."""
    con = fsdb.connect(path)
    ids = np.arange(len(preds))
    fsdb.register_images(con, DatasetInfo("fp", "test", "-", 0), ids, np.array(["a"] * len(ids)), np.asarray(labels),
                         np.array(["test"] * len(ids)))
    fsdb.register_anchors(con, "m", [SimpleNamespace(index=a, name=f"a{a}", module=f"a{a}", dim=2, depth_frac=a / 4)
                                     for a in range(5)])
    run = {"run_id": "m/clean/linear", "model": "m", "view": "clean", "train_view": "clean", "probe": "linear",
           "params": {}, "cross_fit": 0, "seed": 0, "store": "-"}
    fsdb.write_runs(con, [run_rows(run, ids, np.array(preds), np.array(confs))])
    fsdb.replace_model_outputs(con, "m", "clean", ids, np.array(head), np.full(len(ids), 0.9))
    for batch in (1, 4):  # batch 4 costs 4x per batch: the same per image
        anchors = [AnchorCost(a, ms * batch, PREFIX_FLOPS[a] * batch, PROBE_MS * batch, PROBE_FLOPS * batch)
                   for a, ms in enumerate(PREFIX_MS)]
        fsdb.replace_costs(con, "m", ModelCost(DEVICE, batch, FULL_MS * batch, FULL_FLOPS * batch, anchors))
    con.close()
    return path


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return exit_database(tmp_path_factory.mktemp("exit") / "f.duckdb", PREDS, CONFS, HEAD, [1] * 5)


def simulate(policy: str, k: int | None, theta: float | None, preds=PREDS, confs=CONFS, heads=HEAD,
             labels=(1,) * 5) -> list[tuple[int | None, int]]:
    """Plain Python, docs/design.md §7: (exit anchor or None for full depth, prediction) per image."""
    out = []
    for timeline, conf, head, label in zip(preds, confs, heads, labels, strict=True):
        exit_at = None
        for layer in range(len(timeline)):
            stable = k is not None and layer >= k and len(set(timeline[layer - k : layer + 1])) == 1
            confident = theta is not None and np.float32(conf[layer]) >= np.float32(theta)
            if (policy == "stability" and stable) or (policy == "confidence" and confident) or \
               (policy == "combined" and stable and confident) or (policy == "oracle" and timeline[layer] == label):
                exit_at = layer
                break
        out.append((exit_at, head if exit_at is None else timeline[exit_at]))
    return out


def price(policy: str, exit_at: int | None) -> tuple[float, float]:
    if exit_at is None:
        extra = 0 if policy == "full depth" else 1
        return FULL_MS + extra * PROBE_MS * 5, FULL_FLOPS + extra * PROBE_FLOPS * 5
    return PREFIX_MS[exit_at] + PROBE_MS * (exit_at + 1), PREFIX_FLOPS[exit_at] + PROBE_FLOPS * (exit_at + 1)


CASES = ([("stability", k, None) for k in (1, 2, 3, 4)] + [("confidence", None, t) for t in (0.5, 0.8, 0.96)]
         + [("combined", k, t) for k in (1, 2, 3, 4) for t in (0.5, 0.9)]
         + [("oracle", None, None), ("full depth", None, None)])


@pytest.mark.parametrize("batch", [1, 4])
def test_every_policy_matches_a_plain_simulation(db, batch):
    sim = q.exit_simulation(db, "m/clean/linear", DEVICE, batch, q.ExitPolicies((1, 2, 3, 4), (0.5, 0.8, 0.96),
                                                                                     (0.5, 0.9)))
    shares = q.exit_shares(db, "m/clean/linear", q.ExitPolicies((1, 2, 3, 4), (0.5, 0.8, 0.96), (0.5, 0.9)))
    assert len(sim) == len(CASES)
    for policy, k, theta in CASES:
        events = simulate(policy, k, theta) if policy != "full depth" else [(None, h) for h in HEAD]
        row = sim.filter((sim["policy"] == policy) & sim["k"].eq_missing(k) & sim["theta"].eq_missing(theta))
        assert len(row) == 1, (policy, k, theta)
        row = row.to_dicts()[0]
        assert row["accuracy"] == pytest.approx(np.mean([p == 1 for _, p in events])), (policy, k, theta)
        costs = [price(policy, e) for e, _ in events]
        assert row["mean_ms"] == pytest.approx(np.mean([c[0] for c in costs])), (policy, k, theta)
        assert row["mean_flops"] == pytest.approx(np.mean([c[1] for c in costs])), (policy, k, theta)
        same = (shares["policy"] == policy) & shares["k"].eq_missing(k) & shares["theta"].eq_missing(theta)
        got = shares.filter(same)
        expected = {a: sum(e == a for e, _ in events) / 5 for a in {e for e, _ in events}}
        assert dict(zip(got["exit_anchor"].to_list(), got["share"].to_list(), strict=True)) == pytest.approx(expected)


def test_pareto_front_is_the_undominated_set(db):
    policies = q.ExitPolicies(thresholds=(0.5, 0.8, 0.96), combined=(0.5, 0.9))
    sim = q.exit_simulation(db, "m/clean/linear", DEVICE, policies=policies)
    front = q.exit_pareto(db, "m/clean/linear", DEVICE, policies=policies)
    rows = sim.filter(pl.col("policy") != "oracle").select("accuracy", "mean_ms").rows()  # the oracle is no policy
    expected = {(a, m) for a, m in rows if not any(b >= a and n <= m and (b > a or n < m) for b, n in rows)}
    assert set(front.select("accuracy", "mean_ms").rows()) == expected
    assert front["mean_ms"].is_sorted() and "oracle" not in front["policy"].to_list()


def test_the_reports_frontier_is_the_simulation_with_its_undominated_rows_marked(db):
    """exit_frontier (the report's one query for the plot and the front): exit_simulation's rows, on_front exactly
    where no other realisable policy is at least as accurate and as cheap and better in one (a plain loop)."""
    policies = q.ExitPolicies(thresholds=(0.5, 0.8, 0.96), combined=(0.5, 0.9))
    both = q._exit_table("exit_frontier", db, "m/clean/linear", DEVICE, 1, policies, "auto")
    sim = q.exit_simulation(db, "m/clean/linear", DEVICE, policies=policies)
    assert both.drop("on_front").sort(sim.columns).equals(sim.sort(sim.columns))
    rows = sim.filter(pl.col("policy") != "oracle").select("accuracy", "mean_ms").rows()
    for policy, a, m, on_front in both.select("policy", "accuracy", "mean_ms", "on_front").rows():
        beaten = any(b >= a and n <= m and (b > a or n < m) for b, n in rows)
        assert on_front == (policy != "oracle" and not beaten), (policy, a, m)
    assert both["on_front"].any() and not both["on_front"].all()


def test_prefix_costs_grow_and_full_flops_match_an_independent_count():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    anchors = resolve_anchors(model, PRESETS["resnet18"])
    cost = measure_costs(model, anchors, 64, 10, torch.device("cpu"), 2, repeats=7)
    flops = [a.flops for a in cost.anchors]
    assert flops == sorted(flops) and flops[0] > 0

    counted = []

    def count(module, inputs, output):
        if isinstance(module, torch.nn.Conv2d):
            kh, kw = module.kernel_size
            counted.append(2 * output.numel() * (module.in_channels // module.groups) * kh * kw)
        elif isinstance(module, torch.nn.Linear):
            counted.append(2 * output.shape[0] * module.in_features * module.out_features)

    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            m.register_forward_hook(count)
    with torch.no_grad():
        model(torch.randn(2, 3, 64, 64))
    assert cost.flops == sum(counted)
    assert cost.anchors[-1].flops == sum(counted) - counted[-1]  # avgpool: everything but the classifier
    # times are measured, not asserted on (how they grow with depth: bench/prefix_costs.py)
    assert all(np.isfinite(a.ms) and a.ms > 0 and a.probe_ms > 0 for a in cost.anchors) and cost.ms > 0


def test_cost_and_exit_sim_commands(image_dir, tmp_path):
    store, db = tmp_path / "s.zarr", tmp_path / "f.duckdb"
    run_cli("build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--data", image_dir,
            "--store", store, "--no-progress", "--workers", "0")
    assert f"--db {db}: no database there" in fails("exit-sim", "--db", db, "--run", "resnet18/clean/linear")
    assert not db.exists()  # a query never creates the database it reads
    run_cli("probe", "--store", store, "--model", "resnet18", "--db", db, "--no-progress")
    assert "featstore cost" in fails("exit-sim", "--db", db, "--run", "resnet18/clean/linear")
    out = run_cli("cost", "--model", "resnet18", "--db", db, "--store", store, "--batch-size", "1,4",
                  "--repeats", "3").output
    assert "batch 4" in out and "anchor 11" in out
    out = run_cli("exit-sim", "--db", db, "--run", "resnet18/clean/linear", "--thresholds", "0.1:0.3:0.1").output
    assert "Pareto front" in out and "full depth" in out and "--full lists them all" in out
    out = run_cli("exit-sim", "--db", db, "--run", "resnet18/clean/linear", "--thresholds", "0.1:0.3:0.1",
                  "--full").output  # the front first, then every policy
    assert out.index("Pareto front") < out.index("every policy:") and "stability" in out.split("every policy:")[1]
    assert "no run" in fails("exit-sim", "--db", db, "--run", "nope")
    assert "confidences lie in" in fails("exit-sim", "--db", db, "--run", "resnet18/clean/linear", "--thresholds",
                                         "0.5:1.5:0.5")
    assert "give batch sizes" in fails("cost", "--model", "resnet18", "--db", db, "--batch-size", "one")
    assert "give stability windows" in fails("exit-sim", "--db", db, "--run", "resnet18/clean/linear", "--k", "x")
    line = fails("exit-sim", "--db", db, "--run", "resnet18/clean/linear", "--scope", "tst")
    assert "'tst' is not one of" in line and "'test'" in line


def test_exit_sim_reads_every_policy_and_the_front_from_one_simulation(tmp_path):
    """q.exit_frontier (what exit-sim and the report read: one simulation, its front marked) on 400 images whose
    confidences lie on a 1/8 grid (ties at every threshold) and thresholds given twice: every policy equals a plain
    simulation, the front is the undominated set of the realisable ones, and early_exit prints these tables."""
    rng = np.random.default_rng(3)
    preds = rng.integers(0, 3, (400, 5))
    preds[rng.random(400) < 0.5, 2:] = 1  # half settle on the label from anchor 2
    confs = (rng.integers(0, 9, (400, 5)) / 8).astype(np.float32)
    head, labels = rng.integers(0, 3, 400), np.ones(400, int)
    path = exit_database(tmp_path / "f.duckdb", preds, confs, head, labels)
    policies = q.ExitPolicies((1, 3, 1), (0.25, 0.5, 0.5, 0.55, 0.6, 0.625, 1.0), (0.5, 0.875, 0.5))
    sim, front = q.exit_frontier(path, "m/clean/linear", DEVICE, 4, policies)
    cases = ([("stability", k, None) for k in (1, 3)]
             + [("confidence", None, t) for t in (0.25, 0.5, 0.55, 0.6, 0.625, 1.0)]
             + [("combined", k, t) for k in (1, 3) for t in (0.5, 0.875)] + [("full depth", None, None),
                                                                              ("oracle", None, None)])
    assert sim.select("policy", "k", "theta").rows() == sorted(cases, key=lambda c: (c[0], c[1] or 0, c[2] or 0))
    points = {}
    for policy, k, theta in cases:
        events = simulate(policy, k, theta, preds.tolist(), confs.tolist(), head.tolist(), labels.tolist())
        if policy == "full depth":
            events = [(None, h) for h in head.tolist()]
        row = sim.filter((pl.col("policy") == policy) & pl.col("k").eq_missing(k)
                         & pl.col("theta").eq_missing(theta)).row(0, named=True)
        costs = [price(policy, e) for e, _ in events]
        assert row["n"] == 400 and row["accuracy"] == np.mean([p == 1 for _, p in events]), (policy, k, theta)
        assert row["mean_ms"] == pytest.approx(np.mean([c[0] for c in costs]), rel=1e-12), (policy, k, theta)
        assert row["full_depth_share"] == np.mean([e is None for e, _ in events]), (policy, k, theta)
        if policy != "oracle":
            points[policy, k, theta] = (row["accuracy"], row["mean_ms"])
    undominated = {c for c, (a, m) in points.items()
                   if not any(b >= a and n <= m and (b > a or n < m) for b, n in points.values())}
    assert set(front.select("policy", "k", "theta").rows()) == undominated and front["mean_ms"].is_sorted()
    # θ = 0.55 and 0.6 exit every image where 0.625 does (the grid has nothing between): the same figures to the
    # last bit, and so both on the front or neither
    tied = sim.filter(pl.col("theta").is_in([0.55, 0.6, 0.625]) & (pl.col("policy") == "confidence"))
    assert tied.select("accuracy", "mean_ms", "mean_flops").unique().height == 1
    assert front.filter(pl.col("theta").is_in([0.55, 0.6, 0.625]) & (pl.col("policy") == "confidence")).height in (0, 3)
    result = q.early_exit(path, "m/clean/linear", DEVICE, 4, policies)
    assert result.simulation.equals(sim) and result.pareto.equals(front)


def test_the_macros_defaults_are_the_cli_and_report_defaults(db):
    """A plain DuckDB client calling the macros without arguments simulates the same policies as featstore."""
    from featstore.analytics.exit_policies import DEFAULT_POLICIES, ExitPolicies

    for macro in ("exit_simulation", "exit_pareto"):
        bare = q.query(db, f"SELECT * FROM {macro}('m/clean/linear', ?) ORDER BY ALL", [DEVICE])
        ours = q._exit_table(macro, db, "m/clean/linear", DEVICE, 1, DEFAULT_POLICIES, "auto").sort(bare.columns)
        assert bare.sort(bare.columns).equals(ours)
        other = ExitPolicies(thresholds=(0.6,))
        coarse = q._exit_table(macro, db, "m/clean/linear", DEVICE, 1, other, "auto").sort(bare.columns)
        assert not bare.sort(bare.columns).equals(coarse), "the check cannot tell thresholds apart on this data"
    bare = q.query(db, "SELECT * FROM exit_shares('m/clean/linear') ORDER BY ALL")
    assert bare.sort(bare.columns).equals(q.exit_shares(db, "m/clean/linear").sort(bare.columns))


@pytest.mark.parametrize("given, said", [
    ({"thresholds": (2.0,)}, "thresholds=2.0: confidences lie in [0, 1]"),
    ({"thresholds": (0.5, float("nan"))}, "thresholds=nan: confidences lie in [0, 1]"),
    ({"combined": (-0.1,)}, "combined_thresholds=-0.1: confidences lie in [0, 1]"),
    ({"thresholds": ()}, "thresholds=(): give at least one confidence threshold"),
    ({"ks": ()}, "ks=(): give stability windows, integers >= 1"),
    ({"ks": (0, 2)}, "ks=(0, 2): give stability windows, integers >= 1"),
    ({"thresholds": (0.5,) * 10_001}, "thresholds=(10,001 values): at most 10,000; give fewer"),
])
def test_the_policies_are_checked_where_python_callers_make_them(given, said):
    """Python's early_exit builds its ExitPolicies without the CLI's parser: a confidence outside [0, 1] (a policy
    that never or always exits), an empty list or 10,001 thresholds is one line naming the field, before a query."""
    from dataclasses import replace

    from featstore.analytics.exit_policies import DEFAULT_POLICIES, MAX_THRESHOLDS

    with pytest.raises(FeatstoreError) as caught:
        replace(DEFAULT_POLICIES, **given)
    assert str(caught.value) == said and MAX_THRESHOLDS == 10_000
    assert replace(DEFAULT_POLICIES, thresholds=(0.0, 1.0), combined=(), learned=()).args()[1] == [0.0, 1.0]
