"""`projected`: capacity control. Every anchor is first projected to a common width by a seeded Gaussian
random matrix (anchors already that narrow or narrower are kept as they are), then fit like `linear`, so
that wide and narrow anchors are compared with probes of equal capacity."""

from __future__ import annotations

import torch

from featstore.probing.base import register
from featstore.probing.linear import Linear


@register
class Projected(Linear):
    name = "projected"
    label_params = ("dim",)

    def __init__(self, dim: int = 256, **linear_params):
        super().__init__(**linear_params)
        self.params["dim"] = dim

    @property
    def label(self) -> str:
        return f"projected{self.params['dim']}"

    def projection(self, dim: int, anchor: int, seed: int) -> torch.Tensor | None:
        target = self.params["dim"]
        if dim <= target:
            return None
        gen = torch.Generator().manual_seed(seed * 1000 + anchor)
        return torch.randn(dim, target, generator=gen) / target**0.5
