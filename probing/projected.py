"""`projected`: capacity control. Every anchor is first projected to a common width by a seeded Gaussian
random matrix (anchors already that narrow or narrower are kept as they are), then fit like `linear`, so
that wide and narrow anchors are compared with probes of equal capacity."""

from __future__ import annotations

import torch

from featstore.probing.base import register
from featstore.probing.linear import Linear
from featstore.schema import Int


@register
class Projected(Linear):
    name = "projected"
    label_params = ("dim",)
    parameters = {**Linear.parameters, "dim": Int(256, ge=1, help="width every wider anchor is projected to")}

    @property
    def label(self) -> str:
        return f"projected{self.params['dim']}"

    def projection(self, dim: int, anchor: int, seed: int) -> torch.Tensor | None:
        target = self.params["dim"]
        if dim <= target:
            return None
        gen = torch.Generator().manual_seed(seed * 1000 + anchor)
        return torch.randn(dim, target, generator=gen) / target**0.5
