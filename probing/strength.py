"""A penalised probe's L2 strength chosen on held-out rows, then the probe solved at that strength to its optimum.

The families solved here (`Family`): `linear`'s softmax regression (weights pulled towards 0) and `head-probe`'s
translator read through the model's head (its map pulled towards its initialisation). scikit-learn's convention:
C is the inverse strength, the objective mean cross-entropy + |W - W0|^2 / (2 C n) (bias not penalised). C = 1 on
thousands of rows and hundreds of classes is barely regularised (the translator's unpenalised map is not even
unique: on a 64-wide anchor its D x D_head map has more directions than the data pins down, and where L-BFGS
stopped moved its predictions with the float association of its products), and a solver stopped early only looks
better than that optimum because the optimum is under-regularised; linear evaluation practice (scikit-learn's
LogisticRegressionCV, DINOv2/VISSL) chooses C on held-out rows and solves to the optimum. So:

1. The path: for every C of the grid, from the strongest penalty up, every anchor is solved on the train rows
   (float32 L-BFGS to `search_gtol`, or 0.1 x the penalty strength if smaller), warm-started from its solution
   at the previous C (so the grid costs little more than one fit), and scored on the val rows by their
   cross-entropy. An anchor leaves the path at the first grid value worse than its best (`PATH_PATIENCE`): the
   val loss of a penalty path is unimodal in practice, and the weakest penalties are the slowest to solve.
2. The choice: per anchor, the C of the lowest val loss; a larger C must beat a smaller one by a relative
   `CHOICE_MARGIN`, so two values the val rows cannot tell apart (float noise, ties) give the stronger penalty
   whatever the thread count.
3. The refit on train + val at the chosen C, from the path's solution: float32 L-BFGS to its precision floor,
   then float64 to `gtol` or 0.01 x the penalty strength if smaller (the error of the weights is at most the
   gradient over the strength), where the predictions no longer move (docs/probes.md, measured against
   scikit-learn at tol 1e-8). The val loss and accuracy recorded are the path's, on rows it did not learn from.
4. A neighbour run (`StrengthGrid.step`, `linear:C_step`) refits at the grid value `step` places from the chosen
   C, from the same start. Steps 1 and 2 are kept in this process's memory (`_SEARCHES`, keyed by a digest of the
   fit rows, labels, split, family, grid and path tolerances), so a neighbour run of rows the chosen run already
   searched skips straight to its refit: the same probe, bit for bit, as one that searches for itself. A chosen
   run always searches.

Every solve is preconditioned by the feature side of its Hessian at its start (`preconditioner`,
`probing/lbfgs.py` `RowPreconditioner`): the same optimum in a tenth of the passes where the penalty is weak.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from featstore.errors import FeatstoreError, Name
from featstore.probing import targets
from featstore.probing.lbfgs import Objective, Precondition, RowPreconditioner, SoftmaxObjective, SolverState, minimise
from featstore.schema import Int, Real, Value

PATH_PATIENCE = 1  # grid values in a row worse than the best before an anchor leaves the path (measured:
# 2 chose the same C at every anchor of the demo and cost its probes 12.6 s instead of 8.1 s)
SEARCH_RELATIVE = 0.1  # a path solve also stops no later than at max |grad| <= this x its penalty strength
REFIT_RELATIVE = 0.01  # the refit likewise: the solution is then within ~1% of the optimum in every direction
CHOICE_MARGIN = 1e-3  # relative val-loss improvement a weaker penalty needs to be chosen


@dataclass(frozen=True)
class StrengthGrid:
    """The C values searched (`per_decade` per factor of 10 from `low` to `high`, to 3 digits), or one pinned C."""

    low: float = 1e-3
    high: float = 1e2
    per_decade: int = 2
    pinned: float = 0.0  # > 0: this C, no search
    step: int = 0  # != 0: solve at the grid value this many steps from the chosen C (a neighbour run, below)

    def values(self) -> tuple[float, ...]:
        if self.pinned > 0:
            return (self.pinned,)
        steps = max(1, round(math.log10(self.high / self.low) * self.per_decade))
        return tuple(float(f"{c:.3g}") for c in np.geomspace(self.low, self.high, steps + 1))  # 31.6, not 31.62...


@dataclass(frozen=True)
class Tolerances:
    """How far each solve goes: the path's gradient test, the refit's, and the iteration cap of every solve."""

    search_gtol: float = 1e-5
    gtol: float = 1e-6
    max_iterations: int = 1000
    memory: int = 10  # L-BFGS curvature pairs per anchor


class Family(Protocol):
    """What the search needs of a penalised probe: its objective on some rows at some strength, its logits, and
    the solution its path starts from (where the penalty is centred)."""

    def objective(self, x: torch.Tensor, y: torch.Tensor, l2: float | torch.Tensor,
                  dtype: torch.dtype = torch.float32) -> Objective: ...

    def logits(self, x: torch.Tensor, w: torch.Tensor, a: int) -> torch.Tensor:
        """Anchor a's logits [m, C] on rows x [m, D] for its solution w [D+1, K]."""
        ...

    def start(self, x: torch.Tensor) -> torch.Tensor:
        """[G, D+1, K] float32, for the rows x [G, n, D]."""
        ...

    def row_curvature(self, x: torch.Tensor, w: torch.Tensor, a: int) -> torch.Tensor:
        """[m] float64: per row of x [m, D], the mean eigenvalue of the loss's Hessian in the solution's columns
        at anchor a's solution w [D+1, K] (`RowPreconditioner`)."""
        ...


