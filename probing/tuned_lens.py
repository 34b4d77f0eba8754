"""`tuned-lens`: the tuned lens as Belrose et al. ("Eliciting Latent Predictions from Transformers with the Tuned
Lens", 2023) train it, on stores whose every anchor is as wide as the head's input.

Followed from their reference code (github.com/AlignmentResearch/tuned-lens at abdac0c):
- The translator: per layer an affine map added residually, u = h + (h T + b), T [D, D] and b [D] zero at the
  start, so the lens starts as the identity (`TunedLens.__init__`: "translator.weight.data.zero_();
  translator.bias.data.zero_()"; `transform_hidden`: "we add the translator output residually ... so that weight
  decay regularizes the transform toward the identity, not the zero transformation"), read by the frozen
  `Unembed`: the model's final norm, then its unembedding (here the classifier `featstore build` keeps, and the
  final norm it records beside it: `featstore.nets.head_norm`).
- No translator at the final layer ("Don't include the final layer since it does not need a translator";
  `train_loop.py` trains `hidden_states[:-1]`): an anchor whose features are the head's input (`head input`: the
  head alone reads it), or whose final norm then head give the model's logits (`final`: a ViT's last block, CLS
  token), is read as the model reads it, with the identity as its map.
- The loss (scripts/train_loop.py, the default `LossChoice.KL`): sum_c p_c (log p_c - log_softmax(lens)_c), mean
  over the step's rows, p the model's final distribution; each translator's loss backpropagated into its own
  parameters.
- The steps: `num_steps` = 250, each on fresh rows (theirs: 2**18 tokens a step from a shuffled, seeded data
  loader). Here a step takes the next `batch` rows (128) of a stream of seeded permutations of the train rows
  (numpy's `default_rng(probe seed)`, one permutation per pass), so every row is seen once before any is seen
  again; 250 x 128 rows is about one pass over ImageNet-val's train split, 38 over the demo's. A batch as large
  as the train rows is the full-batch gradient. The rows drawn do not depend on the thread count.
- The optimiser (scripts/ingredients.py `Optimizer`, its defaults): torch.optim.SGD with lr = lr_scale x (1 -
  momentum) = 0.1, momentum 0.9, nesterov=True, weight_decay 1e-3 on every parameter (biases too); the learning
  rate decayed linearly to 0 over the steps (transformers' `get_linear_schedule_with_warmup`, no warm-up for
  SGD), before each step the gradient clipped to a norm of 1.0 over every translator together
  (`clip_grad_norm_(state.lens.parameters(), 1.0)`).

Where it differs, and why: float32 on the rows in memory (theirs: bfloat16 autocast on a GPU); pooled anchor
features, not a transformer's residual stream at every token; the val rows are not learnt from (nothing is chosen
on them): val KL and agreement with the head are held out.

Where an anchor's width is not the head input's there is no identity to start from, and the variant is refused in
one line before any work (`bind`), as it is where the build recorded no final norm (a store built before it was
recorded: rerun the build) or one that cannot be applied to a pooled vector (a BatchNorm, a norm before a mean over
tokens). `tuned-lens:steps=0` is the logit lens (the final norm and head read on the anchor as it is).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from featstore.errors import FeatstoreError, Name, Step
from featstore.probing import targets
from featstore.probing.base import FittedProbe, Plan, ProbeGroup, register
from featstore.probing.translator import Head, HeadReadout, TranslatorFit, resident_head
from featstore.schema import Int, Real

TRANSLATED = "translated"  # an anchor's role (`featstore.nets.head_norm.ROLES`) that gets a translator
NORMED = ("translated", "final")  # roles read through the final norm (before it in the forward)


@dataclass(frozen=True)
class FinalNorm:
    """The model's final norm over the features: LayerNorm or RMSNorm, then the affine weight and bias."""

    kind: str  # "layer_norm" | "rms_norm"
    eps: float
    weight: torch.Tensor  # [D]
    bias: torch.Tensor  # [D]

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        if self.kind == "layer_norm":
            centred = u - u.mean(dim=-1, keepdim=True)
            scaled = centred * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        else:
            scaled = u * torch.rsqrt(u.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return scaled * self.weight + self.bias

    def to(self, device: torch.device) -> FinalNorm:
        return FinalNorm(self.kind, self.eps, self.weight.to(device), self.bias.to(device))


@register
class TunedLens(HeadReadout):
    name = "tuned-lens"
    parameters = {
        "steps": Int(250, ge=0, le=100_000, help="SGD steps (theirs: num_steps 250); 0: the logit lens"),
        "batch": Int(128, ge=1, le=1_000_000, help="train rows per step, fresh from seeded permutations"),
        "lr_scale": Real(1.0, gt=0, le=100, help="the learning rate is lr_scale x (1 - momentum)"),
        "momentum": Real(0.9, ge=0, lt=1, help="Nesterov momentum"),
        "weight_decay": Real(1e-3, ge=0, le=1, help="torch SGD's weight decay, towards the identity"),
        "clip": Real(1.0, gt=0, help="the gradient's norm over every translator is clipped to this"),
    }
    cap_param = "steps"

    def __init__(self, **given):
        super().__init__(**given)
        self.norm: FinalNorm | None = None  # set by `bind`
        self.roles: list[str] = []  # per anchor of the store, set by `bind`

    def bind(self, store, key: str, train_view: str) -> None:
        super().bind(store, key, train_view)
        width = int(self.head.weight.shape[1])
        anchors = store.anchors(key)
        other = [a for a in anchors if a.dim != width]
        if other:
            same = [a.name for a in anchors if a.dim == width]
            build = (("build a store of those only (", Name("anchors", ",".join(same)), ")") if same else
                     ("no anchor of this store is that wide",))
            raise FeatstoreError(f"{len(other)} of {len(anchors)} anchors of {key!r} are not "
                                 f"as wide as the head's input ({width}): "
                                 f"{', '.join(f'{a.name} ({a.dim})' for a in other[:4])}"
                                 f"{' ...' if len(other) > 4 else ''}; the tuned lens starts each translator at the "
                                 f"identity, which needs that width, and a run predicts every anchor: ", *build,
                                 ", or use ", Name("variant", "head-probe"),
                                 " (a map into the head's input from any width)",
                                 field="variant", value=self.name)
        kept = store.read_head_reading(key)
        if kept is None:
            raise FeatstoreError(f"store {store.location} keeps the head of {key!r} without "
                                 f"its final norm and the anchors' roles (built before they were kept); rerun the "
                                 f"same ", Step("fs.build(...)", "build"), " to add them, or use ",
                                 Name("variant", "head-probe"),
                                 field="variant", value=self.name)
        reading, arrays = kept
        norm = reading.get("norm")
        if norm is not None and "unreadable" in norm:
            raise FeatstoreError(f"the final norm of {key!r} ({norm['module']}) cannot be "
                                 f"applied to the pooled features: {norm['unreadable']}; use ", Name("variant",
                                 "head-probe"),
                                 field="variant", value=self.name)
        roles = reading.get("anchors", {})
        missing = [a.name for a in anchors if a.name not in roles]
        if missing:
            raise FeatstoreError(f"store {store.location} records no role to the head for "
                                 f"anchor(s) {', '.join(missing[:4])} of {key!r}; rerun the same ",
                                 Step("fs.build(...)", "build"),
                                 field="variant", value=self.name)
        self.roles = [roles[a.name] for a in anchors]
        self.norm = None if norm is None else FinalNorm(
            norm["kind"], float(norm["eps"]), torch.from_numpy(arrays["norm_weight"]).float(),
            torch.from_numpy(arrays["norm_bias"]).float())

    def plan(self, n_fit: int) -> Plan:
        return Plan(max_epochs=1, batch_size=8192)  # `finish` takes every step before any epoch

    # anchors of a width train as one group (`HeadReadout.batches_anchors`), and every anchor is as wide: the
    # gradient is clipped over all translators together, as the reference clips it

    def make_group(self, ctxs) -> ProbeGroup:
        head = resident_head(self.name, self.head, ctxs, "its steps draw rows from memory")
        norm = None if self.norm is None else self.norm.to(ctxs[0].device)
        roles = {ctx.anchor: self.roles[ctx.anchor] for ctx in ctxs}
        return TunedLensGroup([ctx.anchor for ctx in ctxs], head, norm, roles, self.params, ctxs[0].seed)


def step_rows(n: int, steps: int, batch: int, seed: int) -> np.ndarray:
    """[steps, batch] positions of the rows each step learns from: consecutive slices of a stream of seeded
    permutations of the n rows (`numpy.random.default_rng(seed)`, one per pass), so no row comes again before every
    row has come; with `batch` >= n every step takes every row, in order."""
    if batch >= n or steps == 0:
        return np.tile(np.arange(n), (steps, 1))
    rng = np.random.default_rng(seed)
    passes = -(-steps * batch // n)
    return np.concatenate([rng.permutation(n) for _ in range(passes)])[: steps * batch].reshape(steps, batch)


def lens_logits(x: torch.Tensor, t: torch.Tensor, b: torch.Tensor, norm: FinalNorm | None,
                head: Head) -> torch.Tensor:
    """The logits of the lens, [G, n, C]: the final norm (where given) and the head read on u = x + x T + b, for
    rows x [G, n, D] and translators T [G, D, D], b [G, D]."""
    u = torch.baddbmm(x + b[:, None], x, t)
    return (u if norm is None else norm(u)) @ head.weight.T + head.bias


def mean_kl(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """[G] mean over the rows of sum_c p_c (log p_c - log_softmax(logits)_c), train_loop.py's KL."""
    return (torch.special.xlogy(p, p) - p * torch.log_softmax(logits, dim=-1)).sum(dim=-1).mean(dim=-1)


class TunedLensGroup(ProbeGroup):
    """The translators of every anchor but the final ones, trained together by the reference recipe on fresh rows
    of the train rows in memory each step."""

    def __init__(self, anchors: list[int], head: Head, norm: FinalNorm | None, roles: dict[int, str],
                 params: dict, seed: int):
        self.anchors, self.members, self.head, self.norm = list(anchors), list(anchors), head, norm
        self.roles, self.params, self.seed = roles, params, seed
        self.fits: dict[int, TunedLensFit] = {}

    def step(self, x, y, is_val, report=False):
        return None  # `finish` takes every step before any epoch

    def end_epoch(self, epoch, val_x, val_y) -> None:
        return None

    def ready_to_finish(self) -> bool:
        return self.resident and bool(self.anchors)

    def finish(self, x, y, is_val, on_pass=None) -> None:
        """`steps` SGD steps of the translators on fresh rows of x [G, n, D] (raw; all train rows) against the
        head's distributions y [n, C], as the reference's `Train.execute` takes them."""
        _, n, d = x.shape
        trained = [i for i, a in enumerate(self.members) if self.roles[a] == TRANSLATED]
        normed = [self.roles[a] in NORMED for a in self.members]
        g = len(trained)
        t = torch.zeros(g, d, d, device=x.device, requires_grad=True)
        b = torch.zeros(g, d, device=x.device, requires_grad=True)
        steps, momentum, batch = self.params["steps"], self.params["momentum"], self.params["batch"]
        opt = torch.optim.SGD([t, b], lr=self.params["lr_scale"] * (1 - momentum), momentum=momentum,
                              nesterov=momentum > 0, weight_decay=self.params["weight_decay"])
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, (steps - s) / max(1, steps)))
        picks = torch.from_numpy(step_rows(n, steps, batch, self.seed)).to(x.device)
        xt = x[trained] if g else x[:0]
        history = []
        for s in range(steps if g else 0):
            rows = picks[s]
            loss = mean_kl(lens_logits(xt[:, rows], t, b, self.norm, self.head), y[rows])
            loss.sum().backward()  # each translator's loss reaches only its own parameters
            history.append(loss.detach().double())
            torch.nn.utils.clip_grad_norm_([t, b], self.params["clip"])
            opt.step()
            opt.zero_grad(set_to_none=False)
            schedule.step()
            if on_pass is not None:
                on_pass()
        eye = torch.eye(d, device=x.device)
        with torch.no_grad():
            kl = torch.stack(history, dim=1).tolist() if history else [[] for _ in trained]
            for i, a in enumerate(self.members):
                k = trained.index(i) if i in trained else None
                map_t = eye + t[k].detach() if k is not None else eye
                map_bias = b[k].detach() if k is not None else torch.zeros(d, device=x.device)
                norm = self.norm if normed[i] else None
                fit = TunedLensFit(map_t=map_t, map_bias=map_bias, norm=norm, head=self.head,
                                   epochs=steps if k is not None else 0)
                fit.train_loss = float(mean_kl(fit.logits(x[i])[None], y)[0])
                fit.info = {"map": "tuned lens", "init": "identity", "role": self.roles[a],
                            "translator": k is not None, "norm": None if norm is None else
                            {"kind": norm.kind, "eps": norm.eps}, "head_module": self.head.module,
                            "solver": "sgd", "cap": "steps", "batch": min(batch, n), "seed": self.seed,
                            "train_kl_per_step": kl[k] if k is not None else []}
                self.fits[a] = fit
        self.anchors = []

    def fitted(self, val_x, val_y) -> dict[int, FittedProbe]:
        """Each anchor's lens, with its KL and agreement with the head's argmax on the val rows (held out)."""
        out = {}
        for a in self.members:
            if a not in self.fits:
                raise FeatstoreError("the lens was never trained (its rows were not resident)", field="variant",
                                     value="tuned-lens")
            fit = self.fits[a]
            with torch.no_grad():
                logits = fit.logits(val_x[a].to(fit.map_t.device))
                fit.val_loss = float(mean_kl(logits[None], val_y)[0]) if len(val_y) else float("nan")
                fit.val_accuracy = (float((logits.argmax(dim=-1) == targets.hard(val_y)).float().mean())
                                    if len(val_y) else float("nan"))
            out[a] = fit.linear() if fit.norm is None else fit
        return out


@dataclass(kw_only=True)
class TunedLensFit(FittedProbe):
    """One anchor's lens: logits = head(norm(x @ map_t + map_bias)), the norm where the anchor lies before it.
    Without a norm it is linear, and is kept as `head-probe`'s (`linear`); with one the store keeps the map, the
    norm's and the head's arrays (`head_weight`, `head_bias`), and the record names the norm's kind and eps."""

    map_t: torch.Tensor  # [D, D]: u = x @ map_t + map_bias
    map_bias: torch.Tensor  # [D]
    norm: FinalNorm | None
    head: Head

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        u = torch.addmm(self.map_bias.to(x.device), x, self.map_t.to(x.device))
        u = u if self.norm is None else self.norm.to(x.device)(u)
        return u @ self.head.weight.T.to(x.device) + self.head.bias.to(x.device)

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        conf, pred = torch.softmax(self.logits(x), dim=-1).max(dim=-1)
        return pred, conf

    def linear(self) -> TranslatorFit:
        """The same lens as a linear readout (no norm): the head composed with the map."""
        return TranslatorFit(weight=(self.map_t @ self.head.weight.T).T.contiguous(),
                             bias=self.map_bias @ self.head.weight.T + self.head.bias, map_t=self.map_t,
                             map_bias=self.map_bias, info=self.info, epochs=self.epochs, train_loss=self.train_loss,
                             val_loss=self.val_loss, val_accuracy=self.val_accuracy)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"map": self.map_t.T.contiguous().cpu().numpy(), "map_bias": self.map_bias.cpu().numpy(),
                "norm_weight": self.norm.weight.cpu().numpy(), "norm_bias": self.norm.bias.cpu().numpy(),
                "head_weight": self.head.weight.cpu().numpy(), "head_bias": self.head.bias.cpu().numpy()}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], record: dict) -> TunedLensFit:
        """A lens through a norm as the store keeps one fold of it (`arrays`) with its record."""
        t = lambda name: torch.from_numpy(np.asarray(arrays[name], dtype=np.float32))  # noqa: E731
        norm = FinalNorm(record["norm"]["kind"], float(record["norm"]["eps"]), t("norm_weight"), t("norm_bias"))
        return cls(map_t=t("map").T.contiguous(), map_bias=t("map_bias"), norm=norm,
                   head=Head(t("head_weight"), t("head_bias"), str(record.get("head_module", ""))))
