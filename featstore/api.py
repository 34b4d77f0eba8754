"""featstore's public Python API (docs/python.md), the layer the CLI's `build` and `probe` call.

A store, read-only (`open_store`); probes fitted on in-memory arrays with the CLI's own solver (`Probe`); probe
runs from a registered variant or any scikit-learn estimator, landed in DuckDB like every run (`probe`); the saved
probes read back (`load_probe`); the results read-only (`connect`). Everything heavy (torch, DuckDB, the jobs) is
imported inside the functions, so `import featstore` stays light: `featstore/__init__.py` resolves these names on
first use.
"""

from __future__ import annotations

import copy
import hashlib
import json
import pickle
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
from featstore.errors import FeatstoreError
from featstore.schema import MEMORY_BUDGET, VAL_FRAC

if TYPE_CHECKING:
    import polars as pl
    import torch

    from featstore.nets.anchors import Anchor
    from featstore.probing.base import FittedProbe
    from featstore.store.reader import FeatureStore
    from featstore.workflows.build import BuildConfig, BuildResult
    from featstore.workflows.probe import ProbeConfig, ProbeResult

__all__ = ["BuildConfig", "FeatstoreError", "ImageSource", "LoadedProbe", "ModelData", "ModelSpec", "Probe",
           "ProbeConfig", "ProbeResult", "Results", "RunOptions", "Store", "build", "connect", "load_probe",
           "open_store", "probe", "register_probe"]


def __getattr__(name: str) -> Any:
    """The job records, imported only when asked for (they pull in torch)."""
    if name == "BuildConfig":
        from featstore.workflows.build import BuildConfig

        return BuildConfig
    if name == "ProbeConfig":
        from featstore.workflows.probe import ProbeConfig

        return ProbeConfig
    if name == "ProbeResult":
        from featstore.workflows.probe import ProbeResult

        return ProbeResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the store, read-only ----------------------------------------------------------------------------


class Store:
    """A featstore store opened read-only (a folder or an object-store URL): its models, and per model its data."""

    def __init__(self, location: str | Path):
        from featstore.store.reader import FeatureStore

        if isinstance(location, Path) or "://" not in str(location):  # a folder: where it is now, whatever cwd later
            location = Path(location).absolute()
        self._fs = FeatureStore(location)  # mode "r": a missing store is an error, nothing is created

    @property
    def location(self) -> str:
        return str(self._fs.location)

    @property
    def models(self) -> list[str]:
        return self._fs.models()

    def model(self, name: str) -> ModelData:
        """One model group ('resnet18' or its store key); an unknown one is an error naming those there are."""
        from featstore.store.reader import model_key

        key = model_key(name)
        self._fs.model_attrs(key)
        return ModelData(self._fs, key)

    def __repr__(self) -> str:
        return f"Store({self.location!r}, models={self.models})"


