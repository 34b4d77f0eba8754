"""`linear` (default): a multinomial logistic regression per anchor, at an L2 strength chosen on held-out rows and
solved to its optimum, so that its predictions are those of the objective and not of where a solver stopped.

The objective is scikit-learn's LogisticRegression(C) on standardised features: mean cross-entropy plus
|w|^2 / (2 C N) over the N rows it learns from (bias not penalised). All anchors of one width are fitted at once
(weights stacked as [G, D, C], one batched matmul serves them all).

- Rows in memory (the usual case, `full_batch=1`): `probing/strength.py` solves every anchor along a grid of C on
  the train rows (warm-started, float32 L-BFGS to `search_gtol`), chooses each anchor's C by its val loss, refits
  on train + val at that C and solves to `gtol` (float64 at the end), where the predictions no longer move: they
  equal scikit-learn's at tol 1e-8 and do not depend on the thread count (docs/probes.md). `linear:C=1` pins the
  strength and skips the search; `linear:C_step=±1` (a neighbour run) refits at the grid value next to the chosen
  C, from the search of the same rows kept in this process when one ran (the same probe either way).
  `probe_fits.info` records the chosen "C", the val loss of every C tried, and the solver's end; `val_accuracy`
  is the path's at the chosen C, on val rows it did not learn from. A class with no fit row (ten ImageNet
  classes under a 1,000-way head) is left out of the solve, its bias -inf: the limit the full objective only
  tends to (`classes_with_rows`); the info counts them as "classes_without_rows".
- Rows streamed from the store (more than `--memory-budget`), or `full_batch=0`: mini-batch SGD with momentum at
  the pinned C (C = 1 when none is pinned: there is no search). Pooled activations are often strongly correlated
  (top eigenvalue of the standardised covariance tens of times the mean), and SGD then crawls along all other
  directions, so such anchors are fitted on z = x P with P = (C/mean + I)^(-1/2) from the sample covariance; the
  penalty then applies to the weights of the preconditioned features. Step sizes are dimensionless learning rates
  divided by the top eigenvalue of the (preconditioned) covariance (power iteration), so one grid fits every
  width. The first epoch trains one head per candidate rate on the train rows; the val loss picks one, and only
  that head trains on, from then on from the val rows too (so its val accuracy is in-sample: recorded as
  `in_sample_val_accuracy` in the info, not as `val_accuracy`). After each epoch the objective is compared with
  the previous epoch's: a relative decrease below `tol` is a plateau and a rise means the step is too large;
  either divides the step size by `decay`, and a plateau after `decays` such cuts means converged. `max_epochs`
  is the cap; a probe stopped by it is reported unconverged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from featstore.errors import FeatstoreError, Name
from featstore.probing import targets
from featstore.probing.base import AnchorContext, LinearFit, Plan, ProbeGroup, ProbeVariant, register
from featstore.probing.strength import (
    Softmax,
    StrengthGrid,
    Tolerances,
    check_grid,
    choose_and_solve,
    grid_of,
    strength_parameters,
    tolerances_of,
)
from featstore.schema import Int, Real

PRECONDITION_ABOVE = 8.0  # top eigenvalue / mean eigenvalue beyond which an anchor is preconditioned
MIN_STEPS = 24  # mini-batches per epoch at least (smaller batches on small sets)
MAX_C_STEP = 3  # grid steps a neighbour run may move from the chosen C (docs/design.md §5, "Robustness")


def spectrum_preconditioner(xs: torch.Tensor) -> torch.Tensor:
    """P = U diag((lam/mean + 1)^-1/2) U^T from the covariance of standardised rows `xs`."""
    centred = xs - xs.mean(dim=0)
    cov = (centred.T @ centred).double() / max(1, len(xs) - 1)
    lam, u = torch.linalg.eigh(cov)
    lam = lam.clamp_min(0)
    scale = (lam / lam.mean().clamp_min(1e-12) + 1.0).rsqrt()
    return ((u * scale) @ u.T).to(xs.dtype)


def top_eigenvalue(x: torch.Tensor, iterations: int = 20, seed: int = 0) -> float:
    """Largest eigenvalue of x.T x / n by power iteration."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(x.shape[1], generator=gen).to(x.device, x.dtype)
    for _ in range(iterations):
        v = x.T @ (x @ v)
        v = v / v.norm().clamp_min(1e-30)
    return max(float((x @ v).pow(2).mean()), 1e-6)


MAX_RATES = 16  # candidate learning rates (one head each in the first epoch) at most