@dataclass(frozen=True)
class Softmax:
    """`linear`'s family: softmax regression over `num_classes`, weights pulled towards 0."""

    num_classes: int

    def objective(self, x, y, l2, dtype=torch.float32) -> SoftmaxObjective:
        return SoftmaxObjective(x, y, self.num_classes, l2, dtype)

    def logits(self, x, w, a):
        d = x.shape[1]
        return torch.addmm(w[d:], x, w[:d])

    def start(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], x.shape[2] + 1, self.num_classes, device=x.device)

    def row_curvature(self, x, w, a):
        p = torch.softmax(self.logits(x, w, a).double(), dim=-1)  # trace(diag p - p p^T) over the K classes
        return (1 - p.pow(2).sum(dim=1)) / p.shape[1]


def strength_parameters(penalty: str, solve: str = "") -> dict[str, Value]:
    """The search's parameters, declared once for every family that uses it: `penalty` names what C scales
    (e.g. "|W|^2"), `solve` prefixes the solver's helps (e.g. "full_batch: ")."""
    return {
        "C": Real(StrengthGrid.pinned, gt=0, also=(0,),
                  help=f"L2 strength, scikit-learn's C (penalty {penalty} / 2CN); 0: chosen per anchor on the val rows "
                       f"from C_low..C_high"),
        "C_low": Real(StrengthGrid.low, gt=0, help="the searched grid's smallest C (strongest penalty)"),
        "C_high": Real(StrengthGrid.high, gt=0, help="the searched grid's largest C"),
        "C_per_decade": Int(StrengthGrid.per_decade, ge=1, le=10,
                            help="grid values per factor of 10 (2: 1e-3, 3.2e-3, 1e-2, ...)"),
        "search_gtol": Real(Tolerances.search_gtol, gt=0,
                            help=f"{solve}the C path's gradient test (train rows, float32)"),
        "gtol": Real(Tolerances.gtol, gt=0, help=f"{solve}largest gradient entry at which the refit stops"),
        "max_iterations": Int(Tolerances.max_iterations, ge=1,
                              help=f"{solve}L-BFGS iterations of each solve at most"),
    }


def check_grid(params: dict) -> None:
    if params["C_low"] > params["C_high"]:
        raise ValueError(f"C_low={params['C_low']:g} exceeds C_high={params['C_high']:g}; give C_low <= C_high")


def grid_of(params: dict) -> StrengthGrid:
    return StrengthGrid(params["C_low"], params["C_high"], params["C_per_decade"], params["C"],
                        params.get("C_step", 0))  # a family without the parameter solves at the chosen C


