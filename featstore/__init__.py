"""featstore: a feature store of pooled anchor activations, and the analytics of when a network decides.

`import featstore as fs` is the public API (docs/python.md): the names below, each from a module of the API
(`featstore.api`, the api/ folder; the jobs' records through api/configs.py), the core's records its calls take
and return, and the version. Each is imported on first use, so that `import featstore` loads neither torch, DuckDB
nor Polars; the `TYPE_CHECKING` block makes the same imports for type checkers, IDEs and readers, and `_PUBLIC`
says where each name is found at run time (tests/test_imports_followable.py checks that they and `__all__` agree).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from featstore.api.configs import BuildConfig, ProbeConfig, ProbeResult, ZooConfig
    from featstore.api.estimator import Probe
    from featstore.api.jobs import build, probe, register_probe
    from featstore.api.results import Results, connect
    from featstore.api.saved import LoadedProbe, load_probe
    from featstore.api.store import ModelData, Store, StoreInfo, open_store
    from featstore.api.tasks import (
        anchors,
        circuits,
        cka,
        cost,
        demo,
        example_images,
        export,
        gate,
        gc,
        merge,
        study,
        zoo,
    )
    from featstore.compute.attribution import CircuitConfig
    from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
    from featstore.errors import FeatstoreError
    from featstore.records import RunIdentity
    from featstore.version import __version__

# each public name -> the module it is imported from on first use
_PUBLIC = {
    "Probe": "featstore.api.estimator",
    **dict.fromkeys(("build", "probe", "register_probe"), "featstore.api.jobs"),
    **dict.fromkeys(("Results", "connect"), "featstore.api.results"),
    **dict.fromkeys(("LoadedProbe", "load_probe"), "featstore.api.saved"),
    **dict.fromkeys(("ModelData", "Store", "StoreInfo", "open_store"), "featstore.api.store"),
    **dict.fromkeys(("anchors", "circuits", "cka", "cost", "demo", "example_images", "export", "gate", "gc", "merge",
                     "study", "zoo"), "featstore.api.tasks"),
    **dict.fromkeys(("ImageSource", "ModelSpec", "RunOptions"), "featstore.compute.specs"),
    "FeatstoreError": "featstore.errors",
    "RunIdentity": "featstore.records",
    "__version__": "featstore.version",
    **dict.fromkeys(("BuildConfig", "ProbeConfig", "ProbeResult", "ZooConfig"), "featstore.api.configs"),
    "CircuitConfig": "featstore.compute.attribution",
}
__all__ = ["__version__", "BuildConfig", "CircuitConfig", "FeatstoreError", "ImageSource", "LoadedProbe", "ModelData",
           "ModelSpec", "Probe", "ProbeConfig", "ProbeResult", "Results", "RunIdentity", "RunOptions", "Store",
           "StoreInfo", "ZooConfig", "anchors", "build", "circuits", "cka", "connect", "cost", "demo",
           "example_images", "export", "gate", "gc", "load_probe", "merge", "open_store", "probe", "register_probe",
           "study", "zoo"]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module when first asked for."""
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
