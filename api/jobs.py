"""The jobs from Python: `build` and `probe` (`featstore build`, `featstore probe`), a probe run of any
scikit-learn estimator (its variant is `featstore.probing.estimator_variant`'s), and `register_probe` for user
variants. (The jobs' and the probes' modules load torch: each function imports what it runs.)"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from featstore.errors import FeatstoreError, RunReplaced
from featstore.schema import VARIANT

if TYPE_CHECKING:
    from featstore.workflows.build import BuildConfig, BuildResult
    from featstore.workflows.probe import ProbeConfig, ProbeResult


def register_probe(cls: type) -> type:
    """Register a native (streaming) probe variant from user code: a `ProbeVariant` subclass with a unique `name`
    (usable as a decorator); `featstore probe --variant NAME` finds it once its module is imported, or through the
    `featstore.probes` entry-point group when an installed package declares it."""
    from featstore.probing import register_probe as register

    return register(cls)


def _config_or_fields(kind: str, config: Any, given: dict[str, Any]) -> None:
    """A config and fields in one call would drop the fields (the config is complete): refused in one line."""
    if config is not None and given:
        raise FeatstoreError(f"{kind}: give a {type(config).__name__} or its fields, not both (the config already "
                             f"holds every field; {', '.join(f'{k}=' for k in given)} would be dropped): use "
                             f"dataclasses.replace(config, ...) to change some")


def check_build_choices(views: str, anchors: str | None = None, taps: str | None = None) -> None:
    """Refuse, before torch loads, what a build refuses that needs no model: an unknown view, `taps` with
    `anchors`, an anchor list that names one twice, puts `input` after another or has fewer than two."""
    from featstore.images.views import parse_views
    from featstore.nets.anchors import check_anchor_choice

    parse_views(views)
    check_anchor_choice(anchors, taps)


def build(config: BuildConfig | None = None, /, **fields: Any) -> BuildResult:
    """Build (or resume) one model's views in a store: `featstore build`. Give a `BuildConfig`, or its fields
    (model=ModelSpec(...), images=ImageSource(...), store=..., run=RunOptions(...), ...), not both."""
    from featstore.workflows.build import BuildConfig
    from featstore.workflows.build import build as run_build

    _config_or_fields("build", config, fields)
    return run_build(config if config is not None else BuildConfig(**fields))


def probe(config: ProbeConfig | None = None, /, *, variant: Any = None, name: str | None = None,
          **fields: Any) -> ProbeResult:
    """Fit one probe per anchor and land every prediction in DuckDB: `featstore probe`. Give a `ProbeConfig`, or
    its fields, not both. Returns a `ProbeResult` (iterating it gives the run ids, as the list it once was); each
    run that replaced one of the same id in the database is also a `FeatstoreWarning` naming it.

    `variant` (default 'linear') is a registered variant ('linear', 'knn:k=10', ...) or any object with
    scikit-learn's `fit(X, y)` and `predict_proba(X)`: a clone of it is fitted per anchor on the train rows' raw
    stored features (float32; wrap it in a Pipeline with a StandardScaler to standardise), its runs are named
    `name` (default: its class name, lower case, and 8 hex digits of the digest of its full settings,
    'pipeline-3f2a9c01'), and its fits are kept in the store, pickled, for `load_probe`. The estimator is checked
    before the first fit (an instance, not a class; it pickles) and each fit before the next (its classes_ are
    the store's class indices; predict_proba one column per class)."""
    from featstore.workflows.probe import ProbeConfig, probe_job

    given = {**({"variant": variant} if variant is not None else {}), **({"name": name} if name is not None else {}),
             **fields}
    _config_or_fields("probe", config, given)
    if config is None and not isinstance(variant, str | None):
        return _said(_estimator_probe(variant, name, fields))
    if config is None:
        if name is not None:
            raise FeatstoreError("a registered variant's runs are named by the variant; name is for "
                                 "an estimator", field="name", value=name)
        config = ProbeConfig(variant=variant or VARIANT, **fields)
    return _said(probe_job(config))


def _said(result: ProbeResult) -> ProbeResult:
    """Warn of every run the job replaced (the CLI says it on its own line; in Python this is the word)."""
    for run_id in result.replaced:
        warnings.warn(f"replaced run {run_id}: the database held a run of that id, and it is this job's now",
                      RunReplaced, stacklevel=3)
    return result


def _estimator_probe(variant: Any, name: str | None, fields: dict[str, Any]) -> ProbeResult:
    """An estimator's runs: the variant made for this job (every check that needs no fit done first) and handed
    to the job as it is; the registry of variants is not touched."""
    from featstore.probing.estimator_variant import EstimatorVariant
    from featstore.workflows.probe import ProbeConfig, probe_job

    cfg = ProbeConfig(variant=EstimatorVariant(variant, name), **fields)
    if cfg.cross_fit:
        raise FeatstoreError("an estimator probe fits once on the train rows; cross_fit is for registered variants")
    return probe_job(cfg)