def tolerances_of(params: dict) -> Tolerances:
    memory = params.get("memory", Tolerances.memory)  # a family without the parameter keeps the default
    return Tolerances(params["search_gtol"], params["gtol"], params["max_iterations"], memory)


@dataclass
class Solved:
    """Every anchor's solution [G, D+1, C] (float32) at its chosen C, with what the choice and the solve saw."""

    w: torch.Tensor
    c: list[float]
    val_loss: list[float]  # on the val rows, of the path's solution at the chosen C (held out)
    val_accuracy: list[float]
    path: list[dict[str, float]]  # per anchor, C -> val loss, for every C it was solved at
    states: list[SolverState]  # the refit's last solve
    passes: list[int]  # passes over rows, path and refit
    precision: list[str] = field(default_factory=list)  # the refit's last solve: float32 or float64
    gtol: float = math.nan  # the refit's gradient test
    chosen: list[float] = field(default_factory=list)  # per anchor, the C the val rows chose (c: that C moved by
    # the grid's `step`, clamped to the grid; the same as `c` without a step)


def choose_and_solve(x: torch.Tensor, y: torch.Tensor, is_val: torch.Tensor, family: Family, grid: StrengthGrid,
                     tol: Tolerances, on_pass: Callable[[], None] | None = None) -> Solved:
    """x: [G, n, D] prepared fit rows, y: [n] labels or [n, C] target distributions, is_val: [n] which rows are
    val rows (the path learns from the others and is scored on these; the refit learns from all)."""
    n_train = int((~is_val).sum())
    if bool(is_val[:n_train].any()):  # train rows first, as the path reads them (views, no copy)
        order = torch.argsort(is_val.to(torch.int8), stable=True)
        x, y = x.index_select(1, order), y[order]
    g, n, _ = x.shape
    n_val = n - n_train
    cs = grid.values()
    if n_val == 0 and len(cs) > 1:
        raise FeatstoreError(f"no val rows to choose the probe's L2 strength on ({n} fit rows); raise ",
                             Name("val_frac"), ", "
                             "or pin it with C=1 (e.g. ", Name("variant", "linear:C=1"), ")")
    key = _search_key(x, y, n_train, family, grid, tol)
    # only a neighbour run reads the memory: a chosen run always searches (a second one in this process, e.g. at
    # another thread count, is a check of the search, not a copy of it)
    search = _SEARCHES.get(key) if key is not None and grid.step else None
    if search is None:
        search = _search(x, y, n_train, family, cs, tol, on_pass)
        if key is not None:
            _SEARCHES.keep(key, search)
    chosen, path = list(search.chosen), [dict(p) for p in search.path]
    val_loss, val_acc, passes = list(search.val_loss), list(search.val_accuracy), list(search.passes)
    solved_at = [_stepped(cs, c, grid.step) for c in chosen]
    if grid.step:  # a neighbour of the choice: its held-out figures are those of no chosen probe
        val_loss = [path[a].get(format(solved_at[a], "g"), math.nan) for a in range(g)]
        val_acc = [math.nan] * g
    l2 = torch.tensor([1.0 / (c * n) for c in solved_at], dtype=torch.float64, device=x.device)
    # one gradient test for the group: the tightest anchor's (the others only get closer to their optimum)
    gtol = min(tol.gtol, REFIT_RELATIVE * float(l2.min()))
    start = search.w.to(x.device, copy=True)
    precondition = preconditioner(family, x, start, l2)
    w32, states = minimise(family.objective(x, y, l2), start, gtol, tol.max_iterations, tol.memory,
                           on_evaluation=on_pass, precondition=precondition)
    precision = ["float32"] * g
    rest = [a for a in range(g) if states[a].stop != "gradient"]
    if rest:  # float32's floor: finish in float64
        idx = torch.tensor(rest, device=x.device)
        objective = family.objective(x, y, l2, dtype=torch.float64)
        w64, finals = _minimise_subset(objective, w32.double(), idx, gtol, tol, on_pass,
                                       lambda q, j: precondition(q, rest[j]))
        w32[idx] = w64.float()
        for j, a in enumerate(rest):
            finals[j].evaluations += states[a].evaluations
            states[a], precision[a] = finals[j], "float64"
    for a in range(g):
        passes[a] += states[a].evaluations
    return Solved(w32, solved_at, val_loss, val_acc, path, states, passes, precision, gtol, chosen)


