"""Neighbour-C runs (`linear:C_step`) refit from the chosen run's search when it ran in this process: the same
probe, bit for bit, as one that searches for itself, and scikit-learn's exact optimum at the neighbouring C per
image; the search is not solved again (counted at the solver), and rows it did not search are searched afresh."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from synthetic import class_clusters
from test_probe_optimum import exact, standardised

from featstore.probing import strength
from featstore.probing.split import make_split
from featstore.probing.strength import Softmax, StrengthGrid, Tolerances, choose_and_solve

CLASSES = 5


@pytest.fixture(scope="module")
def rows():
    """Two anchors of one width (one group), standardised on the fit rows: float64 for scikit-learn, the fit rows
    as the solver reads them, labels and split."""
    feats, labels = class_clusters(600, CLASSES, [64, 64], seed=3, separation=(0.4, 0.8))  # C chosen mid-grid
    split = make_split(np.arange(len(labels)))
    fit = np.isin(split, ["train", "val"])
    z = [standardised(f, fit) for f in feats]
    x = torch.from_numpy(np.stack([a[fit] for a in z]).astype(np.float32))
    return z, labels, split, fit, x, torch.from_numpy(labels[fit]), torch.from_numpy(split[fit] == "val")


@pytest.fixture
def solver_calls(monkeypatch):
    """How many solves `choose_and_solve` starts (the path's, one per C, and the refit's), counted at the solver."""
    calls = []
    solve = strength.minimise

    def counted(*args, **kwargs):
        calls.append(1)
        return solve(*args, **kwargs)

    monkeypatch.setattr(strength, "minimise", counted)
    strength._SEARCHES.clear()
    yield calls
    strength._SEARCHES.clear()


def _solve(rows, step: int):
    *_, x, y, is_val = rows
    return choose_and_solve(x, y, is_val, Softmax(CLASSES), StrengthGrid(step=step), Tolerances())


@pytest.mark.parametrize("step", [-1, 1])
def test_a_neighbour_after_the_chosen_run_reuses_its_search_and_equals_one_searched_alone(rows, solver_calls, step):
    cold = _solve(rows, step)  # nothing searched before: the neighbour searches itself
    cold_calls = len(solver_calls)
    strength._SEARCHES.clear()
    _solve(rows, 0)  # the chosen run
    solver_calls.clear()
    warm = _solve(rows, step)
    searched = max(len(p) for p in cold.path)  # the path solves once per grid value, all anchors together
    assert searched >= 3 and len(solver_calls) <= 2 and cold_calls - len(solver_calls) == searched
    assert torch.equal(warm.w, cold.w)  # the same probe, whichever ran first
    assert (warm.c, warm.chosen, warm.passes, warm.path) == (cold.c, cold.chosen, cold.passes, cold.path)
    np.testing.assert_array_equal(warm.val_loss, cold.val_loss)
    z, labels, split, fit, *_ = rows
    test = split == "test"
    grid = StrengthGrid().values()
    for a in range(len(z)):
        assert warm.c[a] == grid[min(max(grid.index(warm.chosen[a]) + step, 0), len(grid) - 1)]
        w = warm.w[a].double().numpy()
        ours = (z[a][test] @ w[:-1] + w[-1]).argmax(axis=1)
        theirs = exact(z[a], labels, fit, warm.c[a]).predict(z[a][test])
        assert (ours == theirs).mean() >= 0.995, (step, a, (ours != theirs).sum())
    assert any(c != chosen for c, chosen in zip(warm.c, warm.chosen, strict=True))  # the step moved C


def test_other_rows_and_chosen_runs_are_searched_afresh(rows, solver_calls):
    """The memory is keyed by the rows and labels: a neighbour run on other labels (here shuffled) searches; and
    only neighbour runs read it: a chosen run of the same rows searches again (a check, e.g. at another thread
    count, is no copy)."""
    *_, x, y, is_val = rows
    first = _solve(rows, 0)
    solver_calls.clear()
    again = _solve(rows, 0)
    assert len(solver_calls) >= 1 + max(len(p) for p in again.path) and torch.equal(first.w, again.w)
    solver_calls.clear()
    shuffled = y[torch.from_numpy(np.random.default_rng(0).permutation(len(y)))]
    alone = choose_and_solve(x, shuffled, is_val, Softmax(CLASSES), StrengthGrid(step=1), Tolerances())
    assert len(solver_calls) >= 1 + max(len(p) for p in alone.path)


def test_the_memory_drops_the_oldest_search_beyond_its_limit():
    w = torch.zeros(4, 8)  # 128 bytes
    memory = strength._SearchMemory(limit=300)
    for key in (b"a", b"b", b"c"):
        memory.keep(key, strength._Search([1.0], w, [0.0], [0.0], [{}], [0]))
    assert memory.get(b"a") is None and memory.get(b"b") is not None and memory.get(b"c") is not None
