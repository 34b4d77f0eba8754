"""The jobs from Python: `build` and `probe` (`featstore build`, `featstore probe`), a probe run of any
scikit-learn estimator (its variant, group and fit), and `register_probe` for user variants."""

from __future__ import annotations

import copy
import hashlib
import json
import pickle
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from featstore.errors import FeatstoreError

if TYPE_CHECKING:
    from featstore.workflows.build import BuildConfig, BuildResult
    from featstore.workflows.probe import ProbeConfig, ProbeResult


def _canonical(value: Any) -> Any:
    """A JSON-ready form of an estimator's settings, complete and stable across processes: an object with
    `get_params` as its class and its own parameters (recursively, so a Pipeline's steps are spelled in full,
    where scikit-learn's repr elides past ~700 characters), containers element-wise, arrays by dtype, shape and
    a digest of their bytes, anything else by its class and a digest of its pickle (or its repr)."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if np.isfinite(value) else repr(value)
    if isinstance(value, np.generic):
        return _canonical(value.item())
    if isinstance(value, type) or callable(value) and not hasattr(value, "get_params"):
        return {"callable": f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}"}
    if hasattr(value, "get_params"):
        return {"class": f"{type(value).__module__}.{type(value).__qualname__}",
                "params": {str(k): _canonical(v) for k, v in sorted(value.get_params(deep=False).items())}}
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, np.ndarray):
        return {"array": str(value.dtype), "shape": list(value.shape),
                "sha256": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()}
    try:
        blob = pickle.dumps(value)
    except Exception:
        blob = repr(value).encode()
    return {"object": f"{type(value).__module__}.{type(value).__qualname__}",
            "sha256": hashlib.sha256(blob).hexdigest()}


def estimator_digest(estimator: Any) -> str:
    """sha256 of the estimator's full settings (`_canonical`): what identifies an estimator probe's runs, so that
    PCA(1) and PCA(8) in otherwise equal pipelines are two runs. Without `get_params`, the digest of its pickle."""
    if hasattr(estimator, "get_params"):
        text = json.dumps(_canonical(estimator), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()
    return hashlib.sha256(pickle.dumps(estimator)).hexdigest()


def default_name(estimator: Any) -> str:
    """An estimator's runs' name when none is given: its class name, lower case, and 8 hex digits of its digest
    ('pipeline-3f2a9c01'), so two estimators of one class never take each other's runs."""
    from featstore.probing.base import PROBE_NAME

    stem = re.sub(r"[^a-z0-9_.-]+", "-", type(estimator).__name__.lower()).strip("-._")[:48] or "estimator"
    name = f"{stem}-{estimator_digest(estimator)[:8]}"
    assert PROBE_NAME.fullmatch(name), name
    return name


def _fitted_clone(estimator: Any, x: np.ndarray, y: np.ndarray) -> Any:
    """A fresh copy of the user's estimator (scikit-learn's `clone` when it is installed), fitted on x, y."""
    try:
        from sklearn.base import clone
    except ImportError:  # pragma: no cover - scikit-learn is a dev dependency
        fresh = copy.deepcopy(estimator)
    else:
        fresh = clone(estimator)
    return fresh.fit(x, y)