def candidate_rates(low: float, high: float, ratio: float = 4.0) -> tuple[float, ...]:
    """Dimensionless learning rates low, low*ratio, ... up to high (inclusive)."""
    if not (0 < low <= high and ratio > 1 and math.isfinite(high)):
        raise ValueError(f"candidate rates need 0 < low <= high and ratio > 1 (got {low}, {high}, {ratio})")
    rates = [low]
    while rates[-1] * ratio <= high * (1 + 1e-9):
        rates.append(rates[-1] * ratio)
    return tuple(rates)


def classes_with_rows(y: torch.Tensor, num_classes: int) -> torch.Tensor | None:
    """The classes hard labels `y` name, sorted, where some of the `num_classes` have no row (None where every
    class has one, and for target distributions). The objective has no optimum then: it only tends to its infimum
    as an absent class's bias goes to -inf, which L-BFGS chases to its iteration cap (a 1,000-way probe on ten
    ImageNet classes). The solve is that limit instead: over the classes present, as scikit-learn's, which knows
    only the classes in y."""
    if y.dim() != 1:
        return None
    present = torch.unique(y)
    return None if len(present) == num_classes else present


@register
class Linear(ProbeVariant):
    name = "linear"
    parameters = {
        "max_epochs": Int(200, ge=1, help="epoch cap; a probe stopped by it is reported unconverged"),
        "batch_size": Int(1024, ge=1, help="largest mini-batch (smaller on small sets, see MIN_STEPS)"),
        "lr_low": Real(0.5, gt=0, help="smallest candidate learning rate (times 1 / top eigenvalue)"),
        "lr_high": Real(32.0, gt=0, help="largest candidate learning rate; candidates are lr_low * 4^i"),
        "momentum": Real(0.9, ge=0, lt=1),
        "tol": Real(0.002, gt=0, lt=1, help="relative decrease of the objective below which an epoch is a plateau"),
        "decay": Real(4.0, gt=1, help="step-size divisor at a plateau or a rise"),
        "decays": Int(3, ge=0, help="step-size cuts before a plateau means converged"),
        "full_batch": Int(1, ge=0, le=1, help="1: full-batch L-BFGS on resident rows; 0: SGD throughout"),
        **strength_parameters("|W|^2", solve="full_batch: "),
        "C_step": Int(StrengthGrid.step, ge=-MAX_C_STEP, le=MAX_C_STEP,
                      help="a neighbour run: solve each anchor at the grid value this many steps from the C its "
                           "val rows choose (-1: the next stronger penalty; clamped to the grid)"),
    }

    @classmethod
    def relations(cls, params: dict) -> None:
        check_grid(params)
        if params["C_step"] and (params["C"] or not params["full_batch"]):
            given = f"C={params['C']:g}" if params["C"] else "full_batch=0"
            raise ValueError(f"C_step={params['C_step']} steps from the C the search chooses; it needs the search "
                             f"(C=0 and full_batch=1, not {given})")
        low, high = params["lr_low"], params["lr_high"]
        if low > high:
            raise ValueError(f"lr_low={low:g} exceeds lr_high={high:g}; give lr_low <= lr_high")
        if len(candidate_rates(low, high)) > MAX_RATES:
            raise ValueError(f"lr_low={low:g} to lr_high={high:g} spans {len(candidate_rates(low, high))} candidate "
                             f"rates (one head each); at most {MAX_RATES} (lr_high / lr_low <= 4^{MAX_RATES - 1})")

    def plan(self, n_fit: int) -> Plan:
        """Batches small enough for `MIN_STEPS` steps per epoch: small sets still get many updates between the
        convergence checks."""
        batch = min(self.params["batch_size"], max(16, -(-n_fit // MIN_STEPS)))
        return Plan(max_epochs=self.params["max_epochs"], batch_size=batch, train_on_val=True)

    def batches_anchors(self) -> bool:
        return True

    def make_group(self, ctxs) -> ProbeGroup:
        p = self.params
        return LinearGroup(ctxs, candidate_rates(p["lr_low"], p["lr_high"]), p["momentum"], p["tol"], p["decay"],
                           p["decays"], FullBatch(bool(p["full_batch"]), grid_of(p), tolerances_of(p)))


@dataclass(frozen=True)
class FullBatch:
    """The full-batch solve on resident rows: on or off, the C it searches (or pins) and how tightly it solves."""

    on: bool = True
    grid: StrengthGrid = StrengthGrid()
    tol: Tolerances = Tolerances()


class LinearGroup(ProbeGroup):
    """G anchors of width D, each with K heads of C classes, as [G, D, K*C] weights. With resident rows and
    `full_batch`, `finish` chooses C and solves every anchor before any SGD epoch (K = 1). Otherwise SGD: in
    the first epoch there is a head per candidate learning rate, learning from the train rows only; from the
    second, K = 1: the chosen head, which then learns from the val rows too."""

    def __init__(self, ctxs, lrs: tuple[float, ...], momentum: float, tol: float, decay: float, decays: int,
                 full_batch: FullBatch = FullBatch()):
        ctx0: AnchorContext = ctxs[0]
        self.full_batch = full_batch
        self.solver: dict[int, dict] = {}
        self.c, dev = ctx0.num_classes, ctx0.device
        self.anchors = [ctx.anchor for ctx in ctxs]
        self.lrs, self.momentum, self.tol, self.decay, self.decays = lrs, momentum, tol, decay, decays
        self.solves = full_batch.on and ctx0.resident  # `finish` will solve: no SGD, so no preconditioning
        if full_batch.grid.step and not self.solves:
            raise FeatstoreError(f"linear:C_step={full_batch.grid.step} needs the C search, which needs the fit rows "
                                 f"in memory; raise ", Name("memory_budget"),
                                 " (these rows are streamed from the store)")
        self.sgd_c = full_batch.grid.pinned or 1.0  # SGD has no search: the pinned C, or scikit-learn's default
        self.wd = 1.0 / (self.sgd_c * ctx0.n_fit)  # on the rows the final probe learns from
        self.held_out: dict[int, tuple[float, float]] = {}  # anchor -> val loss and accuracy, rows not learnt from
        stds, means, samples, lams, self.preconditioned = [], [], [], [], {}
        for ctx in ctxs:
            mean, std = ctx.stats.mean.to(dev), ctx.stats.std.to(dev)
            sample = (ctx.stats.sample.to(dev) - mean) / std
            lam = top_eigenvalue(sample, seed=ctx.seed)
            self.preconditioned[ctx.anchor] = not self.solves and lam > PRECONDITION_ABOVE and len(sample) > 1
            stds.append(std), means.append(mean), samples.append(sample), lams.append(lam)
        # z = x @ transform + offset: standardisation (and preconditioning). Without any preconditioned anchor the
        # transform is diagonal, kept as [G, 1, D] and applied elementwise: a dense [D, D] product over every row
        # would cost more than the whole solve on wide anchors
        self.diagonal = not any(self.preconditioned.values())
        transforms, offsets = [], []
        for i, ctx in enumerate(ctxs):
            mean, std = means[i], stds[i]
            if self.diagonal:
                transforms.append((1.0 / std)[None])
                offsets.append(-(mean / std))
                continue
            p = torch.eye(ctx.dim, device=dev)
            if self.preconditioned[ctx.anchor]:
                p = spectrum_preconditioner(samples[i])
                lams[i] = top_eigenvalue(samples[i] @ p, seed=ctx.seed)
            transforms.append(p / std[:, None])
            offsets.append(-(mean / std) @ p)
        self.transform = torch.stack(transforms)  # [G, D, D], or [G, 1, D] when diagonal
        self.offset = torch.stack(offsets)[:, None, :]  # [G, 1, D]
        lam = torch.tensor(lams, device=dev)
        g, d, k = len(ctxs), ctx0.dim, len(lrs)
        self.lr = (torch.tensor(lrs, device=dev)[None, :] / lam[:, None]).repeat_interleave(self.c, dim=1)[:, None]
        self.w = torch.zeros(g, d, k * self.c, device=dev)
        self.b = torch.zeros(g, 1, k * self.c, device=dev)
        self.vw, self.vb = torch.zeros_like(self.w), torch.zeros_like(self.b)
        self.loss_sum = torch.zeros(g, k, device=dev, dtype=torch.float64)
        self.rows_seen = torch.zeros((), device=dev, dtype=torch.float64)
        self.chosen: list[int] | None = None  # per anchor, the index of the chosen learning rate
        self.history: dict[int, list[float]] = {a: [] for a in self.anchors}
        self.cuts = dict.fromkeys(self.anchors, 0)
        self.epochs = dict.fromkeys(self.anchors, 0)
        self.selection: dict[int, dict] = {}
        self.done: dict[int, tuple] = {}

    @property
    def heads(self) -> int:
        return self.w.shape[2] // self.c

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """z = x @ transform + offset: standardisation (and preconditioning)."""
        if self.diagonal:
            return torch.addcmul(self.offset, x, self.transform)
        return torch.baddbmm(self.offset, x, self.transform)

    def step(self, x, y, is_val, report=False):
        z = x
        g, n, k = z.shape[0], z.shape[1], self.heads
        p = torch.softmax(torch.baddbmm(self.b, z, self.w).view(g, n, k, self.c), dim=-1)
        nll = targets.nll_of(p, y)  # [G, n, K]
        learns = torch.ones(n, device=z.device, dtype=z.dtype) if self.chosen else (~is_val).to(z.dtype)
        self.loss_sum += (nll * learns[None, :, None]).sum(dim=1).double()
        self.rows_seen += learns.sum().double()
        stats = None
        if report:
            stats = (nll[-1, :, -1].mean(), (p[-1, :, -1].argmax(dim=-1) == targets.hard(y)).float().mean())
        targets.subtract_(p, y)  # softmax - target
        p.mul_((learns / n)[None, :, None, None])
        grad = p.view(g, n, k * self.c)
        self.vw.baddbmm_(z.transpose(1, 2), grad, beta=self.momentum).add_(self.w, alpha=self.wd)
        self.vb.mul_(self.momentum).add_(grad.sum(dim=1, keepdim=True))
        self.w.addcmul_(self.vw, self.lr, value=-1.0)
        self.b.addcmul_(self.vb, self.lr, value=-1.0)
        return stats

    def _objective(self) -> torch.Tensor:
        """[G, K]: mean loss over this epoch's batches plus each head's penalty."""
        g, k = self.w.shape[0], self.heads
        penalty = 0.5 * self.wd * self.w.pow(2).view(g, -1, k, self.c).sum(dim=(1, 3))
        return (self.loss_sum / self.rows_seen.clamp_min(1)).float() + penalty

    def end_epoch(self, epoch, val_x, val_y) -> None:
        objective = self._objective()
        self.loss_sum.zero_()
        self.rows_seen.zero_()
        for a in self.anchors:
            self.epochs[a] += 1
        if self.chosen is None:
            self._select(val_x, val_y)
            return
        stop = []
        for i, a in enumerate(self.anchors):
            value, previous = float(objective[i, 0]), self.history[a][-1] if self.history[a] else float("inf")
            self.history[a].append(value)
            gain = (previous - value) / max(abs(value), 1e-12)
            if gain >= self.tol:
                continue  # still descending
            if gain >= 0 and self.cuts[a] >= self.decays:
                stop.append(i)  # a plateau at the smallest step size: converged
            else:  # a plateau, or a rise (the step is too large): smaller steps
                self.cuts[a] += 1
                self.lr[i] /= self.decay
        for i in sorted(stop, reverse=True):
            self._retire(i, converged=True)

    def ready_to_finish(self) -> bool:
        """Before the first SGD epoch, when the rows are resident and the full-batch solve is on."""
        return self.resident and self.full_batch.on and self.chosen is None and bool(self.anchors)

    def finish(self, x, y, is_val, on_pass=None) -> None:
        """Choose C on the val rows and solve every anchor of the group at it (`probing/strength.py`); the anchors
        retire, converged unless an iteration cap stopped them."""
        g, d = self.w.shape[0], self.w.shape[1]
        self.chosen = [-1] * g  # no learning rate: one head, solved
        present = classes_with_rows(y, self.c)
        fit_y = y if present is None else torch.searchsorted(present, y)
        solved = choose_and_solve(x, fit_y, is_val, Softmax(self.c if present is None else len(present)),
                                  self.full_batch.grid, self.full_batch.tol, on_pass)
        if present is not None:  # the limit of the full objective: an absent class's logit is -inf, never predicted
            full = torch.zeros(g, d + 1, self.c, device=solved.w.device)
            full[:, d] = -math.inf
            full[:, :, present] = solved.w
            solved.w = full
        self.w, self.b = solved.w[:, :d].contiguous(), solved.w[:, d:].contiguous()
        self.vw, self.vb, self.lr = torch.zeros_like(self.w), torch.zeros_like(self.b), self.lr[:, :, : self.c]
        self.loss_sum = self.loss_sum[:, :1].clone()
        for i, (a, st) in enumerate(zip(self.anchors, solved.states, strict=True)):
            self.epochs[a] = solved.passes[i]  # passes over the rows, path and refit
            self.history[a].append(st.loss)
            self.held_out[a] = (solved.val_loss[i], solved.val_accuracy[i])
            self.solver[a] = {"solver": "lbfgs", "cap": "max_iterations", "C": solved.c[i],
                              **({"C_chosen": solved.chosen[i]} if self.full_batch.grid.step else {}),
                              "C_chosen_on": "pinned" if self.full_batch.grid.pinned else "val loss",
                              "val_loss_per_C": solved.path[i], "lbfgs_iterations": st.iterations,
                              "lbfgs_stop": st.stop, "max_gradient": st.max_gradient, "gtol": solved.gtol,
                              "precision": solved.precision[i],
                              "classes_without_rows": 0 if present is None else self.c - len(present)}
        for i in reversed(range(g)):
            self._retire(i, converged=solved.states[i].converged(solved.gtol))

    def _select(self, val_x, val_y) -> None:
        """Pick each anchor's learning rate by its head's val loss; keep only that head."""
        xv = torch.stack([val_x[a] for a in self.anchors])
        g, n, k = xv.shape[0], xv.shape[1], self.heads
        logits = torch.baddbmm(self.b, self.prepare(xv), self.w).view(g, n, k, self.c)
        loss = targets.nll(torch.log_softmax(logits, dim=-1), val_y).mean(dim=1)
        acc = (logits.argmax(dim=-1) == targets.hard(val_y).view(1, n, 1)).float().mean(dim=1)
        loss = torch.nan_to_num(loss, nan=float("inf"))  # a diverged head is never chosen
        self.chosen = [int(i) for i in loss.argmin(dim=1)]
        for i, a in enumerate(self.anchors):
            self.selection[a] = {"val_loss_per_lr": dict(zip(map(str, self.lrs), map(float, loss[i]), strict=True)),
                                 "val_accuracy_per_lr": dict(zip(map(str, self.lrs), map(float, acc[i]),
                                                                 strict=True))}
        cols = torch.stack([torch.arange(self.c, device=self.w.device) + i * self.c for i in self.chosen])[:, None]
        for name in ("w", "vw"):
            tensor = getattr(self, name)
            setattr(self, name, tensor.gather(2, cols.expand(-1, tensor.shape[1], -1)).contiguous())
        for name in ("b", "vb", "lr"):
            setattr(self, name, getattr(self, name).gather(2, cols).contiguous())
        self.loss_sum = self.loss_sum[:, :1].clone()

    def _retire(self, i: int, converged: bool) -> None:
        """Move anchor i out of the stack (it trains no more)."""
        a = self.anchors.pop(i)
        self.done[a] = (self.w[i].clone(), self.b[i, 0].clone(), self.transform[i], self.offset[i, 0], converged,
                        self.history[a][-1] if self.history[a] else float("nan"), self.chosen[i])
        keep = [j for j in range(len(self.anchors) + 1) if j != i]
        for name in ("w", "b", "vw", "vb", "lr", "transform", "offset", "loss_sum"):
            setattr(self, name, getattr(self, name)[keep].contiguous())
        self.chosen.pop(i)

    def fitted(self, val_x, val_y) -> dict[int, LinearFit]:
        if self.chosen is None:  # capped before the first epoch ended: select now
            self._select(val_x, val_y)
        while self.anchors:
            self._retire(0, converged=False)
        out = {}
        for a, (w, b, transform, offset, converged, train_loss, chosen) in self.done.items():
            # raw space: z W + b = x (T W) + (offset W + b)
            weight = transform.T * w if self.diagonal else transform @ w
            bias = b + offset @ w
            info = {"lr": self.lrs[chosen] if chosen >= 0 else None, "preconditioned": self.preconditioned[a],
                    "lr_cuts": self.cuts[a], "C": self.sgd_c,
                    "objective_history": self.history[a], **self.selection.get(a, {}), **self.solver.get(a, {})}
            if a in self.held_out:
                val_loss, val_accuracy = self.held_out[a]
            else:  # SGD learnt from the val rows too: their accuracy is no held-out figure
                logits = val_x[a] @ weight + bias
                info["in_sample_val_accuracy"] = float((logits.argmax(dim=-1) == targets.hard(val_y)).float().mean())
                val_loss, val_accuracy = float(torch.nn.functional.cross_entropy(logits, val_y)), float("nan")
            out[a] = LinearFit(weight.T.contiguous(), bias.contiguous(), info=info, epochs=self.epochs[a],
                               converged=converged, train_loss=train_loss, val_loss=val_loss,
                               val_accuracy=val_accuracy)
        return out
