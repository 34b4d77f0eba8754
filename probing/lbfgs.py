"""Full-batch L-BFGS for the softmax probes of several anchors at once, on rows held in memory.

Mini-batch SGD gets near a probe's optimum in a few epochs and then crawls: the last stretch of a convex,
smooth objective is where a quasi-Newton method is fast (it learns the curvature the step-size cuts of SGD
only guess). So `linear:full_batch=1` hands its anchors to this solver, when the rows are resident, once an SGD
epoch lowers the objective by less than `handoff`.

Each anchor keeps its own curvature pairs, step length and stopping state; only the expensive part, the loss
and gradient over all rows, is one batched computation for every anchor still running. An anchor stops when
its largest gradient entry is at most `gtol` (scikit-learn's test), or when `PATIENCE` iterations in a row
lower its loss by less than float32 can resolve (the precision floor), or at `max_iter` (unconverged).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

ARMIJO = 1e-4  # sufficient decrease of the backtracking line search
MAX_BACKTRACKS = 20
RESOLUTION = 1e-6  # relative loss decrease float32 cannot tell from noise
PATIENCE = 3
LOGIT_BYTES = 256 * 2**20  # a row chunk's logits stay below this

Objective = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class SoftmaxObjective:
    """f(W) = mean CE(z W[:D] + W[D], y) + l2 |W[:D]|^2 / 2 for G anchors; W: [G, D+1, C], z: [G, n, D]."""

    z: torch.Tensor
    y: torch.Tensor
    num_classes: int
    l2: float

    def __call__(self, w: torch.Tensor, which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss [g] and gradient [g, D+1, C] of the anchors `which` (indices into z's first axis)."""
        z = self.z if len(which) == self.z.shape[0] else self.z.index_select(0, which)
        g, n, d = z.shape
        rows = max(256, LOGIT_BYTES // max(1, 4 * g * self.num_classes))
        loss = torch.zeros(g, dtype=torch.float64, device=z.device)
        grad = torch.zeros_like(w)
        for start in range(0, n, rows):
            zc, yc = z[:, start : start + rows], self.y[start : start + rows]
            logp = torch.log_softmax(torch.baddbmm(w[:, d:], zc, w[:, :d]), dim=-1)
            target = yc.view(1, -1, 1).expand(g, -1, 1)
            loss -= logp.gather(2, target).sum(dim=(1, 2)).double()
            p = logp.exp_()
            p.scatter_add_(2, target, torch.full(target.shape, -1.0, dtype=p.dtype, device=p.device))
            grad[:, :d].baddbmm_(zc.transpose(1, 2), p)
            grad[:, d:] += p.sum(dim=1, keepdim=True)
        grad /= n
        grad[:, :d].add_(w[:, :d], alpha=self.l2)
        loss = loss / n + 0.5 * self.l2 * w[:, :d].double().pow(2).sum(dim=(1, 2))
        return loss, grad


@dataclass
class SolverState:
    """One anchor's curvature pairs and how its solve ended."""

    s: list[torch.Tensor] = field(default_factory=list)
    y: list[torch.Tensor] = field(default_factory=list)
    rho: list[float] = field(default_factory=list)
    iterations: int = 0
    stalls: int = 0
    stop: str = ""  # "gradient" or "precision" (converged), "cap" (not)
    loss: float = float("nan")
    max_gradient: float = float("nan")


def minimise(objective: Objective, w: torch.Tensor, gtol: float, max_iter: int, memory: int = 10,
             on_evaluation: Callable[[], None] | None = None) -> tuple[torch.Tensor, list[SolverState]]:
    """Minimise every anchor's objective from `w` [G, ...]; returns the minimisers and each anchor's state.
    `on_evaluation()` hears of every batched evaluation, one pass over the rows (for a progress bar)."""
    w = w.clone()
    states = [SolverState() for _ in range(w.shape[0])]
    f, grad = objective(w, torch.arange(w.shape[0], device=w.device))
    if on_evaluation:
        on_evaluation()
    for i, st in enumerate(states):
        st.loss, st.max_gradient = float(f[i]), float(grad[i].abs().max())
        st.stop = "gradient" if st.max_gradient <= gtol else ""
    active = [i for i, st in enumerate(states) if not st.stop]
    while active:
        for i in active:
            if states[i].iterations >= max_iter:
                states[i].stop = "cap"
        active = [i for i in active if not states[i].stop]
        if not active:
            break
        dirs, slopes, steps = {}, {}, {}
        for i in active:
            st = states[i]
            d = _direction(grad[i], st)
            slope = float((grad[i] * d).sum())
            if slope >= 0:  # stale curvature: restart from the gradient
                st.s.clear(), st.y.clear(), st.rho.clear()
                d, slope = -grad[i], -float(grad[i].pow(2).sum())
            dirs[i], slopes[i] = d, slope
            steps[i] = 1.0 if st.s else min(1.0, 1.0 / max(float(grad[i].abs().sum()), 1e-12))
        pending = list(active)
        for _ in range(MAX_BACKTRACKS):
            idx = torch.tensor(pending, device=w.device)
            trial = w.index_select(0, idx) + torch.stack([steps[i] * dirs[i] for i in pending])
            f_new, g_new = objective(trial, idx)
            if on_evaluation:
                on_evaluation()
            failed = []
            for j, i in enumerate(pending):
                value = float(f_new[j])
                if value <= float(f[i]) + ARMIJO * steps[i] * slopes[i]:
                    _accept(states[i], trial[j] - w[i], g_new[j] - grad[i], float(f[i]) - value, memory)
                    w[i], grad[i], f[i] = trial[j], g_new[j], f_new[j]
                    st = states[i]
                    st.loss, st.max_gradient = value, float(g_new[j].abs().max())
                    if st.max_gradient <= gtol:
                        st.stop = "gradient"
                    elif st.stalls >= PATIENCE:
                        st.stop = "precision"
                else:
                    failed.append(i)
                    steps[i] = (_backtrack(steps[i], float(f[i]), slopes[i], value) if math.isfinite(value)
                                else 0.5 * steps[i])
            pending = failed
            if not pending:
                break
        for i in pending:  # no step lowered the loss: float32 precision reached
            states[i].stop = "precision"
            states[i].iterations += 1
        active = [i for i in active if not states[i].stop]
    return w, states


def _accept(st: SolverState, s: torch.Tensor, yv: torch.Tensor, decrease: float, memory: int) -> None:
    st.iterations += 1
    st.stalls = st.stalls + 1 if decrease <= RESOLUTION * max(abs(st.loss), 1e-12) else 0
    sy = float((s * yv).sum())
    if sy > 1e-10 * float((yv * yv).sum()):
        st.s.append(s), st.y.append(yv), st.rho.append(1.0 / sy)
        if len(st.s) > memory:
            st.s.pop(0), st.y.pop(0), st.rho.pop(0)


def _direction(grad: torch.Tensor, st: SolverState) -> torch.Tensor:
    """-H grad by the two-loop recursion over the anchor's stored pairs."""
    q = grad.clone()
    alphas = []
    for s, y, rho in zip(reversed(st.s), reversed(st.y), reversed(st.rho), strict=True):
        a = rho * float((s * q).sum())
        alphas.append(a)
        q.add_(y, alpha=-a)
    if st.s:
        q.mul_(float((st.s[-1] * st.y[-1]).sum()) / float((st.y[-1] * st.y[-1]).sum()))
    for s, y, rho, a in zip(st.s, st.y, st.rho, reversed(alphas), strict=True):
        q.add_(s, alpha=a - rho * float((y * q).sum()))
    return q.neg_()


def _backtrack(step: float, f0: float, slope: float, f1: float) -> float:
    """The minimiser of the quadratic through f0, slope and f1, kept within [0.1, 0.5] of the step."""
    denom = 2.0 * (f1 - f0 - slope * step)
    new = -slope * step * step / denom if denom > 0 else 0.5 * step
    return min(max(new, 0.1 * step), 0.5 * step)
