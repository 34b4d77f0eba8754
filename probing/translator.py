"""`head-probe` (`--variant lens` runs it too, with a warning): a linear probe per anchor read through the model's own
frozen head, trained on KL to the head's output. It is no tuned lens (Belrose et al., "Eliciting Latent Predictions
from Transformers with the Tuned Lens", 2023; that is `tuned-lens`, `probing/tuned_lens.py`): its regulariser is a
penalty in the head's Fisher metric at a strength chosen on the val rows (theirs: SGD towards the identity with
weight decay), and on anchors narrower or wider than the head's input it has no identity to start from.

- The map: per anchor, an affine map into the head's input space, u = A h + b (A: [D_head, D]), read by the
  head: logits = W_head u + b_head. W_head, b_head are the classifier's weights, kept in the store by
  `featstore build` (`FeatureStore.read_head`); a store built before they were kept is refused in one line (rerun
  the same build to add them, or use `lens-direct`). Nothing reruns the network.
- The objective: KL(head || lens), mean over the fit rows, with the head's softmax over the stored logits of
  the training view as the target distribution (as the tuned lens trains on the final layer's distribution), plus
  the map's move from its initialisation A0 in the head's Fisher metric at the train rows' marginal prediction
  (`head_basis`), |V|^2 / (2 C n) with A = A0 + V basis^T: the change of the logits the map makes is penalised,
  whatever the head's scale, and the directions the head cannot see stay at the start. C is chosen per anchor on
  the val rows and the map refitted on train + val at it, as `linear`'s (`probing/strength.py`);
  `head-probe:C=0.1` pins it. Unpenalised, the map would have more directions than the rows pin down, and its
  predictions would be where L-BFGS stopped.
- The initialisation: where the anchor's width equals the head input's, the identity (A = I, b = 0: the head's
  own input maps to itself, so at the head's input anchor the lens starts as the head and its KL is ~0). Other
  widths: A = 0 and b the least-squares solution of W_head b = log(mean target distribution) - b_head, the
  head's marginal prediction over the train rows, from which the solve learns the map.
- The solve: full batch on the fit rows in memory, the features standardised (the identity then reads
  A' = diag(std), b' = mean), with `probing/lbfgs.py`'s L-BFGS (the curvature pairs of every anchor of a width
  batched) in float32, then float64 to `gtol` where it is below float32's floor, over V: D x r per anchor, r the
  head's rank (at most its classes - 1), so the curvature pairs are small whatever the head input's width.
- The stored probe: the map (`map` [D_head, D], `map_bias`) and the composition a prediction applies (`weight`
  = W_head A [C, D], `bias`), in raw feature space; val loss and "accuracy" (agreement with the head's argmax)
  are the path's at the chosen C, on val rows it did not learn from.

A database's `lens` runs are of three kinds, told apart by their `runs.params`: the direct D x C map (`lens-direct`,
`probing/lens.py`; linear's parameters, C and lr_low among them), the unpenalised map (`l2`, no C_low), and this
one (C_low, no lr_low). Every run of this map
says "map": "translator" in `probe_fits.info`. `--variant lens` still runs it, with a warning, landing as
`head-probe` (`probing/base.py` `RENAMED`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from featstore.errors import FeatstoreError, Name, Step
from featstore.probing import targets
from featstore.probing.base import AnchorContext, LinearFit, Plan, ProbeGroup, ProbeVariant, register
from featstore.probing.lbfgs import (
    FEW_CLASSES,
    RowCopies,
    add_row_products_,
    chunk_rows,
    class_major,
    row_major_zeros,
    strengths,
)
from featstore.probing.strength import (
    StrengthGrid,
    Tolerances,
    check_grid,
    choose_and_solve,
    grid_of,
    strength_parameters,
    tolerances_of,
)
from featstore.schema import Int


@dataclass
class Head:
    """The model's classifier as the store keeps it: logits = u @ weight.T + bias."""

    weight: torch.Tensor  # [C, D_head] float32
    bias: torch.Tensor  # [C]
    module: str

    def to(self, device: torch.device) -> Head:
        return Head(self.weight.to(device), self.bias.to(device), self.module)


