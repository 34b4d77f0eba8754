"""`paper`: the source paper's probe protocol, kept exact for reproduction.

Raw (unstandardised) features, SGD with momentum 0.9, lr 0.1, weight decay 1e-4, batch 256, up to 100 epochs,
early stopping with patience 10 on val accuracy, best-val weights kept. On small sets it stops far from the
optimum (docs/design.md §5: 18% vs 52% for scikit-learn at the stem of 1.8k digits), which is why it is not the default.
"""

from __future__ import annotations

import torch

from featstore.probing.base import AnchorContext, AnchorProbe, FittedProbe, Plan, ProbeVariant, register


@register
class Paper(ProbeVariant):
    name = "paper"

    def __init__(self, epochs: int = 100, batch_size: int = 256, lr: float = 0.1, weight_decay: float = 1e-4,
                 momentum: float = 0.9, patience: int = 10):
        super().__init__(epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                         momentum=momentum, patience=patience)

    def plan(self, n_fit: int) -> Plan:
        return Plan(max_epochs=self.params["epochs"], batch_size=self.params["batch_size"])

    def make(self, ctx: AnchorContext) -> AnchorProbe:
        return SgdProbe(ctx, **{k: self.params[k] for k in ("lr", "weight_decay", "momentum", "patience")})


class SgdProbe(AnchorProbe):
    """torch.optim.SGD semantics (weight decay added to the gradient, then momentum), written out."""

    def __init__(self, ctx: AnchorContext, lr: float, weight_decay: float, momentum: float, patience: int):
        dev = ctx.device
        self.lr, self.wd, self.momentum, self.patience = lr, weight_decay, momentum, patience
        bound = 1.0 / ctx.dim**0.5  # nn.Linear's default init
        gen = torch.Generator().manual_seed(ctx.seed)
        self.w = ((torch.rand(ctx.dim, ctx.num_classes, generator=gen) * 2 - 1) * bound).to(dev)
        self.b = ((torch.rand(ctx.num_classes, generator=gen) * 2 - 1) * bound).to(dev)
        self.vw, self.vb = torch.zeros_like(self.w), torch.zeros_like(self.b)
        self.best = (-1.0, self.w.clone(), self.b.clone(), -1)
        self.history: list[float] = []
        self.stopped = False  # by patience (its criterion), not by the epoch cap

    def step(self, x, y, is_val, report=False):
        n = len(x)
        p = torch.softmax(x @ self.w + self.b, dim=-1)
        rows = torch.arange(n, device=x.device)
        stats = None
        if report:
            stats = (-torch.log(p[rows, y].clamp_min(1e-12)).mean(), (p.argmax(dim=-1) == y).float().mean())
        p[rows, y] -= 1.0
        grad = p / n
        self.vw.mul_(self.momentum).add_(x.T @ grad + self.wd * self.w)
        self.vb.mul_(self.momentum).add_(grad.sum(dim=0) + self.wd * self.b)
        self.w.sub_(self.lr * self.vw)
        self.b.sub_(self.lr * self.vb)
        return stats

    def end_epoch(self, epoch, val_x, val_y) -> bool:
        acc = float(((val_x @ self.w + self.b).argmax(dim=-1) == val_y).float().mean())
        self.history.append(acc)
        if acc > self.best[0]:
            self.best = (acc, self.w.clone(), self.b.clone(), epoch)
        self.stopped = epoch - self.best[3] >= self.patience
        return self.stopped

    def fitted(self, val_x, val_y) -> FittedProbe:
        acc, w, b, epoch = self.best
        val_loss = float(torch.nn.functional.cross_entropy(val_x @ w + b, val_y))
        return FittedProbe(w.T.contiguous(), b.clone(), {"best_epoch": epoch, "val_accuracy_history": self.history},
                           epochs=len(self.history), converged=self.stopped, val_loss=val_loss, val_accuracy=acc)
