"""`lens`: a translator per anchor read through the model's own frozen head, as the tuned lens (Belrose et al.,
"Eliciting Latent Predictions from Transformers with the Tuned Lens", 2023) reads each layer.

- The map: per anchor, an affine map into the head's input space, u = A h + b (A: [D_head, D]), read by the
  head: logits = W_head u + b_head. W_head, b_head are the classifier's weights, kept in the store by
  `featstore build` (`FeatureStore.read_head`); a store built before they were kept is refused in one line (rerun
  the same build to add them, or use `lens-direct`). Nothing reruns the network.
- The objective: KL(head || lens), mean over the train rows, with the head's softmax over the stored logits of
  the training view as the target distribution (as the tuned lens trains on the final layer's distribution), plus
  l2/2 |A - A0|^2 (A in standardised coordinates, A0 its initialisation; 0 by default: no penalty).
- The initialisation: where the anchor's width equals the head input's, the identity (A = I, b = 0: the head's
  own input maps to itself, so at the head's input anchor the lens starts as the head and its KL is ~0). Other
  widths: A = 0 and b the least-squares solution of W_head b = log(mean target distribution) - b_head, the
  head's marginal prediction, from which the solve learns the map.
- The solve: full batch on the fit rows in memory, the features standardised (the identity then reads
  A' = diag(std), b' = mean), with `probing/lbfgs.py`'s L-BFGS (the curvature pairs of every anchor of a width
  batched) in float32, then float64 to `gtol` where it is below float32's floor. The map is full rank: D x D_head
  weights per anchor (2048 x 2048 = 4.2M for ResNet-50's widest) and L-BFGS keeps 10 pairs of them, 2 x 10 x
  4.2M x 8 bytes = 0.7 GB per anchor in the float64 finish: fine for the widths featstore stores; a low-rank map
  would cut that, at the cost of the identity initialisation (not done).
- The stored probe: the map (`map` [D_head, D], `map_bias`) and the composition a prediction applies (`weight`
  = W_head A [C, D], `bias`), in raw feature space; val "accuracy" is agreement with the head's argmax on the val
  rows (not learnt from).

`lens` was the direct D x C map (`lens-direct`, `probing/lens.py`) before issue 35: a database's `lens` runs
written before then are that map; their `runs.params` hold linear's parameters (C among them), the translator's
hold l2 and no C, and its `probe_fits.info` says "map": "translator".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from featstore.errors import FeatstoreError
from featstore.probing import targets
from featstore.probing.base import AnchorContext, LinearFit, Plan, ProbeGroup, ProbeVariant, register
from featstore.probing.lbfgs import LOGIT_BYTES, minimise
from featstore.schema import Int, Real

FLOAT32_FLOOR = 1e-5  # largest gradient entry float32 sums resolve on hard anchors (`probing/lbfgs.py`)


@dataclass
class Head:
    """The model's classifier as the store keeps it: logits = u @ weight.T + bias."""

    weight: torch.Tensor  # [C, D_head] float32
    bias: torch.Tensor  # [C]
    module: str


@register
class Translator(ProbeVariant):
    name = "lens"
    learns_from = "model"
    parameters = {
        "l2": Real(0.0, ge=0, help="penalty l2/2 |A - A0|^2 on the map's distance from its initialisation"),
        "gtol": Real(1e-6, gt=0, help="largest gradient entry at which the solve stops (float64 below 1e-5)"),
        "max_iterations": Int(1000, ge=1, help="L-BFGS iterations of each solve at most"),
        "memory": Int(10, ge=1, le=100, help="L-BFGS curvature pairs kept per anchor"),
    }
    cap_param = "max_iterations"

    def __init__(self, **given):
        super().__init__(**given)
        self.head: Head | None = None  # set by `bind`

    def bind(self, store, key: str, train_view: str) -> None:
        kept = store.read_head(key)
        if kept is None:
            raise FeatstoreError(f"--variant lens: store {store.location} keeps no head weights for {key!r} (built "
                                 f"before they were kept, or the model has no Linear head); rerun the same "
                                 f"`featstore build` to add them, or use --variant lens-direct")
        weight, bias, module = kept
        classes = store.config(key).num_classes
        if weight.shape[0] != classes:
            raise FeatstoreError(f"--variant lens: the head of {key!r} kept in {store.location} has {weight.shape[0]} "
                                 f"classes, its logits {classes}; rerun the same `featstore build`")
        self.head = Head(torch.from_numpy(weight), torch.from_numpy(bias), module)

    def plan(self, n_fit: int) -> Plan:
        return Plan(max_epochs=1, batch_size=8192, train_on_val=False)

    def batches_anchors(self) -> bool:
        return True

    def make_group(self, ctxs) -> ProbeGroup:
        if self.head is None:
            raise FeatstoreError("--variant lens: no head to read through (the variant was not bound to a store)")
        if not ctxs[0].resident:
            raise FeatstoreError("--variant lens: its fit rows do not fit --memory-budget and the translator solves "
                                 "on rows in memory; raise --memory-budget, or use --variant lens-direct")
        p = self.params
        return TranslatorGroup(ctxs, self.head, p["l2"], p["gtol"], p["max_iterations"], p["memory"])