class ModelData:
    """What a store holds of one model: its anchors, views, images and the stored features (read on demand)."""

    def __init__(self, store: FeatureStore, key: str):
        self._fs, self.key = store, key

    @property
    def anchors(self) -> list[Anchor]:
        return self._fs.anchors(self.key)

    @property
    def views(self) -> list[str]:
        return self._fs.views(self.key)

    @property
    def image_ids(self) -> np.ndarray:
        return self._fs.image_table()["image_id"]

    @property
    def labels(self) -> np.ndarray:
        return self._fs.image_table()["label"]

    def anchor(self, which: str | int) -> Anchor:
        """An anchor by name or index; anything else is an error listing the valid ones."""
        anchors = self.anchors
        names = [a.name for a in anchors]
        if isinstance(which, str) and which in names:
            return anchors[names.index(which)]
        if isinstance(which, int | np.integer) and not isinstance(which, bool) and 0 <= which < len(anchors):
            return anchors[int(which)]
        raise FeatstoreError(f"anchor {which!r} of {self.key!r}: give a name or an index 0..{len(anchors) - 1} "
                             f"(the anchors: {', '.join(names)})")

    def features(self, anchor: str | int, view: str = "clean") -> np.ndarray:
        """[images, width] pooled features of one anchor, as float32 (what the probes learn from)."""
        a = self.anchor(anchor)
        return np.asarray(self._fs.read(self.key, view, a.name), dtype=np.float32)

    def skipped(self, view: str = "clean") -> np.ndarray:
        """[images] bool: rows the build could not read (the probes leave them out)."""
        return self._fs.read_skipped(self.key, view)

    def split(self, split_seed: int = 0, val_frac: float = VAL_FRAC) -> np.ndarray:
        """Per image 'train' | 'val' | 'test': the split `featstore probe` uses with these settings."""
        from featstore.probing.split import checked, make_split

        checked(split_seed=split_seed, val_frac=val_frac)  # val_frac=2.0 would mark every image val
        return make_split(self.image_ids, split_seed, val_frac=val_frac)

    def __repr__(self) -> str:
        return f"ModelData({self.key!r}, anchors={len(self.anchors)}, views={self.views})"


def open_store(location: str | Path) -> Store:
    """A store, read-only: `.models`, `.model(name)` -> anchors, views, image ids, labels, features."""
    return Store(location)


# -- probes on arrays ---------------------------------------------------------------------------------


class ProbeInputError(FeatstoreError, ValueError):
    """Arrays, labels or settings `Probe` cannot learn from or predict with: a FeatstoreError that is also the
    ValueError scikit-learn's tools (and its `check_estimator`) expect of an estimator given bad input."""


class ProbeTypeError(FeatstoreError, TypeError):
    """Features that are not numbers (an object array holding a dict): the TypeError numpy itself raises."""


def _not_fitted() -> FeatstoreError:
    """Predicting before `fit`: a FeatstoreError that is also scikit-learn's NotFittedError where scikit-learn is
    installed (what its tools catch), without featstore importing scikit-learn anywhere else."""
    message = "this Probe is not fitted yet: call fit(X, y) before predict"
    try:
        from sklearn.exceptions import NotFittedError
    except ImportError:  # pragma: no cover - scikit-learn is a dev dependency
        return ProbeInputError(message)
    if _Lazy.not_fitted is None:
        _Lazy.not_fitted = type("ProbeNotFitted", (FeatstoreError, NotFittedError), {"__module__": __name__})
    return _Lazy.not_fitted(message)


def _tensor(x: np.ndarray) -> torch.Tensor:
    import torch

    x = np.asarray(x)
    if x.ndim != 2:
        raise ProbeInputError(f"features of shape {x.shape}: give a 2-d array [rows, width]")
    x = np.ascontiguousarray(x, dtype=np.float32)
    return torch.from_numpy(x if x.flags.writeable else x.copy())  # torch warns on read-only memory (a memmap)


def _width(fitted: FittedProbe) -> int | None:
    """The feature width a fitted probe reads (None: it does not say)."""
    from featstore.probing.base import LinearFit

    if isinstance(fitted, LinearFit):
        return int(fitted.weight.shape[1])
    if _is_estimator_fit(fitted):
        width = getattr(fitted.estimator, "n_features_in_", None)
        return int(width) if isinstance(width, int | np.integer) else None
    refs = getattr(fitted, "refs_t", None)  # knn: its references, [D, n]
    return int(refs.shape[0]) if refs is not None else None


def _numbers(X: Any) -> np.ndarray:
    """X as a numeric array: sparse and complex input refused, an object array of numbers converted (one of
    anything else is numpy's own TypeError, as one line)."""
    if hasattr(X, "toarray") or type(X).__module__.startswith("scipy.sparse"):
        raise ProbeInputError(f"X is a sparse {type(X).__name__}: sparse input is not supported; pass X.toarray()")
    x = np.asarray(X)
    if np.iscomplexobj(x):
        raise ProbeInputError(f"X of dtype {x.dtype}: Complex data not supported; give real features")
    if x.dtype == object:
        try:
            x = x.astype(np.float64)
        except (TypeError, ValueError) as e:
            raise ProbeTypeError(f"X of dtype object: {e}; give numbers") from None
    return x


