"""Overthinking's label-blind null (analytics/readouts.py): labels shuffled among the images the head gets right,
and among those it gets wrong, each image keeping its timeline. On a hand-made run of nine images every permutation
is enumerated, so the null's mean is checked exactly and the p-value and interval against the exact permutation
distribution; on a random run every figure is checked against a plain loop of the documented permutation scheme."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from synthetic import register_toy_images, run_rows

from featstore.analytics import db as fsdb
from featstore.analytics import readouts as r
from featstore.errors import FeatstoreError
from featstore.schema import NULL_DRAWS

RUN = "m/clean/linear"
T = 3  # anchors 0..3; the internal ones are 0..2
# the head gets these wrong: labels and timelines (label 3 twice: the shuffle moves a multiset)
WRONG = [(0, [0, 0, 1, 1]), (1, [2, 1, 1, 3]), (2, [3, 3, 2, 2]), (3, [4, 4, 4, 4]), (3, [3, 0, 0, 0])]
# ... and these right (image 7 is right only at the last anchor, which is not internal)
RIGHT = [(0, [1, 0, 0, 0]), (1, [1, 1, 1, 1]), (1, [2, 2, 2, 1]), (2, [0, 1, 2, 2])]


def write_run(path, labels, preds, head, split=None) -> None:
    con = fsdb.connect(path)
    n = len(labels)
    register_toy_images(con, np.asarray(labels), np.asarray(split if split is not None else ["test"] * n), ("m",),
                        preds.shape[1])
    fsdb.replace_model_outputs(con, "m", "clean", np.arange(n), np.asarray(head), np.full(n, 0.9))
    fsdb.write_runs(con, [run_rows({"run_id": RUN, "model": "m", "view": "clean"}, np.arange(n), preds,
                                   np.full(preds.shape, 0.5, dtype=np.float32))])
    con.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    db = tmp_path_factory.mktemp("tiny") / "f.duckdb"
    rows = WRONG + RIGHT
    labels = [label for label, _ in rows]
    head = [(label + 1) % 5 for label, _ in WRONG] + [label for label, _ in RIGHT]
    write_run(db, labels, np.array([timeline for _, timeline in rows]), head)
    return db


def right_by(timelines, labels) -> list[int]:
    """Per anchor l, how many images have their label at some anchor <= l: a plain loop."""
    counts = [0] * (T + 1)
    for timeline, label in zip(timelines, labels, strict=True):
        for layer in range(T + 1):
            if label in timeline[:layer + 1]:
                counts[layer] += 1
    return counts


def every_permutation(group) -> list[list[int]]:
    """The count right by each anchor under every permutation of the group's labels over its timelines."""
    timelines, labels = [t for _, t in group], [label for label, _ in group]
    return [right_by(timelines, [labels[j] for j in perm]) for perm in itertools.permutations(range(len(group)))]


def exact_quantile(values, q: float) -> float:
    return float(np.quantile(np.asarray(values, dtype=float), q))


def test_null_mean_is_the_exact_expectation_over_every_permutation(tiny):
    got = r.overthinking(tiny, RUN)
    n = len(WRONG) + len(RIGHT)
    wrong, right = np.array(every_permutation(WRONG)), np.array(every_permutation(RIGHT))
    assert len(wrong) == 120 and len(right) == 24
    for layer in range(T + 1):
        row = got.row(layer, named=True)
        assert row["destructive_by_null"] == pytest.approx(wrong[:, layer].mean() / n, abs=1e-12)
        assert row["wasteful_by_null"] == pytest.approx(right[:, layer].mean() / n, abs=1e-12)
        assert row["correct_by_null"] == pytest.approx((wrong[:, layer].mean() + right[:, layer].mean()) / n,
                                                       abs=1e-12)
    assert got["destructive_null"][0] == pytest.approx(wrong[:, T - 1].mean() / n, abs=1e-12)
    assert got["wasteful_null"][0] == pytest.approx(right[:, T - 1].mean() / n, abs=1e-12)
    assert got["destructive"][0] == pytest.approx(4 / n)  # images 0, 1, 2 and 4 of the mistakes
    assert got["wasteful"][0] == pytest.approx(3 / n)
    assert set(got["draws"]) == {NULL_DRAWS}
    assert not any(c.endswith("_chance") for c in got.columns)  # the independence figure is gone


