"""Probe variants (one class per file) and the streaming trainer that fits all anchors in one pass.

A variant from elsewhere registers with `register_probe` (user code), or through the `featstore.probes`
entry-point group of an installed package (`name = "module:Class"`), which is read when this package is imported,
so `featstore probe --variant NAME` finds it.
"""

import warnings
from importlib.metadata import entry_points

from featstore.errors import FeatstoreWarning
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

ENTRY_POINTS = "featstore.probes"

__all__ = ["ENTRY_POINTS", "VARIANTS", "AnchorProbe", "FittedProbe", "Knn", "LensDirect", "Linear", "LinearFit",
           "Paper", "ProbeVariant", "Projected", "Translator", "get_variant", "register", "register_probe"]


def register_probe(cls: type[ProbeVariant]) -> type[ProbeVariant]:
    """Make a `ProbeVariant` subclass known by its `name` (a decorator too); anything else is refused now rather
    than failing when a run asks for it."""
    if not (isinstance(cls, type) and issubclass(cls, ProbeVariant)) or not isinstance(getattr(cls, "name", None), str):
        raise TypeError(f"register_probe takes a ProbeVariant subclass with a `name`, not {cls!r}")
    return register(cls)


def _load_entry_points() -> None:
    """Register every variant the installed packages declare; one that fails to load is a warning, not a broken
    featstore."""
    for point in entry_points(group=ENTRY_POINTS):
        try:
            register_probe(point.load())
        except Exception as e:  # a plug-in's own bug must not stop the other variants
            warnings.warn(f"probe variant {point.name} ({point.value}) from entry point group {ENTRY_POINTS} was "
                          f"not registered: {type(e).__name__}: {e}", FeatstoreWarning, stacklevel=2)


_load_entry_points()
