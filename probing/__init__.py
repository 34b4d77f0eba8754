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
from featstore.probing.tuned_lens import TunedLens

ENTRY_POINTS = "featstore.probes"

__all__ = ["ENTRY_POINTS", "VARIANTS", "AnchorProbe", "FittedProbe", "Knn", "LensDirect", "Linear", "LinearFit",
           "Paper", "ProbeVariant", "Projected", "Translator", "TunedLens", "get_variant", "register",
           "register_probe"]


def register_probe(cls: type[ProbeVariant]) -> type[ProbeVariant]:
    """Make a `ProbeVariant` subclass known by its `name` (a decorator too); anything else is refused now rather
    than failing when a run asks for it."""
    if not (isinstance(cls, type) and issubclass(cls, ProbeVariant)) or not isinstance(getattr(cls, "name", None), str):
        raise TypeError(f"register_probe takes a ProbeVariant subclass with a `name`, not {cls!r}")
    return register(cls)


def _load_entry_points() -> None:
    """Register every variant the installed packages declare, under the entry point's own name (the word
    `--variant` takes, as docs/python.md says): a class whose `name` differs is registered as a subclass of that
    name. One that fails to load, raises anything (SystemExit included) or is refused is a warning naming the entry
    point, never a broken or silently exiting featstore; only Ctrl-C passes through."""
    for point in entry_points(group=ENTRY_POINTS):
        try:
            cls = point.load()
            if isinstance(cls, type) and issubclass(cls, ProbeVariant) and getattr(cls, "name", None) != point.name:
                cls = type(cls.__name__, (cls,), {"name": point.name, "__module__": cls.__module__,
                                                  "__qualname__": cls.__qualname__})
            register_probe(cls)
        except (Exception, SystemExit) as e:  # a plug-in's own bug must not stop the other variants
            what = f"exited ({e.code!r})" if isinstance(e, SystemExit) else f"{type(e).__name__}: {e}"
            warnings.warn(f"probe variant {point.name!r} ({point.value}) from entry point group {ENTRY_POINTS} was "
                          f"not registered: {what}", FeatstoreWarning, stacklevel=2)


_load_entry_points()