def _checked_fit(est: Any, x: np.ndarray, num_classes: int, anchor: int) -> bytes:
    """A just-fitted estimator checked before the next anchor is fitted, and its pickle: its `classes_` must be
    class indices of the store (0..C-1; [10, 20, 30, 40] on a 4-class store would land labels the store does not
    have), its `predict_proba` one column per class, and it must pickle (the store keeps it so)."""
    where = f"variant: the fitted {type(est).__name__} of anchor {anchor}"
    proba = np.asarray(est.predict_proba(x[:2]))
    classes = getattr(est, "classes_", None)
    classes = np.arange(proba.shape[1] if proba.ndim == 2 else 0) if classes is None else np.asarray(classes)
    if proba.ndim != 2 or proba.shape[1] != len(classes) or proba.shape[1] < 2:
        raise FeatstoreError(f"{where}: predict_proba gives shape {proba.shape} for 2 rows where one column per "
                             f"class ({len(classes)}{', its classes_' if hasattr(est, 'classes_') else ''}, at "
                             f"least 2) belongs; nothing was written")
    if not (np.issubdtype(classes.dtype, np.integer) or np.issubdtype(classes.dtype, np.floating)
            and np.all(np.mod(classes, 1) == 0)) or classes.min() < 0 or classes.max() >= num_classes:
        shown_classes = ", ".join(map(str, classes[:6].tolist())) + (" …" if len(classes) > 6 else "")
        raise FeatstoreError(f"{where}: classes_ [{shown_classes}] are not class indices of the store's {num_classes} "
                             f"classes (0..{num_classes - 1}); nothing was written")
    try:
        return pickle.dumps(est)
    except Exception as e:
        raise FeatstoreError(f"{where} does not pickle ({type(e).__name__}: {e}), and the store keeps each fit "
                             f"pickled; nothing was written") from None


def _estimator_classes():
    """The variant, group and fit of an estimator probe (they subclass the probing layer's, imported late)."""
    import torch

    from featstore.probing.base import FittedProbe, Plan, ProbeGroup, ProbeVariant

    @dataclass(kw_only=True)
    class Fit(FittedProbe):
        """A fitted estimator of one anchor: predicts by its predict_proba; the store keeps it pickled."""

        estimator: Any
        pickled: bytes = b""  # the estimator pickled once, when fitted: what the store keeps, and what the
        # sha256 in its record (`pickle_sha256`, in the run's probe_fits rows) is of

        def predict(self, x):
            proba = np.asarray(self.estimator.predict_proba(x.detach().cpu().numpy()))
            best = proba.argmax(axis=1)
            classes = np.asarray(getattr(self.estimator, "classes_", np.arange(proba.shape[1])))
            return (torch.from_numpy(classes[best].astype(np.int64)),
                    torch.from_numpy(proba[np.arange(len(best)), best].astype(np.float32)))

        def arrays(self):
            return {"estimator": np.frombuffer(self.pickled or pickle.dumps(self.estimator), dtype=np.uint8).copy()}

    class Group(ProbeGroup):
        """Fits a clone per anchor on the train rows, in store order, all at once (rows resident) or gathered from
        one epoch of batches (rows streamed)."""

        def __init__(self, ctxs, estimator):
            self.anchors, self.estimator, self.fits = [c.anchor for c in ctxs], estimator, {}
            self.num_classes = ctxs[0].num_classes
            self.seen: dict[int, list] = {a: [] for a in self.anchors}
            self.pickles: dict[int, bytes] = {}

        def _fit(self, a: int, x: np.ndarray, y: np.ndarray) -> None:
            self.fits[a] = _fitted_clone(self.estimator, x, y)
            self.pickles[a] = _checked_fit(self.fits[a], x, self.num_classes, a)

        def ready_to_finish(self):
            return bool(self.anchors)

        def finish(self, x, y, is_val, on_pass=None):
            labels = y.cpu().numpy()
            for i, a in enumerate(self.anchors):
                self._fit(a, x[i].cpu().numpy(), labels)
            self.anchors = []

        def step(self, x, y, is_val, report=False):
            for i, a in enumerate(self.anchors):
                self.seen[a].append((x[i].cpu().numpy(), y.cpu().numpy()))

        def end_epoch(self, epoch, val_x, val_y):
            for a in self.anchors:
                xs, ys = zip(*self.seen.pop(a), strict=True)
                self._fit(a, np.concatenate(xs), np.concatenate(ys))
            self.anchors = []

        def fitted(self, val_x, val_y):
            out = {}
            for a, est in self.fits.items():
                blob = self.pickles[a]
                fit = Fit(estimator=est, pickled=blob, epochs=1,
                          info={"estimator": repr(est), "pickle_sha256": hashlib.sha256(blob).hexdigest()})
                proba = np.asarray(est.predict_proba(val_x[a].cpu().numpy()))
                truth = val_y.cpu().numpy()
                classes = list(getattr(est, "classes_", range(proba.shape[1])))
                column = np.array([classes.index(t) if t in classes else -1 for t in truth])
                seen = column >= 0
                picked = proba[np.flatnonzero(seen), column[seen]]
                fit.val_loss = float(-np.log(np.clip(picked, 1e-12, 1)).mean()) if seen.all() else float("nan")
                fit.val_accuracy = float((np.asarray(classes)[proba.argmax(axis=1)] == truth).mean())
                out[a] = fit
            return out

    class Variant(ProbeVariant):
        """A scikit-learn style estimator as a probe variant: `estimator` is set per run by `probe`."""

        name = "estimator"
        estimator: ClassVar[Any] = None
        label_params = ("estimator", "estimator_sha256")

        def __init__(self, **given):
            super().__init__(**given)
            # what identifies the runs: the digest of the full settings (a repr is for reading; scikit-learn's
            # elides past ~700 characters, so two pipelines could share one)
            self.params = {**self.params, "estimator": repr(self.estimator),
                           "estimator_sha256": estimator_digest(self.estimator)}

        def plan(self, n_fit):
            return Plan(max_epochs=1, batch_size=max(1, n_fit), train_on_val=False)

        def make_group(self, ctxs):
            return Group(ctxs, self.estimator)

        def batches_anchors(self):
            return True

    return Variant, Fit