@dataclass(frozen=True)
class _Search:
    """What the path and the choice found for one set of fit rows (steps 1 and 2): per anchor the chosen C, the
    path's solution there on the train rows ([G, D+1, K] on the CPU, where every refit starts), the held-out
    figures there, the val loss of every C solved, and the passes over the rows the path made."""

    chosen: list[float]
    w: torch.Tensor
    val_loss: list[float]
    val_accuracy: list[float]
    path: list[dict[str, float]]
    passes: list[int]


SEARCH_MEMORY_BYTES = 512 * 2**20  # solutions kept for later runs in this process at most (oldest dropped first)


class _SearchMemory:
    """The searches of this process, keyed by a digest of everything a search reads (`_search_key`): a neighbour
    run (`C_step`) of rows the chosen run searched refits from that search instead of solving the path again. A
    search is a function of its key (every figure it keeps is computed from the keyed inputs alone), so a run's
    results are the same whether or not another run searched first; only its time differs."""

    def __init__(self, limit: int = SEARCH_MEMORY_BYTES) -> None:
        self.limit, self.kept = limit, OrderedDict[bytes, _Search]()

    def get(self, key: bytes) -> _Search | None:
        found = self.kept.get(key)
        if found is not None:
            self.kept.move_to_end(key)
        return found

    def keep(self, key: bytes, search: _Search) -> None:
        self.kept[key] = search
        while self.kept and sum(_bytes(s.w) for s in self.kept.values()) > self.limit:
            self.kept.popitem(last=False)

    def clear(self) -> None:
        self.kept.clear()


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


_SEARCHES = _SearchMemory()


def _search_key(x: torch.Tensor, y: torch.Tensor, n_train: int, family: Family, grid: StrengthGrid,
                tol: Tolerances) -> bytes | None:
    """A digest of the fit rows, their labels and split, the family, the grid (not its step) and the path's
    tolerances: the inputs of a search. None for families other than `Softmax`, the only one with neighbour
    runs (another's parameters may be tensors, which a digest of their repr would not tell apart)."""
    if type(family) is not Softmax:
        return None
    digest = hashlib.blake2b(digest_size=32)
    search_grid = StrengthGrid(grid.low, grid.high, grid.per_decade, grid.pinned)
    digest.update(repr((family, search_grid, tol.search_gtol, tol.max_iterations, tol.memory, n_train,
                        tuple(x.shape), str(x.dtype), tuple(y.shape), str(y.dtype), str(x.device))).encode())
    for t in (x, y):
        digest.update(t.detach().contiguous().cpu().numpy().view(np.uint8).reshape(-1).data)
    return digest.digest()