def read_kept_head(store, key: str, variant: str) -> Head:
    """The classifier `featstore build` kept for `key`, for the variants that read through it; a store without it,
    or whose head does not match its logits, is one line naming the fix."""
    kept = store.read_head(key)
    if kept is None:
        raise FeatstoreError(f"store {store.location} keeps no head weights for {key!r} (built "
                             f"before they were kept, or the model has no Linear head); rerun the same ",
                             Step("fs.build(...)", "build"), " to add them, or use ", Name("variant", "lens-direct"),
                             field="variant", value=variant)
    weight, bias, module = kept
    classes = store.config(key).num_classes
    if weight.shape[0] != classes:
        raise FeatstoreError(f"the head of {key!r} kept in {store.location} has "
                             f"{weight.shape[0]} classes, its logits {classes}; rerun the same ",
                             Step("fs.build(...)", "build"),
                             field="variant", value=variant)
    if classes < 2:
        raise FeatstoreError(f"the head of {key!r} has {classes} class: any readout through it "
                             f"gives that class with probability 1, so there is nothing to learn; probe a model "
                             f"whose head has 2 classes or more, or use ", Name("variant", "linear"), " on the labels",
                             field="variant", value=variant)
    return Head(torch.from_numpy(weight), torch.from_numpy(bias), module)


def resident_head(variant: str, head: Head | None, ctxs, why: str) -> Head:
    """The head `bind` kept, on the rows' device, for a variant that trains on its fit rows held in memory; one
    line when it was never bound or the rows do not fit (`why` says what needs them in memory)."""
    if head is None:
        raise FeatstoreError("no head to read through (the variant was not bound to a store)",
                             field="variant", value=variant)
    if not ctxs[0].resident:
        raise FeatstoreError("its fit rows do not fit ", Name("memory_budget"), f" and {why}; raise ",
                             Name("memory_budget"), ", or use ", Name("variant", "lens-direct"), field="variant",
                              value=variant)
    return head.to(ctxs[0].device)


class HeadReadout(ProbeVariant):
    """A variant read through the model's own head, which `bind` takes from the store (`head-probe`, `tuned-lens`)."""

    learns_from = "model"

    def __init__(self, **given):
        super().__init__(**given)
        self.head: Head | None = None  # set by `bind`

    def bind(self, store, key: str, train_view: str) -> None:
        self.head = read_kept_head(store, key, self.name)

    def batches_anchors(self) -> bool:
        return True


@register
class Translator(HeadReadout):
    name = "head-probe"
    parameters = {
        **strength_parameters("|A - A0|^2 on the map's distance from its initialisation"),
        "memory": Int(Tolerances.memory, ge=1, le=100, help="L-BFGS curvature pairs kept per anchor"),
    }
    cap_param = "max_iterations"

    @classmethod
    def relations(cls, params: dict) -> None:
        check_grid(params)

    def plan(self, n_fit: int) -> Plan:
        return Plan(max_epochs=1, batch_size=8192, train_on_val=True)  # the path scores val, the refit learns it

    def make_group(self, ctxs) -> ProbeGroup:
        head = resident_head(self.name, self.head, ctxs, "the translator solves on rows in memory")
        return TranslatorGroup(ctxs, head, grid_of(self.params), tolerances_of(self.params))


