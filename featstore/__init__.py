"""featstore: a feature store of pooled anchor activations, and the analytics of when a network decides.

The public API (docs/python.md) is the names in `__all__`, defined in `featstore.api` and imported on first use,
so that `import featstore` loads neither torch nor DuckDB.
"""

import sys
import types

__version__ = "0.1.0"

_API = ("BuildConfig", "FeatstoreError", "ImageSource", "LoadedProbe", "ModelData", "ModelSpec", "Probe",
        "ProbeConfig", "Results", "RunOptions", "Store", "build", "connect", "load_probe", "open_store", "probe",
        "register_probe")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from featstore import api

        return getattr(api, name)
    raise AttributeError(f"module 'featstore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})


class _Package(types.ModuleType):
    """`featstore.build` is the public function, though `featstore/build.py` (the build job) is a submodule of the
    same name: importing a submodule sets the package's attribute, so here the function is a property that keeps
    the module aside (`from featstore.build import ...` reads sys.modules and is unaffected)."""

    @property
    def build(self):
        from featstore.api import build

        return build

    @build.setter
    def build(self, module: types.ModuleType) -> None:
        self.__dict__["_build_module"] = module


sys.modules[__name__].__class__ = _Package
