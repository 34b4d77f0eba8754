"""featstore: a feature store of pooled anchor activations, and the analytics of when a network decides.

The public API (docs/python.md) is the names in `__all__`, defined in `featstore.api` (the api/ folder, a layer
above the jobs) and imported on first use, so that `import featstore` loads neither torch nor DuckDB.
"""

__version__ = "0.1.0"

_API = ("BuildConfig", "FeatstoreError", "ImageSource", "LoadedProbe", "ModelData", "ModelSpec", "Probe",
        "ProbeConfig", "ProbeResult", "Results", "RunOptions", "Store", "build", "connect", "load_probe", "open_store",
        "probe", "register_probe")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from featstore import api

        return getattr(api, name)
    raise AttributeError(f"module 'featstore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})