def test_p_value_and_interval_follow_the_exact_permutation_distribution(tiny):
    got = r.overthinking(tiny, RUN)
    n, draws = len(WRONG) + len(RIGHT), NULL_DRAWS
    for share, group, observed in (("destructive", WRONG, 4), ("wasteful", RIGHT, 3)):
        counts = [c[T - 1] for c in every_permutation(group)]
        exact_p = sum(c >= observed for c in counts) / len(counts)
        # the Monte Carlo p = (1 + X) / (draws + 1), X ~ Binomial(draws, exact_p): within 5 standard deviations
        sd = math.sqrt(exact_p * (1 - exact_p) / draws)
        assert abs(got[f"{share}_p"][0] - exact_p) <= 5 * sd + 1 / (draws + 1), share
        lo, hi = got[f"{share}_null_lo"][0] * n, got[f"{share}_null_hi"][0] * n
        assert exact_quantile(counts, 0.01) <= lo <= exact_quantile(counts, 0.05), share
        assert exact_quantile(counts, 0.95) <= hi <= exact_quantile(counts, 0.99), share
    assert got["destructive_p"][0] < 0.2  # 4 of 5 mistakes right earlier is rare under the shuffle


def plain_null(timelines: np.ndarray, labels: np.ndarray, head_right: np.ndarray, draws: int, seed: int):
    """The documented permutation scheme as a loop: one generator; the head-right images, then the head-wrong ones
    (by image id), `draws` calls of rng.permutation each; per draw the count right by each anchor."""
    rng = np.random.default_rng(seed)
    counts = {}
    for group in (True, False):
        members = np.flatnonzero(head_right == group)
        per_draw = []
        for _ in range(draws):
            perm = rng.permutation(len(members))
            row = [0] * timelines.shape[1]
            for i, j in zip(members, perm, strict=True):
                label = labels[members[j]]
                first = next((layer for layer, p in enumerate(timelines[i]) if p == label), None)
                if first is not None:
                    for layer in range(first, timelines.shape[1]):
                        row[layer] += 1
            per_draw.append(row)
        counts[group] = np.array(per_draw)
    return counts


@pytest.fixture(scope="module")
def random_run(tmp_path_factory):
    rng = np.random.default_rng(5)
    n, anchors = 160, 6
    labels = rng.integers(0, 6, n)
    split = rng.choice(["train", "test"], n, p=[0.3, 0.7])
    preds = np.where(rng.random((n, anchors)) < np.linspace(0.2, 0.8, anchors), labels[:, None],
                     rng.integers(0, 6, (n, anchors)))
    head = np.where(rng.random(n) < 0.7, labels, (labels + 1) % 6)
    db = tmp_path_factory.mktemp("random") / "f.duckdb"
    write_run(db, labels, preds, head, split)
    test = split == "test"
    return db, preds[test], labels[test], (head == labels)[test]


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("table_cells", [1 << 24, 0])  # each draw's hits by one lookup per image, or by comparing
def test_every_figure_matches_a_plain_permutation_loop(random_run, seed, table_cells, monkeypatch):
    monkeypatch.setattr(r, "_TABLE_CELLS", table_cells)
    db, preds, labels, head_right = random_run
    draws = 300
    assert_plain_loop(r.overthinking(db, RUN, draws=draws, seed=seed), preds, labels, head_right, draws, seed)


