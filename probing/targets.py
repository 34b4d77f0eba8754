"""What a probe learns to predict, in one place: class labels [n] (int64) or probability rows [n, C] (float32,
the model's own output distribution for `learns_from = "model"`). The softmax probes' loss and gradient take
either, so `lens-direct` is `linear` with another target and the trainer never asks which."""

from __future__ import annotations

import torch


def is_soft(y: torch.Tensor) -> bool:
    return y.is_floating_point()


def hard(y: torch.Tensor) -> torch.Tensor:
    """The class each target names: the label, or the distribution's argmax (the model's own prediction)."""
    return y.argmax(dim=-1) if is_soft(y) else y


def entropy(y: torch.Tensor) -> float:
    """The targets' mean entropy (float64; 0 for labels): the part of their cross-entropy no probe can remove, so
    cross-entropy minus it is the KL a probe leaves."""
    if not is_soft(y) or len(y) == 0:
        return 0.0
    y = y.double()
    return float(-torch.special.xlogy(y, y).sum(dim=-1).mean())


def _shaped(y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Targets of the rows of `like` [G, n, ..., C] (rows on its second axis), broadcastable against it."""
    middle = [1] * (like.dim() - 3)
    return y.view(1, y.shape[0], *middle, y.shape[1] if is_soft(y) else 1)


def nll(logp: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every row, [G, n, ...], from log-probabilities [G, n, ..., C]: -log q_y for a label,
    -sum_c p_c log q_c for a distribution p (= KL(p || q) + the entropy of p, a constant of the data)."""
    target = _shaped(y, logp)
    if is_soft(y):
        return -(target * logp).sum(dim=-1)
    return -logp.gather(-1, target.expand(*logp.shape[:-1], 1)).squeeze(-1)


def nll_of(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The same cross-entropy from probabilities [G, n, ..., C] (the softmax the gradient needs anyway): for a label
    one log per row (of p_y clamped at 1e-30), so a step pays one exp pass over the classes, not log_softmax's two;
    for a distribution a log of every (clamped) probability."""
    target = _shaped(y, p)
    if is_soft(y):
        return -(target * p.clamp_min(1e-30).log()).sum(dim=-1)
    return -torch.log(p.gather(-1, target.expand(*p.shape[:-1], 1)).squeeze(-1).clamp_min(1e-30))


def nll_and_gradient_(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's cross-entropy [G, n, ...] from logits [G, n, ..., C], and in the logits' memory its gradient
    softmax * sum_c t_c - target. One exp pass over the classes (log_softmax and then exp took two: 31 of 72 ms of
    an evaluation at 1,000 classes); exact, no clamp: nll = log sum_c exp(l_c - max) * sum_c t_c - sum_c t_c (l_c -
    max). A float32 distribution's mass is 1 only to ~1e-7; the gradient is the loss's own all the same."""
    logits.sub_(logits.amax(dim=-1, keepdim=True))
    target = _shaped(y, logits)
    if is_soft(y):
        picked, mass = (target * logits).sum(dim=-1), target.sum(dim=-1, dtype=logits.dtype)
    else:
        picked, mass = logits.gather(-1, target.expand(*logits.shape[:-1], 1)).squeeze(-1), None
    total = logits.exp_().sum(dim=-1, keepdim=True)
    p = logits.div_(total) if mass is None else logits.div_(total / mass.unsqueeze(-1))
    nll = total.log().squeeze(-1) * (1 if mass is None else mass) - picked
    return nll, subtract_(p, y)


def subtract_(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """p - target in place (softmax minus one-hot, or minus the target distribution): the logits' gradient."""
    target = _shaped(y, p)
    if is_soft(y):
        return p.sub_(target)
    index = target.expand(*p.shape[:-1], 1)
    return p.scatter_add_(-1, index, torch.full(index.shape, -1.0, dtype=p.dtype, device=p.device))
