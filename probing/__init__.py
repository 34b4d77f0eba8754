"""Probe variants (one class per file) and the streaming trainer that fits all anchors in one pass."""

from featstore.probing.base import VARIANTS, AnchorProbe, FittedProbe, ProbeVariant, get_variant, register
from featstore.probing.linear import Linear
from featstore.probing.paper import Paper
from featstore.probing.projected import Projected

__all__ = ["VARIANTS", "AnchorProbe", "FittedProbe", "Linear", "Paper", "ProbeVariant", "Projected",
           "get_variant", "register"]