def _search(x: torch.Tensor, y: torch.Tensor, n_train: int, family: Family, cs: tuple[float, ...],
            tol: Tolerances, on_pass: Callable[[], None] | None) -> _Search:
    """Steps 1 and 2 on rows ordered train first: the path over the grid `cs` and each anchor's choice."""
    g, n, _ = x.shape
    n_val = n - n_train
    w = family.start(x)
    best_w = w.clone()
    best_loss = [math.inf] * g
    chosen = [cs[0]] * g
    val_loss, val_acc = [math.nan] * g, [math.nan] * g
    path: list[dict[str, float]] = [{} for _ in range(g)]
    worse = [0] * g
    passes = [0] * g
    active = list(range(g))
    train, val = x[:, :n_train], x[:, n_train:]
    floor = targets.entropy(y[n_train:])  # the margin is on the KL, the part of the val loss a probe can change
    for c in cs if n_val else ():
        idx = torch.tensor(active, device=x.device)
        l2 = 1.0 / (c * n_train)
        objective = family.objective(train, y[:n_train], l2)
        # warm-started, the previous solution already meets an absolute test when the penalty changes little in
        # absolute terms (l2 w): the test scales with the penalty, or weak penalties would all look alike
        gtol = min(tol.search_gtol, SEARCH_RELATIVE * l2)
        # preconditioned at the warm start, the rows weighted by their curvature there (`RowPreconditioner`); not
        # the first C's solve, whose start (the family's) says little of the curvature at its solution
        strength = torch.full((len(active),), l2, dtype=torch.float64)
        precondition = None if c == cs[0] else preconditioner(family, train.index_select(0, idx),
                                                               w.index_select(0, idx), strength)
        solved, states = _minimise_subset(objective, w, idx, gtol, tol, on_pass, precondition)
        w[idx] = solved
        losses, accs = _scores(family, val, y[n_train:], w, idx)
        for j, a in enumerate(active):
            passes[a] += states[j].evaluations
            path[a][format(c, "g")] = losses[j]
            if losses[j] - floor < (best_loss[a] - floor) * (1 - CHOICE_MARGIN) or not math.isfinite(best_loss[a]):
                best_loss[a], chosen[a], val_loss[a], val_acc[a], worse[a] = losses[j], c, losses[j], accs[j], 0
                best_w[a] = w[a]
            else:
                worse[a] += 1
        active = [a for a in active if worse[a] < PATH_PATIENCE]
        if not active:
            break
    return _Search(chosen, best_w.cpu(), val_loss, val_acc, path, passes)  # kept in host memory


def _stepped(grid: tuple[float, ...], chosen: float, step: int) -> float:
    """The grid value `step` places from `chosen` (negative: stronger penalties), clamped to the grid's ends: the
    C a neighbour run solves at. The refit starts from the path's solution at the chosen C and is solved to the
    neighbour's optimum, so where it starts does not move its predictions."""
    return grid[min(max(grid.index(chosen) + step, 0), len(grid) - 1)]


def preconditioner(family: Family, x: torch.Tensor, w: torch.Tensor, l2: torch.Tensor) -> RowPreconditioner:
    """The refit's `RowPreconditioner` for the rows x [G, n, D], at its start w [G, D+1, K] and strengths l2 [G]."""
    weights = torch.stack([family.row_curvature(x[a], w[a], a) for a in range(x.shape[0])])
    return RowPreconditioner.at(x, weights, l2)


def _minimise_subset(objective, w: torch.Tensor, idx: torch.Tensor, gtol: float, tol: Tolerances,
                     on_pass: Callable[[], None] | None, precondition: Precondition | None = None
                     ) -> tuple[torch.Tensor, list[SolverState]]:
    """Minimise the anchors `idx` of an objective over every anchor: their rows are read as views, not copied.
    `precondition` takes the anchors by their place in `idx`."""
    if len(idx) == objective.z.shape[0]:
        return minimise(objective, w, gtol, tol.max_iterations, tol.memory, on_evaluation=on_pass,
                        precondition=precondition)
    mapped = _Subset(objective, idx)
    return minimise(mapped, w.index_select(0, idx), gtol, tol.max_iterations, tol.memory, on_evaluation=on_pass,
                    precondition=precondition)


@dataclass
class _Subset:
    """The objective of some anchors of a larger one, indexed from 0 as `minimise` indexes them."""

    objective: Objective
    idx: torch.Tensor

    def __call__(self, w: torch.Tensor, which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.objective(w, self.idx.index_select(0, which))


def _scores(family: Family, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
            idx: torch.Tensor) -> tuple[list[float], list[float]]:
    """Cross-entropy (float64 sums) and accuracy on rows x [G, m, D] of the anchors `idx`."""
    hard = targets.hard(y)
    losses, accs = [], []
    for a in idx.tolist():
        logits = family.logits(x[a], w[a], a)
        losses.append(float(targets.nll(torch.log_softmax(logits.double(), dim=-1)[None], y).mean()))
        accs.append(float((logits.argmax(dim=-1) == hard).double().mean()))
    return [loss if math.isfinite(loss) else math.inf for loss in losses], accs