RESHAPE = "Reshape your data: x.reshape(1, -1) for one row, x.reshape(-1, 1) for one feature"


def _checked_rows(fitted: FittedProbe, x: np.ndarray, who: str = "LoadedProbe") -> np.ndarray:
    """`x` as 2-d rows of the width the probe was fitted at: anything else is one FeatstoreError here (in
    scikit-learn's words), not a shape error from inside torch or numpy."""
    x = _numbers(x)
    if x.ndim != 2:
        raise ProbeInputError(f"X of shape {x.shape}: give a 2-d array [rows, width] ({RESHAPE})")
    width = _width(fitted)
    if width is not None and x.shape[1] != width:
        raise ProbeInputError(f"X of shape {x.shape}: the probe was fitted on {width} features per row (X has "
                         f"{x.shape[1]} features, but {who} is expecting {width} features as input)")
    return x


def _predict(fitted: FittedProbe, x: np.ndarray, who: str = "LoadedProbe") -> tuple[np.ndarray, np.ndarray]:
    """Class index and confidence per row, as the run's predictions table holds them."""
    pred, conf = fitted.predict(_tensor(_checked_rows(fitted, x, who)))
    return pred.cpu().numpy(), conf.cpu().numpy()


def _proba(fitted: FittedProbe, x: np.ndarray, who: str = "LoadedProbe") -> np.ndarray:
    """[rows, classes] probabilities of a linear probe (softmax of W x + b) or of an estimator."""
    import torch

    from featstore.probing.base import LinearFit

    x = _checked_rows(fitted, x, who)
    if _is_estimator_fit(fitted):
        return np.asarray(fitted.estimator.predict_proba(np.asarray(x, dtype=np.float32)))
    if not isinstance(fitted, LinearFit):
        raise FeatstoreError(f"a {type(fitted).__name__} gives no class probabilities; use predict()")
    logits = _tensor(x) @ fitted.weight.T.cpu() + fitted.bias.cpu()
    return torch.softmax(logits, dim=-1).numpy()


def _refuse_non_finite(x: np.ndarray) -> np.ndarray:
    """A NaN or an infinity would be learnt into all-non-finite weights (or predict nothing): such rows are refused
    (how many, and where the first is)."""
    finite = np.isfinite(x)
    if not finite.all():
        bad = np.flatnonzero(~finite.all(axis=1))
        row = int(bad[0])
        column = int(np.flatnonzero(~finite[row])[0])
        raise ProbeInputError(f"X: {len(bad)} of {len(x)} rows hold NaN or infinity (the first, row {row}, in column "
                         f"{column}: {x[row, column]}); nothing was fitted: drop or repair those rows")
    return x


def _finite_rows(X: np.ndarray) -> np.ndarray:
    """X as a 2-d numeric array with at least two rows, one feature and every value finite, before any fit."""
    x = _numbers(X)
    if x.ndim != 2:
        raise ProbeInputError(f"X of shape {x.shape}: give a 2-d array [rows, width] ({RESHAPE})")
    if not len(x):
        raise ProbeInputError(f"X of shape {x.shape}: fit needs rows and features (0 given); nothing was fitted")
    if not x.shape[1]:
        raise ProbeInputError(f"X of shape {x.shape}: 0 feature(s) (shape={x.shape}) while a minimum of 1 is required; "
                         f"nothing was fitted")
    if len(x) < 2:
        raise ProbeInputError(f"X of shape {x.shape}: 1 sample, and fit needs 2 at least (rows to learn from and a val "
                         f"row); nothing was fitted")
    return _refuse_non_finite(x)