@dataclass
class TranslatorObjective:
    """f(V) = mean KL(y || softmax((z W[:D] + W[D]) @ head_t + head_b)) + l2/2 |V[:D]|^2 for G anchors, where the
    map is W = W0 + V @ basis.T: W, W0: [G, D+1, D_head], V: [G, D+1, r] its move from the start in the head's
    whitened coordinates (`head_basis`), z: [G, n, D], y: [n, C] target distributions (or labels), head_t:
    [D_head, C]. The `probing/lbfgs.py` objective contract: loss [g] and gradient (in V) of the anchors `which`."""

    z: torch.Tensor
    y: torch.Tensor
    head_t: torch.Tensor
    head_b: torch.Tensor
    w0: torch.Tensor
    basis: torch.Tensor  # [D_head, r]
    l2: float | torch.Tensor  # one strength, or one per anchor [G]
    dtype: torch.dtype = torch.float32
    entropy: float = field(init=False)
    composed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = field(init=False)
    rows: RowCopies = field(init=False)

    def __post_init__(self) -> None:
        self.entropy = targets.entropy(self.y)  # cross-entropy minus it is the KL
        # the same products in the cheaper order: through the head's input (r x (D + C) x D_head per row), or with
        # the head composed into the map (r x D x C per row): 3-8x fewer flops for a 1000-class head on anchors
        # narrower than its input. Composed, the start's and the basis's products with the head are taken once
        # here, not per call: W @ head_t = W0 @ head_t + V @ (basis^T head_t)
        d = self.z.shape[2]
        dh, classes = self.head_t.shape
        self.composed = None
        if d * classes <= dh * (d + classes):
            head_t, w0 = self.head_t.to(self.dtype), self.w0.to(self.dtype)
            self.composed = (w0[:, :d] @ head_t,  # [G, D, C]
                             w0[:, d:] @ head_t + self.head_b.to(self.dtype),  # [G, 1, C]
                             self.basis.to(self.dtype).T @ head_t)  # [r, C]
        self.rows = RowCopies(self.z, self.dtype, transposed=self.composed is not None and classes <= FEW_CLASSES)

    def __call__(self, v: torch.Tensor, which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g, n, d = len(which), self.z.shape[1], self.z.shape[2]
        classes = self.head_t.shape[1]
        rows = chunk_rows(g, classes, self.dtype, self.z.device)
        loss = torch.zeros(g, dtype=torch.float64, device=self.z.device)
        if self.composed is not None:
            m0, c0, through = self.composed
            m = class_major(m0.index_select(0, which) + v[:, :d] @ through)  # [g, D, C]
            c = c0.index_select(0, which) + v[:, d:] @ through  # [g, 1, C]
            grad_m, grad_c = row_major_zeros(m), torch.zeros_like(c)
        else:
            basis = self.basis.to(v.dtype)
            w = self.w0.index_select(0, which).to(v.dtype) + v @ basis.T
            head_t, head_b = self.head_t.to(self.dtype), self.head_b.to(self.dtype)
            grad = torch.zeros_like(w)
        everyone = g == self.z.shape[0] and bool((which == torch.arange(g, device=which.device)).all())
        picks = None if everyone else which
        for start in range(0, n, rows):
            yc = self.y[start : start + rows]
            zc, zc_t = self.rows.chunk(start, start + rows, picks)
            if self.composed is not None:
                logits = torch.baddbmm(c, zc, m)
            else:
                logits = torch.baddbmm(w[:, d:], zc, w[:, :d]) @ head_t + head_b  # via u [g, r, D_head]
            nll, gl = targets.nll_and_gradient_(logits, yc)  # gl: d loss / d logits, [g, r, C]
            loss += nll.sum(dim=1).double()
            if self.composed is not None:
                add_row_products_(grad_m, zc, gl, zc_t)
                grad_c += gl.sum(dim=1, keepdim=True)
            else:
                gu = gl @ head_t.T  # d loss / d u, [g, r, D_head]
                grad[:, :d].baddbmm_(zc.transpose(1, 2), gu)
                grad[:, d:] += gu.sum(dim=1, keepdim=True)
        if self.composed is not None:  # back through the head into V's coordinates: [g, D+1, r]
            grad = (torch.cat([grad_m, grad_c], dim=1) @ through.T).div_(n)
        else:
            grad = (grad / n) @ basis
        l2 = strengths(self.l2, self.z, which)
        grad[:, :d].add_(v[:, :d] * l2.to(v.dtype))
        loss = loss / n - self.entropy + 0.5 * l2[:, 0, 0] * v[:, :d].double().pow(2).sum(dim=(1, 2))
        return loss, grad


def head_basis(weight: torch.Tensor, marginal: torch.Tensor) -> torch.Tensor:
    """[D_head, r] whitening of the head's curvature at the marginal prediction p: H = W^T (diag p - p p^T) W, the
    Fisher metric of the logits a change of u makes; the basis is H's eigenvectors over the square roots of their
    eigenvalues, those above 1e-10 of the largest. A move V of the map in it changes the logits by about |V| in that
    metric whatever the head's scale, so one L2 grid fits every head and the solve is as well conditioned as the
    features; directions the head cannot see (its null space, the softmax's shift) are left at the start: they
    change no prediction."""
    w, p = weight.double(), marginal.double()
    h = w.T @ (torch.diag(p) - torch.outer(p, p)) @ w
    values, vectors = torch.linalg.eigh((h + h.T) / 2)
    keep = values > 1e-10 * values.max().clamp_min(1e-300)
    return (vectors[:, keep] / values[keep].sqrt()).float()


@dataclass(frozen=True)
class Translation:
    """The translator's family for the strength search (`probing/strength.py`): its objective, its logits through
    the head, and its start (V = 0: the map W0, where the penalty is centred)."""

    head_t: torch.Tensor  # [D_head, C]
    head_b: torch.Tensor
    w0: torch.Tensor  # [G, D+1, D_head]
    basis: torch.Tensor  # [D_head, r]

    def objective(self, x, y, l2, dtype=torch.float32) -> TranslatorObjective:
        return TranslatorObjective(x, y, self.head_t, self.head_b, self.w0, self.basis, l2, dtype)

    def map(self, v: torch.Tensor, a: int) -> torch.Tensor:
        """Anchor a's map W [D+1, D_head] from its move V."""
        return self.w0[a] + v @ self.basis.T

    def logits(self, x, v, a):
        w = self.map(v, a)
        d = x.shape[1]
        return torch.addmm(w[d:], x, w[:d]) @ self.head_t + self.head_b

    def start(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*self.w0.shape[:2], self.basis.shape[1], device=self.w0.device)

    def row_curvature(self, x, v, a):
        """trace(T (diag p - p p^T) T^T) / r per row, T = basis^T head_t [r, C]: the Hessian of the loss in V's
        r columns (the identity's at the marginal prediction, where the basis whitens it)."""
        through = self.basis.double().T @ self.head_t.double()
        p = torch.softmax(self.logits(x, v, a).double(), dim=-1)
        return ((p * through.pow(2).sum(dim=0)).sum(dim=1) - (p @ through.T).pow(2).sum(dim=1)) / through.shape[0]


class TranslatorGroup(ProbeGroup):
    """The translators of the anchors of one width, solved together on their standardised fit rows."""

    def __init__(self, ctxs, head: Head, grid: StrengthGrid, tol: Tolerances):
        ctx0: AnchorContext = ctxs[0]
        dev = ctx0.device
        self.anchors = [ctx.anchor for ctx in ctxs]
        self.members = list(self.anchors)
        self.head = head
        self.grid, self.tol = grid, tol
        self.mean = torch.stack([ctx.stats.mean.to(dev) for ctx in ctxs])[:, None]  # [G, 1, D]
        self.std = torch.stack([ctx.stats.std.to(dev) for ctx in ctxs])[:, None]
        self.dim, self.head_dim = ctx0.dim, int(head.weight.shape[1])
        self.done: dict[int, tuple[torch.Tensor, dict, bool, float]] = {}

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def step(self, x, y, is_val, report=False):
        return None  # `finish` solves before any epoch

    def end_epoch(self, epoch, val_x, val_y) -> None:
        return None

    def ready_to_finish(self) -> bool:
        return self.resident and bool(self.anchors)

    def initial(self, marginal: torch.Tensor) -> tuple[torch.Tensor, str]:
        """[G, D+1, D_head] starting maps in standardised coordinates (from the head's marginal distribution
        [C], float64), and what they are."""
        g, d = len(self.members), self.dim
        w0 = torch.zeros(g, d + 1, self.head_dim, device=self.mean.device)
        if d == self.head_dim:  # u = x = z * std + mean: the identity in raw space
            w0[:, :d] = torch.diag_embed(self.std[:, 0])
            w0[:, d] = self.mean[:, 0]
            return w0, "identity"
        logp = marginal.clamp_min(1e-30).log()
        rhs = (logp - logp.mean() - self.head.bias.double())[:, None]
        b = torch.linalg.lstsq(self.head.weight.double(), rhs).solution[:, 0]
        w0[:, d] = b.float()
        return w0, "head marginal"

    def finish(self, x, y, is_val, on_pass=None) -> None:
        """Choose each anchor's C on the val rows and solve it at that C on all fit rows x [G, n, D] (prepared),
        float32 then float64 below its floor (`probing/strength.py`). The start is made from the train rows."""
        marginal = y[~is_val].double().mean(dim=0)  # the head's mean distribution over the train rows
        w0, init = self.initial(marginal)
        family = Translation(self.head.weight.T.contiguous(), self.head.bias, w0,
                             head_basis(self.head.weight, marginal))
        solved = choose_and_solve(x, y, is_val, family, self.grid, self.tol, on_pass)
        for i, (a, st) in enumerate(zip(self.members, solved.states, strict=True)):
            info = {"map": "translator", "init": init, "C": solved.c[i],
                    "C_chosen_on": "pinned" if self.grid.pinned else "val loss", "val_loss_per_C": solved.path[i],
                    "head_module": self.head.module, "solver": "lbfgs", "cap": "max_iterations",
                    "lbfgs_iterations": st.iterations, "lbfgs_stop": st.stop, "max_gradient": st.max_gradient,
                    "gtol": solved.gtol, "precision": solved.precision[i], "objective": st.loss,
                    "passes": solved.passes[i]}
            self.done[a] = (family.map(solved.w[i], i), info, st.converged(solved.gtol), st.loss,
                            (solved.val_loss[i], solved.val_accuracy[i]))
        self.anchors = []

    def fitted(self, val_x, val_y) -> dict[int, TranslatorFit]:
        out = {}
        for i, a in enumerate(self.members):
            if a not in self.done:
                raise FeatstoreError("the translator was never solved (its rows were not resident)",
                                     field="variant", value="head-probe")
            w, info, converged, loss, (val_loss, val_accuracy) = self.done[a]
            d, mean, std = self.dim, self.mean[i, 0], self.std[i, 0]
            a_t = w[:d] / std[:, None]  # raw space: u = x A^T + b
            b = w[d] - mean / std @ w[:d]
            # val loss and agreement are the path's at the chosen C, on val rows it did not learn from
            fit = TranslatorFit(weight=(a_t @ self.head.weight.T).T.contiguous(),
                                bias=b @ self.head.weight.T + self.head.bias, map_t=a_t, map_bias=b, info=info,
                                epochs=info["passes"], converged=converged, train_loss=loss, val_loss=val_loss,
                                val_accuracy=val_accuracy)
            out[a] = fit
        return out


@dataclass
class TranslatorFit(LinearFit):
    """The head composed with an anchor's translator (`weight` = W_head A, `bias` = W_head b + b_head), predicting
    as a `LinearFit`; the store keeps the translator too."""

    map_t: torch.Tensor | None = None  # [D, D_head]: u = x @ map_t + map_bias
    map_bias: torch.Tensor | None = None  # [D_head]

    def arrays(self) -> dict[str, np.ndarray]:
        return {**super().arrays(), "map": self.map_t.T.contiguous().cpu().numpy(),
                "map_bias": self.map_bias.cpu().numpy()}

