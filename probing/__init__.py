"""Probe variants (one class per file) and the streaming trainer that fits all anchors in one pass."""

from featstore.probing.base import (
    VARIANTS,
    AnchorProbe,
    FittedProbe,
    LinearFit,
    ProbeVariant,
    get_variant,
    register,
)
from featstore.probing.knn import Knn
from featstore.probing.lens import LensDirect
from featstore.probing.linear import Linear
from featstore.probing.paper import Paper
from featstore.probing.projected import Projected
from featstore.probing.translator import Translator

__all__ = ["VARIANTS", "AnchorProbe", "FittedProbe", "Knn", "LensDirect", "Linear", "LinearFit", "Paper",
           "ProbeVariant", "Projected", "Translator", "get_variant", "register"]