class _Lazy:
    classes: tuple | None = None


def _estimator_variant():
    if _Lazy.classes is None:
        _Lazy.classes = _estimator_classes()
    return _Lazy.classes


def _is_estimator_fit(fitted: Any) -> bool:
    return _Lazy.classes is not None and isinstance(fitted, _Lazy.classes[1])



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
            raise FeatstoreError(f"name={name!r}: a registered variant's runs are named by the variant; name is for "
                                 f"an estimator")
        config = ProbeConfig(variant=variant or "linear", **fields)
    return _said(probe_job(config))


def _said(result: ProbeResult) -> ProbeResult:
    """Warn of every run the job replaced (the CLI says it on its own line; in Python this is the word)."""
    import warnings

    from featstore.errors import RunReplaced

    for run_id in result.replaced:
        warnings.warn(f"replaced run {run_id}: the database held a run of that id, and it is this job's now",
                      RunReplaced, stacklevel=3)
    return result


def _estimator_probe(variant: Any, name: str | None, fields: dict[str, Any]) -> ProbeResult:
    """An estimator's runs, every check that needs no fit done first."""
    from featstore.probing.base import VARIANTS, check_probe_name, register
    from featstore.workflows.probe import ProbeConfig, probe_job

    if isinstance(variant, type):
        raise FeatstoreError(f"variant={variant.__name__}: give an instance ({variant.__name__}()), not the class")
    if not (callable(getattr(variant, "fit", None)) and callable(getattr(variant, "predict_proba", None))):
        raise FeatstoreError(f"variant {variant!r}: give a registered variant name or an estimator with fit(X, y) "
                             f"and predict_proba(X)")
    try:
        pickle.dumps(variant)  # its fits are kept pickled: found now, not after every anchor is fitted
    except Exception as e:
        raise FeatstoreError(f"variant={type(variant).__name__}(...) does not pickle ({type(e).__name__}: {e}), and "
                             f"the store keeps each fit pickled; nothing was fitted") from None
    name = check_probe_name(name if name is not None else default_name(variant))
    if name in VARIANTS:
        raise FeatstoreError(f"name {name!r} is a registered probe variant; give the estimator's runs another name")
    cfg = ProbeConfig(variant=name, **fields)
    if cfg.cross_fit:
        raise FeatstoreError("an estimator probe fits once on the train rows; cross_fit is for registered variants")
    base = _estimator_variant()[0]
    cls = register(type(f"Estimator_{name}", (base,), {"name": name, "estimator": variant}))
    try:
        return probe_job(cfg)
    finally:
        VARIANTS.pop(cls.name, None)