def _source(x: torch.Tensor, projection: torch.Tensor | None, budget: int):
    """In-memory rows in the shape of the trainer's `FeatureSource` (one anchor, one chunk, rows 0..n-1), so that
    `fit_probes` runs exactly as it does on a store."""
    from featstore.probing.source import FeatureSource

    class ArraySource(FeatureSource):
        def __init__(self) -> None:  # noqa: D401 - the attributes FeatureSource's readers use
            self.arrays, self.chunk_rows, self.device = [x], len(x), x.device
            self.projections = [projection]
            self.rows = np.arange(len(x))
            self.nbytes, self.memory_budget, self.in_memory = x.numel() * 4, budget, True
            self._where, self._cache = np.arange(len(x)), [x]

    return ArraySource()


def _column_labels(y: Any, rows: int) -> np.ndarray:
    """y as one label per row: a column vector [rows, 1] is raveled with scikit-learn's DataConversionWarning;
    [rows, classes] (a distribution per row, for `lens`) is kept; missing, non-finite or continuous labels are
    refused (scikit-learn's words: 'Unknown label type')."""
    if y is None:
        raise ProbeInputError("y is None: Probe requires y to be passed, but the target y is None")
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        import warnings

        try:
            from sklearn.exceptions import DataConversionWarning as warning
        except ImportError:  # pragma: no cover - scikit-learn is a dev dependency
            warning = UserWarning
        warnings.warn("A column-vector y was passed when a 1d array was expected: it is read as y.ravel()", warning,
                      stacklevel=3)
        y = y.ravel()
    if y.ndim not in (1, 2) or len(y) != rows:
        raise ProbeInputError(f"y of shape {y.shape}: give one label per row of X ({rows} rows)")
    if np.issubdtype(y.dtype, np.floating) or np.issubdtype(y.dtype, np.complexfloating):
        if not np.isfinite(y).all():
            raise ProbeInputError(f"y holds NaN or infinity ({int((~np.isfinite(y)).sum())} of {y.size} values): give "
                             f"a class per row")
        if y.ndim == 1 and not np.all(np.mod(y, 1) == 0):
            raise ProbeInputError("y: Unknown label type: continuous values (a regression target); give class labels")
    return y


