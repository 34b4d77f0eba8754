"""featstore's public Python API (docs/python.md), the layer the CLI calls: above the jobs, below the CLI.

A store, read-only (`open_store`, api/store.py); probes fitted on in-memory arrays with the CLI's own solver
(`Probe`, api/estimator.py); the jobs, `build` and `probe` (a registered variant or any scikit-learn estimator,
landed in DuckDB like every run), and `register_probe` (api/jobs.py); the saved probes read back (`load_probe`,
api/saved.py); the results read-only (`connect`, api/results.py). Every name is imported on first use, so that
`import featstore` loads neither torch nor DuckDB: `featstore/__init__.py` resolves its names here.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["BuildConfig", "CircuitConfig", "FeatstoreError", "ImageSource", "LoadedProbe", "ModelData", "ModelSpec",
           "Probe", "ProbeConfig", "ProbeResult", "Results", "RunIdentity", "RunOptions", "Store", "StoreInfo",
           "ZooConfig", "anchors", "build", "circuits", "cka", "connect", "cost", "demo", "example_images", "export",
           "gate", "gc", "load_probe", "merge", "open_store", "probe", "register_probe", "study", "zoo"]

# name -> the module that defines it (the job records pull in torch; the API's own modules import it late)
_WHERE = {
    "BuildConfig": "featstore.workflows.build", "ProbeConfig": "featstore.workflows.probe",
    "ProbeResult": "featstore.workflows.probe", "FeatstoreError": "featstore.errors",
    "RunIdentity": "featstore.records",
    "ImageSource": "featstore.compute.specs", "ModelSpec": "featstore.compute.specs",
    "RunOptions": "featstore.compute.specs",
    "Store": "featstore.api.store", "ModelData": "featstore.api.store", "open_store": "featstore.api.store",
    "Probe": "featstore.api.estimator", "ProbeInputError": "featstore.api.estimator",
    "ProbeTypeError": "featstore.api.estimator",
    "build": "featstore.api.jobs", "probe": "featstore.api.jobs", "register_probe": "featstore.api.jobs",
    **dict.fromkeys(("default_name", "estimator_digest"), "featstore.probing.estimator_variant"),
    "LoadedProbe": "featstore.api.saved", "load_probe": "featstore.api.saved",
    "Results": "featstore.api.results", "connect": "featstore.api.results", "runs_written": "featstore.api.results",
    "Sweep": "featstore.api.results", "ImageTimeline": "featstore.api.results",
    "ExitSimulation": "featstore.api.results", "TapGrid": "featstore.api.results",
    "Verification": "featstore.api.store",
    **dict.fromkeys(("StoreInfo", "ImagesInfo", "ModelInfo", "ViewInfo", "AnchorInfo", "Damaged"),
                    "featstore.store.summary"),
    **dict.fromkeys(("StoredProbe", "StoredAnchor"), "featstore.store.probes"),
    "split_options": "featstore.compute.specs",
    "CircuitConfig": "featstore.compute.attribution", "ZooConfig": "featstore.workflows.zoo",
    **dict.fromkeys(("anchors", "merge", "export", "gc", "cost", "circuits", "cka", "gate", "zoo", "study", "demo",
                     "example_images"), "featstore.api.tasks"),
}


def __getattr__(name: str) -> Any:
    """A public name, imported from its module when first asked for."""
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
