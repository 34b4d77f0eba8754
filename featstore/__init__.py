"""featstore: a feature store of pooled anchor activations, and the analytics of when a network decides.

The public API (docs/python.md) is `featstore.api` (the api/ folder, a layer above the jobs): its names are
re-exported here and each imported on first use, so that `import featstore` loads neither torch nor DuckDB.
"""

from featstore.api import __all__ as _API

__version__ = "0.1.0"
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from featstore import api

        return getattr(api, name)
    raise AttributeError(f"module 'featstore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