class Probe:
    """One anchor's probe of a registered variant, fitted on arrays: a scikit-learn classifier (`fit(X, y,
    is_val=None)`, `predict`, `predict_proba`, `score`, `get_params`/`set_params`, `classes_`, scikit-learn's
    tags). It runs the trainer `featstore probe` runs, so on the rows a run learns from (train + val, `is_val`
    marking the val rows) it predicts what the run predicted.

    Without `is_val`, a seeded `val_frac` of the rows (one at least) is held out as val rows (the linear probe
    chooses its L2 strength on them, then refits on all rows). `anchor` only seeds a projected variant's projection.

    `classes_` is `np.unique(y)` (labels of any kind: 10, 20, 30 or strings), the softmax one output per class.
    `classes=C` instead fixes the label space to the class indices 0..C-1 (a store's classes, some with no row).
    `__init__` and `set_params` only store what they are given; `fit` checks it (scikit-learn's rule). Rows with
    NaN or infinity are refused before anything is fitted."""

    _own = ("variant", "seed", "val_frac", "split_seed", "anchor", "device", "threads", "memory_budget", "classes")

    def __init__(self, variant: str = "linear", *, seed: int = 0, val_frac: float = VAL_FRAC, split_seed: int = 0,
                 anchor: int = 0, device: str = "cpu", threads: int | None = 1, memory_budget: str = MEMORY_BUDGET,
                 classes: int | None = None, **params: Any):
        self.variant, self.seed, self.val_frac, self.split_seed = variant, seed, val_frac, split_seed
        self.anchor, self.device, self.threads, self.memory_budget = anchor, device, threads, memory_budget
        self.classes = classes
        self._params = dict(params)  # the variant's own parameters (C, tol, ...): private, as scikit-learn asks

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self._own}, **self._params}

    def set_params(self, **params: Any) -> Probe:
        for key, value in params.items():
            if key in self._own:
                setattr(self, key, value)
            else:
                self._params[key] = value
        return self

    def __sklearn_tags__(self):
        """scikit-learn's tags (1.6+): a classifier of dense, finite, 2-d numeric features."""
        from sklearn.utils import ClassifierTags, Tags, TargetTags

        return Tags(estimator_type="classifier", target_tags=TargetTags(required=True),
                    classifier_tags=ClassifierTags())

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "fitted_")

    def _variant(self):
        from featstore.probing.base import get_variant

        if not isinstance(self.variant, str):
            raise FeatstoreError(f"variant={self.variant!r}: give a registered variant's name ('linear', 'knn', ...)")
        variant = get_variant(self.variant)
        return type(variant)(**{**variant.params, **self._params}) if self._params else variant

    def fit(self, X: np.ndarray, y: np.ndarray, is_val: np.ndarray | None = None) -> Probe:
        """Learn from every row of X; `is_val` [rows] bool marks the rows used for model selection."""
        from featstore.probing.run import parse_bytes
        from featstore.probing.split import checked
        from featstore.probing.trainer import FitRows, fit_probes
        from featstore.runtime import resolve_device

        try:  # what __init__ and set_params stored, checked here (scikit-learn's rule)
            variant = self._variant()
            checked(split_seed=self.split_seed, val_frac=self.val_frac)
        except FeatstoreError as e:
            raise ProbeInputError(str(e)) from None
        X = _finite_rows(X)
        x = _tensor(X)
        y = _column_labels(y, len(x))
        classes, codes, targets = self._labels(y)
        if len(classes) < 2:
            raise ProbeInputError(f"y holds 1 class ({classes[0]!r}): a classifier needs 2 classes at least")
        if is_val is None:
            order = np.random.default_rng(self.split_seed).permutation(len(x))
            is_val = np.zeros(len(x), dtype=bool)
            is_val[order[: min(len(x) - 1, max(1, round(self.val_frac * len(x))))]] = True
        is_val = np.asarray(is_val, dtype=bool)
        if is_val.shape != (len(x),) or not is_val.any() or is_val.all():
            raise ProbeInputError(f"is_val: give one flag per row ({len(x)}), some rows val and some not")
        device = resolve_device(self.device)
        projection = variant.projection(x.shape[1], self.anchor, self.seed)
        source = _source(x.to(device), projection, parse_bytes(self.memory_budget))
        rows = FitRows(np.flatnonzero(~is_val), np.flatnonzero(is_val), codes, targets)
        (fitted,) = fit_probes(source, variant, rows, len(classes), self.seed, False, f"Probe({self.variant})",
                               self.threads)
        self.classes_ = classes
        self.fitted_ = fitted if projection is None else fitted.unprojected(projection)
        self.n_features_in_ = int(x.shape[1])
        return self

    def _labels(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """`classes_`, each row's index into it, and the targets of a distribution per row (else None)."""
        if y.ndim == 2:  # a distribution per row, for variants that learn the model's output (`lens`)
            targets = np.asarray(y, dtype=np.float32)
            return np.arange(targets.shape[1]), targets.argmax(axis=1), targets
        if self.classes is None:
            classes, codes = np.unique(y, return_inverse=True)
            return classes, codes.astype(np.int64), None
        if isinstance(self.classes, bool) or not isinstance(self.classes, int | np.integer) or self.classes < 1:
            raise ProbeInputError(f"classes={self.classes!r}: give the number of classes, a whole number >= 1")
        if not np.issubdtype(y.dtype, np.number) or y.min() < 0 or y.max() >= self.classes:
            shown = next((v for v in y.tolist() if not (isinstance(v, int | float) and 0 <= v < self.classes)), y[0])
            raise ProbeInputError(f"y: label {shown!r} is no class index of classes={self.classes} (0.."
                             f"{self.classes - 1})")
        return np.arange(int(self.classes)), y.astype(np.int64), None

    def _fitted(self) -> FittedProbe:
        if not hasattr(self, "fitted_"):
            raise _not_fitted()
        return self.fitted_

    def _rows(self, X: np.ndarray) -> np.ndarray:
        """X as rows this fitted probe reads: its width, every value finite."""
        x = _checked_rows(self._fitted(), X, type(self).__name__)
        return _refuse_non_finite(x)

    def predict(self, X: np.ndarray) -> np.ndarray:
        fitted, x = self._fitted(), self._rows(X)
        return self.classes_[_predict(fitted, x)[0]]

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        return _proba(self._fitted(), self._rows(X))

    def score(self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> float:
        """Accuracy: the (weighted) fraction of rows whose prediction is their label (scikit-learn's score)."""
        right = self.predict(X) == _column_labels(y, len(np.asarray(X)))
        return float(np.average(right, weights=sample_weight))

    @property
    def record_(self) -> dict:
        """How the fit went (chosen C, val loss and accuracy, solver): what `probe_fits.info` holds for a run."""
        return self._fitted().record()

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"Probe({shown})"


# -- probes from any estimator ------------------------------------------------------------------------

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


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
    not_fitted: type | None = None


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


# -- saved probes ----------------------------------------------------------------------------------------


class LoadedProbe:
    """The probes of one run as the store keeps them: per anchor (name or index) `predict(anchor, X)`,
    `predict_proba(anchor, X)`; `fits[a]` lists the anchor's fits, one per cross-fit fold."""

    def __init__(self, model: ModelData, name: str, version: str | None, fits: list[list[FittedProbe]],
                 attrs: list[dict]):
        self.model, self.name, self.version, self.fits, self.attrs = model, name, version, fits, attrs

    @property
    def anchors(self) -> list[str]:
        return [a.name for a in self.model.anchors]

    def _fit(self, anchor: str | int, fold: int) -> FittedProbe:
        fits = self.fits[self.model.anchor(anchor).index]
        if isinstance(fold, bool) or not isinstance(fold, int | np.integer) or not 0 <= fold < len(fits):
            raise FeatstoreError(f"fold={fold!r}: {self.name} holds {len(fits)} fit(s) per anchor (folds "
                                 f"0..{len(fits) - 1}; a run fitted with cross_fit=K holds K)")
        return fits[int(fold)]

    def predict(self, anchor: str | int, X: np.ndarray, fold: int = 0) -> np.ndarray:
        return _predict(self._fit(anchor, fold), X)[0]

    def confidence(self, anchor: str | int, X: np.ndarray, fold: int = 0) -> np.ndarray:
        """The max probability per row: the predictions table's `conf`."""
        return _predict(self._fit(anchor, fold), X)[1]

    def predict_proba(self, anchor: str | int, X: np.ndarray, fold: int = 0) -> np.ndarray:
        return _proba(self._fit(anchor, fold), X)

    def __repr__(self) -> str:
        return f"LoadedProbe({self.model.key!r}, {self.name!r}, version={self.version!r})"


def _probe_name(key: str, run: str) -> str:
    """A run id's stored probe name, as `probe_name_for` spells it: 'm/clean/linear/seed1' -> 'linear-seed1@clean'."""
    parts = run.split("/")
    if len(parts) < 3 or parts[0] != key:
        raise FeatstoreError(f"run {run!r} is no run id of {key!r} (<model>/<view>/<variant>[/...])")
    view, label, extra = parts[1], parts[2], dict.fromkeys(("train", "cf", "seed", "streamed"), "")
    for part in parts[3:]:
        if part.startswith("train="):
            extra["train"] = part.removeprefix("train=")
        elif part == "streamed":
            extra["streamed"] = "-streamed"
        elif m := re.fullmatch(r"(cf|seed)(\d+)", part):
            extra[m[1]] = f"-{m[1]}{m[2]}"
    return label + extra["cf"] + extra["seed"] + extra["streamed"] + "@" + (extra["train"] or view)


def load_probe(store: str | Path | Store, model: str, run: str, db: str | Path | None = None, *,
               trust_pickle: bool = False) -> LoadedProbe:
    """The fitted per-anchor probes of a run, read back from the store: the version the database `db` names for
    it (issue 32: each database's runs name their own version), or without `db` the store's current one.

    What is read follows the variant the run records (the database's runs row, else the store's record of the
    probes), never the arrays the store holds. An estimator probe is a pickle, and unpickling runs whatever code it
    names: it is read only with `trust_pickle=True`, and then only bytes whose sha256 matches the one `db`
    recorded with the run (docs/python.md says what to trust)."""
    import torch

    from featstore.probing.base import LinearFit

    handle = store if isinstance(store, Store) else open_store(store)
    data = handle.model(model)
    name, version, recorded, digests = _probe_name(data.key, run), None, None, {}
    if db is not None:
        rows = Results(db).sql("SELECT probe, params FROM runs WHERE run_id = ?", [run])
        if not len(rows):
            raise FeatstoreError(f"database {db} has no run {run!r}")
        params = json.loads(rows["params"][0])
        if params.get("probe_name", name) != name:
            raise FeatstoreError(f"database {db}: its row of run {run!r} names probes {params['probe_name']!r} where "
                                 f"run {run!r} names {name!r} (the name its id spells); load_probe reads no other")
        recorded, version = (rows["probe"][0], params), params.get("probe_version")
        digests = _recorded_digests(db, run)
    root = handle._fs.root[data.key]
    if "probes" not in root or name not in root["probes"]:
        raise FeatstoreError(f"store {handle.location} holds no probes {name!r} of {data.key!r} (run {run!r}); "
                             f"`featstore probe` saves them")
    group = root["probes"][name]
    version = version or group.attrs.get("current")
    if version is not None and not (isinstance(version, str) and _NAME.fullmatch(version)):
        raise FeatstoreError(f"{f'database {db}' if db is not None else f'store {handle.location}'}: {version!r} is "
                             f"no stored-weights version of run {run!r} (a name of letters, digits, _ . -)")
    held = group if version is None else group.get(version)  # stores before issue 32 kept one unversioned set
    if held is None:
        raise FeatstoreError(f"store {handle.location}: the probes {name}/{version} of run {run!r} are gone "
                             f"(`featstore verify --db` lists such runs)")
    fits, attrs = [], []
    for anchor in data.anchors:
        g = held[anchor.name]
        attrs.append(dict(g.attrs))
        variant, variant_params = recorded or (attrs[-1].get("variant"), attrs[-1].get("params") or {})
        kept = sorted(g.array_keys())
        if "estimator" in variant_params:  # the estimator variant records its estimator's repr
            if not trust_pickle:
                raise FeatstoreError(f"run {run!r} is an estimator probe ({variant}), kept pickled, and unpickling "
                                     f"runs whatever code the pickle names: pass trust_pickle=True only if you trust "
                                     f"whoever wrote {handle.location}" + (f" and {db}" if db is not None else ""))
            if "estimator" not in kept:
                raise FeatstoreError(f"store {handle.location}: the probes {name} of run {run!r} keep no estimator "
                                     f"for anchor {anchor.name} ({', '.join(kept) or 'nothing'})")
            fits.append([_unpickled(e, digests, (fold, anchor.index), f"run {run!r}, anchor {anchor.name}", db)
                         for fold, e in enumerate(g["estimator"][:])])
        elif {"weight", "bias"} <= set(kept):
            fits.append([LinearFit(weight=torch.from_numpy(w), bias=torch.from_numpy(b))
                         for w, b in zip(g["weight"][:], g["bias"][:], strict=True)])
        else:
            raise FeatstoreError(f"run {run!r} records variant {variant}, so load_probe reads a weight and a bias, "
                                 f"and its probes of anchor {anchor.name} keep {', '.join(kept) or 'nothing'}: "
                                 f"load_probe reads linear and estimator probes (knn keeps only which rows vote)")
    return LoadedProbe(data, name, version, fits, attrs)


def _recorded_digests(db: str | Path, run: str) -> dict[tuple[int, int], str]:
    """(fold, anchor) -> the sha256 of the pickle an estimator run's fit was saved as, as the database recorded it
    when the probe was written (none in a database written before they were recorded)."""
    rows = Results(db).sql("SELECT fold, anchor, info->>'pickle_sha256' AS sha FROM probe_fits WHERE run_id = ? AND "
                           "info->>'pickle_sha256' IS NOT NULL", [run])
    return {(int(f), int(a)): sha for f, a, sha in rows.iter_rows()}


def _unpickled(values: np.ndarray, digests: dict[tuple[int, int], str], key: tuple[int, int], where: str,
               db: str | Path | None) -> FittedProbe:
    """One fold's fitted estimator from the bytes the store keeps (uint8; float32 in stores written before bytes
    stayed bytes), refused when the database recorded digests and these bytes are not the ones it recorded."""
    values = np.asarray(values)
    if values.dtype != np.uint8 and not (values.dtype == np.float32 and np.isin(values, np.arange(256)).all()):
        raise FeatstoreError(f"{where}: the store keeps {values.dtype} values where a pickle's bytes belong")
    blob = values.astype(np.uint8).tobytes()
    if digests:
        sha = hashlib.sha256(blob).hexdigest()
        if digests.get(key) != sha:
            raise FeatstoreError(f"{where}: the pickle's sha256 {sha[:16]}… differs from the one database {db} "
                                 f"recorded with the run ({(digests.get(key) or 'none')[:16]}…): the store's copy "
                                 f"is not what was written, so it is not unpickled")
    try:
        return _estimator_variant()[1](estimator=pickle.loads(blob), pickled=blob)
    except Exception as e:
        raise FeatstoreError(f"{where}: the stored estimator does not unpickle ({type(e).__name__}: {e})") from None


# -- results, read-only ----------------------------------------------------------------------------------


class Results:
    """A featstore database, read-only through the sandbox `featstore sql` uses (each query opens and closes it, so
    a probe job can write between two queries)."""

    def __init__(self, db: str | Path | Sequence[str | Path]):
        from featstore.analytics.queries import open_read_only

        self.db = [Path(d).absolute() for d in db] if isinstance(db, list | tuple) else Path(db).absolute()
        open_read_only(self.db).close()  # a missing or foreign file is an error now

    def sql(self, query: str, params: Sequence | dict | None = None) -> pl.DataFrame:
        """One statement -> a Polars DataFrame (the macros of `sql/` are there: decision_layers(2), ...)."""
        from featstore.analytics.queries import query as run_query

        return run_query(self.db, query, params)

    @property
    def runs(self) -> pl.DataFrame:
        from featstore.analytics.queries import runs

        return runs(self.db)

    def timeline(self, run: str, image_id: int) -> pl.DataFrame:
        """One image's predictions and confidences under one run, one row per anchor."""
        frame = self.sql("SELECT anchor, pred, conf FROM predictions WHERE run_id = ? AND image_id = ? "
                         "ORDER BY anchor", [run, int(image_id)])
        if not len(frame):
            raise FeatstoreError(f"no predictions of image {image_id} under run {run!r} (see .runs)")
        return frame


def connect(db: str | Path | Sequence[str | Path]) -> Results:
    """A database (or several, as one) read-only: `.sql(query)`, `.runs`, `.timeline(run, image_id)`."""
    return Results(db)

