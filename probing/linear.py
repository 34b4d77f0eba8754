"""`linear` (default): a converged, well-regularised multinomial logistic regression per anchor.

Streaming SGD with momentum and a cosine schedule on standardised features. Step sizes are set per anchor
from the top eigenvalue of the standardised train covariance (power iteration on a sample), so one small
grid of dimensionless learning rates fits every anchor width. Pooled activations are often strongly
correlated (top eigenvalue tens of times the mean): SGD then crawls along every other direction (measured:
85% vs scikit-learn's 96% on digits at a ResNet stem). Such anchors are preconditioned by shrinking the top
of the spectrum towards the bulk, z = x P with P = (C/mean + I)^(-1/2) from the sample covariance C; anchors
with a flat spectrum are left alone, where an estimated P would only add sampling noise.

Weight decay is 1/N, the per-sample strength of scikit-learn's default C=1. Several heads train in the same
pass (DINOv2-style): "main" heads on the train rows pick the learning rate on the val rows, and each has a
"twin" with the same settings that also learns from the val rows; the chosen main head's twin is the probe,
so no training row is lost to selection (measured: selecting first and adding the val rows only later cost
up to 3 pp on 7k rows). The step budget has a floor (`min_steps`) so that small sets still converge.
"""
from __future__ import annotations

import math

import torch

from featstore.probing.base import AnchorContext, AnchorProbe, FittedProbe, Plan, ProbeVariant, register

PRECONDITION_ABOVE = 8.0  # top eigenvalue / mean eigenvalue beyond which an anchor is preconditioned


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


@register
class Linear(ProbeVariant):
    name = "linear"

    def __init__(self, epochs: int = 8, batch_size: int = 256, min_steps: int = 250, lr_low: float = 0.15,
                 lr_high: float = 0.5, momentum: float = 0.9):
        super().__init__(epochs=epochs, batch_size=batch_size, min_steps=min_steps, lr_low=lr_low,
                         lr_high=lr_high, momentum=momentum)
        self.lrs = (lr_low, lr_high)

    def plan(self, n_fit: int) -> Plan:
        b = self.params["batch_size"]
        steps_per_epoch = max(1, math.ceil(n_fit / b))
        epochs = max(self.params["epochs"], math.ceil(self.params["min_steps"] / steps_per_epoch))
        return Plan(epochs=epochs, batch_size=b, train_on_val=True)

    def make(self, ctx: AnchorContext) -> AnchorProbe:
        return MultiHeadProbe(ctx, self.lrs, self.params["momentum"])


class MultiHeadProbe(AnchorProbe):
    """2H heads as one [D, 2H*C] matrix: columns [0, H*C) learn from train rows only, [H*C, 2H*C) are their
    twins, which also learn from the val rows."""

    def __init__(self, ctx: AnchorContext, lrs: tuple[float, ...], momentum: float):
        self.ctx, self.momentum, self.h = ctx, momentum, len(lrs)
        dev, c = ctx.device, ctx.num_classes
        self.mean, self.std = ctx.stats.mean.to(dev), ctx.stats.std.to(dev)
        self.inv_std = 1.0 / self.std
        self.shift = -self.mean * self.inv_std
        sample = (ctx.stats.sample.to(dev) - self.mean) / self.std
        lam = top_eigenvalue(sample, seed=ctx.seed)
        self.precondition: torch.Tensor | None = None
        if lam > PRECONDITION_ABOVE and len(sample) > 1:
            self.precondition = spectrum_preconditioner(sample)
            lam = top_eigenvalue(sample @ self.precondition, seed=ctx.seed)
        self.lrs = lrs
        self.lr = torch.tensor([r / lam for r in lrs] * 2, device=dev).repeat_interleave(c)
        wd = torch.tensor([1.0 / ctx.n_train] * self.h + [1.0 / ctx.n_fit] * self.h, device=dev)
        self.wd = wd.repeat_interleave(c)
        self.w = torch.zeros(ctx.dim, 2 * self.h * c, device=dev)
        self.b = torch.zeros(2 * self.h * c, device=dev)
        self.vw, self.vb = torch.zeros_like(self.w), torch.zeros_like(self.b)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        xs = torch.addcmul(self.shift, x, self.inv_std)  # (x - mean) / std in one pass
        return xs if self.precondition is None else xs @ self.precondition

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return (self._features(x) @ self.w + self.b).view(len(x), 2 * self.h, self.ctx.num_classes)

    def step(self, x, y, is_val, progress, report=False):
        xs = self._features(x)
        n, heads = len(x), 2 * self.h
        p = torch.softmax(torch.addmm(self.b, xs, self.w).view(n, heads, -1), dim=-1)
        target = y.view(n, 1, 1).expand(n, heads, 1)
        stats = None
        if report:
            stats = (-torch.log(p[:, :1].gather(2, target[:, :1]).clamp_min(1e-12)).mean(),
                     (p[:, 0].argmax(dim=-1) == y).float().mean())
        p.scatter_add_(2, target, torch.full((n, heads, 1), -1.0, device=p.device))  # softmax - onehot
        p[:, : self.h].mul_(((~is_val).to(p.dtype) / n)[:, None, None])  # main heads never learn from val rows
        p[:, self.h :].div_(n)
        grad = p.view(n, -1)
        scale = 0.5 * (1.0 + math.cos(math.pi * progress))
        self.vw.addmm_(xs.T, grad, beta=self.momentum).addcmul_(self.w, self.wd)  # momentum in the matmul
        self.vb.mul_(self.momentum).add_(grad.sum(dim=0))
        self.w.addcmul_(self.vw, self.lr, value=-scale)
        self.b.addcmul_(self.vb, self.lr, value=-scale)
        return stats

    def fitted(self, val_x, val_y) -> FittedProbe:
        c = self.ctx.num_classes
        logits = self._logits(val_x)[:, : self.h]
        correct = (logits.argmax(dim=-1) == val_y[:, None]).float().mean(dim=0)
        losses = torch.nn.functional.cross_entropy(logits.permute(0, 2, 1), val_y[:, None].expand(-1, self.h),
                                                   reduction="none").mean(dim=0)
        best = min(range(self.h), key=lambda i: (-float(correct[i]), float(losses[i])))
        cols = slice((self.h + best) * c, (self.h + best + 1) * c)
        w = self.w[:, cols] if self.precondition is None else self.precondition @ self.w[:, cols]
        w = w / self.std[:, None]
        b = self.b[cols] - self.mean @ w
        info = {"lr": self.lrs[best], "preconditioned": self.precondition is not None,
                "val_accuracy": float(correct[best]), "val_loss": float(losses[best]),
                "val_accuracy_per_lr": dict(zip(map(str, self.lrs), map(float, correct), strict=True))}
        return FittedProbe(w.T.contiguous(), b.contiguous(), info)