def assert_plain_loop(got, preds, labels, head_right, draws: int, seed: int) -> None:
    """Every figure of `got` (overthinking of one run) against `plain_null` and counts of its own."""
    n, t = len(labels), preds.shape[1] - 1
    counts = plain_null(preds, labels, head_right, draws, seed)
    observed = {g: np.array(right_by_group) for g, right_by_group in
                ((g, [sum(labels[i] in preds[i, :layer + 1] for i in np.flatnonzero(head_right == g))
                      for layer in range(t + 1)]) for g in (True, False))}
    for share, null, obs in (("wasteful_by", counts[True], observed[True]),
                             ("destructive_by", counts[False], observed[False]),
                             ("correct_by", counts[True] + counts[False], observed[True] + observed[False])):
        for layer in range(t + 1):
            row = got.row(layer, named=True)
            assert row[share] == pytest.approx(obs[layer] / n)
            lo, hi = np.percentile(null[:, layer] / n, [2.5, 97.5])
            assert row[f"{share}_null_lo"] == pytest.approx(lo, abs=1e-12)
            assert row[f"{share}_null_hi"] == pytest.approx(hi, abs=1e-12)
            above = sum(1 for d in range(draws) if null[d, layer] >= obs[layer])
            assert row[f"{share}_p"] == pytest.approx((1 + above) / (draws + 1), abs=1e-12)
            assert row[f"{share}_null"] == pytest.approx(null[:, layer].mean() / n, abs=0.02)  # the exact mean
    for share in ("wasteful", "destructive"):
        assert got[f"{share}_p"].to_list() == [got[f"{share}_by_p"][t - 1]] * (t + 1)
        assert got[f"{share}_null_lo"][0] == got[f"{share}_by_null_lo"][t - 1]
    assert got["seed"][0] == seed


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    """Two runs over the same images and head (groups of the same sizes: one set of permutations serves both) and
    a third on another view, whose head is right on other images (groups of other sizes)."""
    rng = np.random.default_rng(11)
    n, anchors = 120, 5
    labels = rng.integers(0, 5, n)
    db = tmp_path_factory.mktemp("three") / "f.duckdb"
    con = fsdb.connect(db)
    register_toy_images(con, labels, np.array(["test"] * n), ("m",), anchors)
    runs = {}
    for run_id, view, right in (("m/clean/linear", "clean", 0.7), ("m/clean/knn", "clean", 0.7),
                                ("m/noisy/linear", "noisy", 0.4)):
        if view not in {v for _, v, _ in runs.values()}:
            head = np.where(rng.random(n) < right, labels, (labels + 1) % 5)
            fsdb.replace_model_outputs(con, "m", view, np.arange(n), head, np.full(n, 0.9))
        preds = np.where(rng.random((n, anchors)) < np.linspace(0.2, 0.8, anchors), labels[:, None],
                         rng.integers(0, 5, (n, anchors)))
        fsdb.write_runs(con, [run_rows({"run_id": run_id, "model": "m", "view": view}, np.arange(n), preds,
                                       np.full(preds.shape, 0.5, dtype=np.float32))])
        runs[run_id] = (preds, view, head)
    con.close()
    return db, labels, runs


def test_runs_at_once_are_each_run_alone_by_a_plain_loop(three_runs):
    db, labels, runs = three_runs
    got = r.overthinking_runs(db, list(runs), draws=150, seed=2)
    assert list(got) == list(runs)
    sizes = {run_id: int((head == labels).sum()) for run_id, (_, _, head) in runs.items()}
    assert sizes["m/clean/linear"] == sizes["m/clean/knn"] != sizes["m/noisy/linear"]
    for run_id, (preds, _, head) in runs.items():
        assert_plain_loop(got[run_id], preds, labels, head == labels, 150, 2)


def test_the_same_seed_gives_the_same_figures(random_run):
    db = random_run[0]
    first, again = r.overthinking(db, RUN, draws=200, seed=3), r.overthinking(db, RUN, draws=200, seed=3)
    assert first.equals(again)


@pytest.mark.parametrize("draws", [0, -5, 2.5, True])
def test_draws_must_be_a_whole_number_of_at_least_one(random_run, draws):
    with pytest.raises(FeatstoreError, match=f"draws {draws!r}: give a whole number"):
        r.overthinking(random_run[0], RUN, draws=draws)
