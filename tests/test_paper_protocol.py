"""The `paper` probe is torch.optim.SGD (momentum 0.9, weight decay 1e-4, cosine decay from lr 0.1) on the
cross-entropy: its early-stopping head learns from train rows only, the returned head from train + val rows."""

from __future__ import annotations

import math

import torch

from featstore.probing.base import AnchorContext, FeatureStats
from featstore.probing.paper import Paper


def _reference(x, y, batches, rows_of, steps, c, seed):
    """nn.Linear + torch.optim.SGD, the paper's settings, lr set per step by the cosine schedule."""
    bound = 1.0 / x.shape[1] ** 0.5
    gen = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(x.shape[1], c)
    with torch.no_grad():
        lin.weight.copy_(((torch.rand(x.shape[1], c, generator=gen) * 2 - 1) * bound).T)
        lin.bias.copy_((torch.rand(c, generator=gen) * 2 - 1) * bound)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    for i, (xb, yb, val) in enumerate(batches):
        keep = rows_of(val)
        for group in opt.param_groups:
            group["lr"] = 0.1 * 0.5 * (1 + math.cos(math.pi * i / steps))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(lin(xb[keep]), yb[keep]).backward()
        opt.step()
    return lin.weight.detach(), lin.bias.detach()


def test_paper_heads_are_torch_sgd_on_their_rows():
    torch.manual_seed(0)
    n, d, c, steps = 64, 6, 4, 12
    x, y = torch.randn(n, d) * 3, torch.randint(0, c, (n,))
    is_val = torch.arange(n) % 5 == 0
    stats = FeatureStats(torch.zeros(d), torch.ones(d), x)
    ctx = AnchorContext(anchor=0, dim=d, num_classes=c, n_train=int((~is_val).sum()), n_fit=n, stats=stats,
                        device=torch.device("cpu"), seed=3)
    probe = Paper().make(ctx)
    batches = [(x[i % 4 * 16 : i % 4 * 16 + 16], y[i % 4 * 16 : i % 4 * 16 + 16], is_val[i % 4 * 16 : i % 4 * 16 + 16])
               for i in range(steps)]
    for xb, yb, val in batches:
        probe.step(xb, yb, val)
    budget = 100  # 100 epochs of one batch: the cosine runs over the whole epoch budget
    main_w, main_b = _reference(x, y, batches, lambda val: ~val, budget, c, 3)
    twin_w, twin_b = _reference(x, y, batches, lambda val: torch.ones_like(val), budget, c, 3)
    assert torch.allclose(probe.w[:, :c].T, main_w, atol=1e-5) and torch.allclose(probe.b[:c], main_b, atol=1e-5)
    assert torch.allclose(probe.w[:, c:].T, twin_w, atol=1e-5) and torch.allclose(probe.b[c:], twin_b, atol=1e-5)

    probe.end_epoch(0, x[is_val], y[is_val])
    fitted = probe.fitted(x[is_val], y[is_val])
    assert torch.allclose(fitted.weight, twin_w, atol=1e-5) and fitted.record()["trained_on"] == "train+val"
    assert Paper(train_on_val=0).plan(100).train_on_val is False
