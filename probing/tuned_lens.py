"""`tuned-lens`: the tuned lens as Belrose et al. ("Eliciting Latent Predictions from Transformers with the Tuned
Lens", 2023) train it, on stores whose every anchor is as wide as the head's input.

Followed from their reference code (github.com/AlignmentResearch/tuned-lens at abdac0c):
- The translator: per anchor an affine map added residually, u = h + (h T + b), T [D, D] and b [D] zero at the
  start, so the lens starts as the identity and reads the anchor through the head as it is (`TunedLens.__init__`:
  "translator.weight.data.zero_(); translator.bias.data.zero_()"; `transform_hidden`: "we add the translator
  output residually ... so that weight decay regularizes the transform toward the identity, not the zero
  transformation"), read by the frozen head (their `Unembed`; here the classifier `featstore build` keeps).
- The loss (scripts/train_loop.py, the default `LossChoice.KL`): sum_c p_c (log p_c - log_softmax(lens)_c), mean
  over the rows, p the model's final distribution.
- The optimiser (scripts/ingredients.py `Optimizer`, its defaults): torch.optim.SGD with lr = lr_scale x (1 -
  momentum) = 0.1, momentum 0.9, nesterov=True, weight_decay 1e-3 on every parameter (biases too); the learning
  rate decayed linearly to 0 over num_steps = 250 (transformers' `get_linear_schedule_with_warmup`, no warm-up for
  SGD), before each step the gradient clipped to a norm of 1.0 over every translator together
  (`clip_grad_norm_(state.lens.parameters(), 1.0)`; here the anchors of the run, one group since all are as wide).

Where it differs, and why:
- A step's batch is every train row (theirs: 2**18 fresh tokens a step, never repeated); a store holds hundreds to
  thousands of images, so each step is the full-batch gradient of the same rows. Deterministic: no seed enters.
- float32 on the rows in memory (theirs: bfloat16 autocast on a GPU); pooled anchor features, not a transformer's
  residual stream; the head is the classifier's Linear alone (their `Unembed` applies the final norm first: a ViT's
  `encoder.ln` is not applied here).
- Every anchor gets a translator, the head's input too (theirs has none at the last layer: there the identity
  start has a KL of ~0 and the weight decay keeps it near).
- The val rows are not learnt from (nothing is chosen on them): val KL and agreement with the head are held out.

Where an anchor's width is not the head input's there is no identity to start from, and the variant is refused in
one line before any work (`bind`): a run predicts every anchor, and a timeline with holes would be another
timeline than the other probes'. `tuned-lens:steps=0` is the logit lens (the head read on the anchor as it is).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from featstore.errors import FeatstoreError
from featstore.probing import targets
from featstore.probing.base import LinearFit, Plan, ProbeGroup, register
from featstore.probing.lbfgs import add_row_products_, chunk_rows, row_major_zeros
from featstore.probing.translator import Head, HeadReadout, TranslatorFit, resident_head
from featstore.schema import Int, Real


@register
class TunedLens(HeadReadout):
    name = "tuned-lens"
    parameters = {
        "steps": Int(250, ge=0, le=100_000, help="SGD steps (theirs: num_steps 250); 0: the logit lens"),
        "lr_scale": Real(1.0, gt=0, le=100, help="the learning rate is lr_scale x (1 - momentum)"),
        "momentum": Real(0.9, ge=0, lt=1, help="Nesterov momentum"),
        "weight_decay": Real(1e-3, ge=0, le=1, help="torch SGD's weight decay, towards the identity"),
        "clip": Real(1.0, gt=0, help="the gradient's norm over every translator is clipped to this"),
    }
    cap_param = "steps"

    def bind(self, store, key: str, train_view: str) -> None:
        super().bind(store, key, train_view)
        width = int(self.head.weight.shape[1])
        anchors = store.anchors(key)
        other = [a for a in anchors if a.dim != width]
        if other:
            same = [a.name for a in anchors if a.dim == width]
            build = (f"build a store of those only (`featstore build --anchors {','.join(same)}`)" if same else
                     "no anchor of this store is that wide")
            raise FeatstoreError(f"variant={self.name}: {len(other)} of {len(anchors)} anchors of {key!r} are not "
                                 f"as wide as the head's input ({width}): "
                                 f"{', '.join(f'{a.name} ({a.dim})' for a in other[:4])}"
                                 f"{' ...' if len(other) > 4 else ''}; the tuned lens starts each translator at the "
                                 f"identity, which needs that width, and a run predicts every anchor: {build}, or "
                                 f"use variant=head-probe (a map into the head's input from any width)")

    def plan(self, n_fit: int) -> Plan:
        return Plan(max_epochs=1, batch_size=8192)  # `finish` takes every step before any epoch

    # anchors of a width train as one group (`HeadReadout.batches_anchors`), and every anchor is as wide: the
    # gradient is clipped over all translators together, as the reference clips it

    def make_group(self, ctxs) -> ProbeGroup:
        head = resident_head(self.name, self.head, ctxs, "each step is a full-batch gradient of rows in memory")
        return TunedLensGroup([ctx.anchor for ctx in ctxs], head, self.params)


@dataclass
class ResidualTranslators:
    """The translators of G anchors, u = h + h @ T[g] + b[g] (T [G, D, D], b [G, D]; their `nn.Linear` weight is
    T[g] transposed), and the KL of the head read on u, with its gradient. The product is taken in the cheaper order:
    the head composed into the map, logits = h @ ((I + T) W_head^T) + (b W_head^T + b_head), so a step costs
    D^2 x C, not rows x D^2; the rows' sum is the one `probing/lbfgs.py` measured thread-independent, h^T (q - p)."""

    head: Head
    t: torch.Tensor
    b: torch.Tensor

    def logits_map(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([G, D, C], [G, 1, C]): logits = h @ m + c."""
        head_t = self.head.weight.T
        return head_t + self.t @ head_t, (self.b @ head_t + self.head.bias)[:, None]

    def kl_and_gradient(self, x: torch.Tensor, p: torch.Tensor, entropy: float) -> tuple[torch.Tensor, ...]:
        """Mean KL(p || lens) over the rows x [G, n, D] (float64 [G]), and its gradient in T and b."""
        g, n, _ = x.shape
        m, c = self.logits_map()
        rows = chunk_rows(g, m.shape[2], m.dtype, x.device)
        loss = torch.zeros(g, dtype=torch.float64, device=x.device)
        grad_m, grad_c = row_major_zeros(m), torch.zeros_like(c)
        for start in range(0, n, rows):
            xc = x[:, start : start + rows]
            nll, gl = targets.nll_and_gradient_(torch.baddbmm(c, xc, m), p[start : start + rows])
            loss += nll.sum(dim=1).double()
            add_row_products_(grad_m, xc, gl)
            grad_c += gl.sum(dim=1, keepdim=True)
        weight = self.head.weight / n  # back through the head: d/dT = h^T (q - p) W_head / n
        return loss / n - entropy, grad_m @ weight, (grad_c @ weight)[:, 0]


class TunedLensGroup(ProbeGroup):
    """The translators of every anchor, trained together by the reference recipe on all train rows in memory."""

    def __init__(self, anchors: list[int], head: Head, params: dict):
        self.anchors, self.members, self.head, self.params = list(anchors), list(anchors), head, params
        self.fits: dict[int, TranslatorFit] = {}

    def step(self, x, y, is_val, report=False):
        return None  # `finish` takes every step before any epoch

    def end_epoch(self, epoch, val_x, val_y) -> None:
        return None

    def ready_to_finish(self) -> bool:
        return self.resident and bool(self.anchors)

    def finish(self, x, y, is_val, on_pass=None) -> None:
        """`steps` SGD steps of every translator on the rows x [G, n, D] (raw; all train rows) against the head's
        distributions y [n, C], as the reference's `Train.execute` takes them."""
        g, _, d = x.shape
        lens = ResidualTranslators(self.head, torch.zeros(g, d, d, device=x.device),
                                   torch.zeros(g, d, device=x.device))
        lens.t.requires_grad_(True), lens.b.requires_grad_(True)
        params, steps, momentum = [lens.t, lens.b], self.params["steps"], self.params["momentum"]
        opt = torch.optim.SGD(params, lr=self.params["lr_scale"] * (1 - momentum), momentum=momentum,
                              nesterov=momentum > 0, weight_decay=self.params["weight_decay"])
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, (steps - s) / max(1, steps)))
        entropy, history = targets.entropy(y), []
        for _ in range(steps):
            with torch.no_grad():
                loss, lens.t.grad, lens.b.grad = lens.kl_and_gradient(x, y, entropy)
            history.append(loss)
            torch.nn.utils.clip_grad_norm_(params, self.params["clip"])
            opt.step()
            schedule.step()
            if on_pass is not None:
                on_pass()
        with torch.no_grad():
            history.append(lens.kl_and_gradient(x, y, entropy)[0])
            kl = torch.stack(history, dim=1)  # [G, steps + 1]: before each step, and after the last
            eye = torch.eye(d, device=x.device)
            for i, a in enumerate(self.members):
                map_t, map_bias = eye + lens.t[i].detach(), lens.b[i].detach()
                self.fits[a] = TranslatorFit(
                    weight=(map_t @ self.head.weight.T).T.contiguous(), bias=map_bias @ self.head.weight.T +
                    self.head.bias, map_t=map_t, map_bias=map_bias, epochs=steps, train_loss=float(kl[i, -1]),
                    info={"map": "tuned lens", "init": "identity", "head_module": self.head.module,
                          "solver": "sgd", "cap": "steps", "train_kl_per_step": kl[i].tolist()})
        self.anchors = []

    def fitted(self, val_x, val_y) -> dict[int, LinearFit]:
        """Each anchor's lens, with its KL and agreement with the head's argmax on the val rows (held out)."""
        out = {}
        for a in self.members:
            if a not in self.fits:
                raise FeatstoreError("variant=tuned-lens: the lens was never trained (its rows were not resident)")
            fit = self.fits[a]
            logits = val_x[a].to(fit.weight.device) @ fit.weight.T + fit.bias
            fit.val_loss = float(targets.nll(torch.log_softmax(logits, dim=-1)[None], val_y).double().mean()
                                 - targets.entropy(val_y))
            fit.val_accuracy = float((logits.argmax(dim=-1) == targets.hard(val_y)).float().mean())
            out[a] = fit
        return out