@dataclass
class TranslatorObjective:
    """f(W) = mean KL(y || softmax((z W[:D] + W[D]) @ head_t + head_b)) + l2/2 |W[:D] - W0[:D]|^2 for G anchors;
    W: [G, D+1, D_head], z: [G, n, D], y: [n, C] target distributions (or labels), head_t: [D_head, C]. The
    `probing/lbfgs.py` objective contract: loss [g] and gradient of the anchors `which`."""

    z: torch.Tensor
    y: torch.Tensor
    head_t: torch.Tensor
    head_b: torch.Tensor
    w0: torch.Tensor
    l2: float
    dtype: torch.dtype = torch.float32
    entropy: float = field(init=False)

    def __post_init__(self) -> None:
        y = self.y.double()  # the targets' own entropy: cross-entropy minus it is the KL
        self.entropy = float(-torch.special.xlogy(y, y).sum(dim=-1).mean()) if targets.is_soft(self.y) else 0.0

    def __call__(self, w: torch.Tensor, which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g, n, d = len(which), self.z.shape[1], self.z.shape[2]
        dh, classes = self.head_t.shape
        head_t, head_b = self.head_t.to(self.dtype), self.head_b.to(self.dtype)
        rows = max(256, LOGIT_BYTES // max(1, 4 * g * classes))
        loss = torch.zeros(g, dtype=torch.float64, device=self.z.device)
        # the same products in the cheaper order: through the head's input (r x (D + C) x D_head per row), or with
        # the head composed into the map once per call (r x D x C per row, plus D x D_head x C): 3-8x fewer
        # flops for a 1000-class head on anchors narrower than its input
        composed = d * classes <= dh * (d + classes)
        if composed:
            m = w[:, :d] @ head_t  # [g, D, C]
            c = w[:, d:] @ head_t + head_b  # [g, 1, C]
            grad_m, grad_c = torch.zeros_like(m), torch.zeros_like(c)
        else:
            grad = torch.zeros_like(w)
        everyone = g == self.z.shape[0] and bool((which == torch.arange(g, device=which.device)).all())
        picks = None if everyone else [int(i) for i in which]
        for start in range(0, n, rows):
            yc = self.y[start : start + rows]
            if picks is None:  # views of z, no copy
                zc = self.z[:, start : start + rows].to(self.dtype)
            else:
                zc = torch.stack([self.z[i, start : start + rows] for i in picks]).to(self.dtype)
            if composed:
                logits = torch.baddbmm(c, zc, m)
            else:
                logits = torch.baddbmm(w[:, d:], zc, w[:, :d]) @ head_t + head_b  # via u [g, r, D_head]
            logp = torch.log_softmax(logits, dim=-1)
            loss += targets.nll(logp, yc).sum(dim=1).double()
            gl = targets.subtract_(logp.exp_(), yc)  # d loss / d logits, [g, r, C]
            if composed:
                grad_m.baddbmm_(zc.transpose(1, 2), gl)
                grad_c += gl.sum(dim=1, keepdim=True)
            else:
                gu = gl @ head_t.T  # d loss / d u, [g, r, D_head]
                grad[:, :d].baddbmm_(zc.transpose(1, 2), gu)
                grad[:, d:] += gu.sum(dim=1, keepdim=True)
        if composed:
            grad = torch.cat([grad_m, grad_c], dim=1) @ head_t.T  # back through the head: [g, D+1, D_head]
        grad /= n
        moved = w[:, :d] - self.w0.index_select(0, which)[:, :d].to(w.dtype)
        grad[:, :d].add_(moved, alpha=self.l2)
        loss = loss / n - self.entropy + 0.5 * self.l2 * moved.double().pow(2).sum(dim=(1, 2))
        return loss, grad


class TranslatorGroup(ProbeGroup):
    """The translators of the anchors of one width, solved together on their standardised fit rows."""

    def __init__(self, ctxs, head: Head, l2: float, gtol: float, max_iterations: int, memory: int):
        ctx0: AnchorContext = ctxs[0]
        dev = ctx0.device
        self.anchors = [ctx.anchor for ctx in ctxs]
        self.members = list(self.anchors)
        self.head = Head(head.weight.to(dev), head.bias.to(dev), head.module)
        self.l2, self.gtol, self.max_iterations, self.memory = l2, gtol, max_iterations, memory
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

    def initial(self, y: torch.Tensor) -> tuple[torch.Tensor, str]:
        """[G, D+1, D_head] starting maps in standardised coordinates, and what they are."""
        g, d = len(self.members), self.dim
        w0 = torch.zeros(g, d + 1, self.head_dim, device=self.mean.device)
        if d == self.head_dim:  # u = x = z * std + mean: the identity in raw space
            w0[:, :d] = torch.diag_embed(self.std[:, 0])
            w0[:, d] = self.mean[:, 0]
            return w0, "identity"
        logp = y.double().mean(dim=0).clamp_min(1e-30).log()  # the head's marginal distribution over the rows
        rhs = (logp - logp.mean() - self.head.bias.double())[:, None]
        b = torch.linalg.lstsq(self.head.weight.double(), rhs).solution[:, 0]
        w0[:, d] = b.float()
        return w0, "head marginal"

    def finish(self, x, y, is_val, on_pass=None) -> None:
        """Solve every anchor on the fit rows x [G, n, D] (prepared), float32 then float64 below its floor."""
        w0, init = self.initial(y)
        head_t = self.head.weight.T.contiguous()
        objective = TranslatorObjective(x, y, head_t, self.head.bias, w0, self.l2)
        first = max(self.gtol, FLOAT32_FLOOR)
        w, states = minimise(objective, w0, first, self.max_iterations, self.memory, on_pass)
        precision = "float32"
        if self.gtol < first:
            objective.dtype = torch.float64
            w, states = minimise(objective, w.double(), self.gtol, self.max_iterations, self.memory, on_pass)
            precision = "float64"
        for i, (a, st) in enumerate(zip(self.members, states, strict=True)):
            info = {"map": "translator", "init": init, "l2": self.l2, "head_module": self.head.module,
                    "solver": "lbfgs", "cap": "max_iterations", "lbfgs_iterations": st.iterations,
                    "lbfgs_stop": st.stop, "max_gradient": st.max_gradient, "gtol": self.gtol,
                    "precision": precision, "kl": st.loss}
            self.done[a] = (w[i].float(), info, st.converged(self.gtol), st.loss)
        self.anchors = []

    def fitted(self, val_x, val_y) -> dict[int, TranslatorFit]:
        out = {}
        for i, a in enumerate(self.members):
            if a not in self.done:
                raise FeatstoreError("--variant lens: the translator was never solved (its rows were not resident)")
            w, info, converged, loss = self.done[a]
            d, mean, std = self.dim, self.mean[i, 0], self.std[i, 0]
            a_t = w[:d] / std[:, None]  # raw space: u = x A^T + b
            b = w[d] - mean / std @ w[:d]
            fit = TranslatorFit(weight=(a_t @ self.head.weight.T).T.contiguous(),
                                bias=b @ self.head.weight.T + self.head.bias, map_t=a_t, map_bias=b, info=info,
                                epochs=1, converged=converged, train_loss=loss)
            logits = val_x[a] @ fit.weight.T + fit.bias
            logp = torch.log_softmax(logits, dim=-1)
            fit.val_loss = float(targets.nll(logp[None], val_y).mean()) if len(val_y) else math.nan
            fit.val_accuracy = (float((logits.argmax(dim=-1) == targets.hard(val_y)).float().mean())
                                if len(val_y) else math.nan)
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

