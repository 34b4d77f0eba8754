"""`Probe`: one anchor's probe of a registered variant fitted on in-memory arrays, a scikit-learn classifier that
runs the trainer `featstore probe` runs; and the checks and predictions on arrays that saved probes share. (torch,
the probes' modules and scikit-learn, an optional dependency, are imported by the functions that use them.)"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from featstore.errors import FeatstoreError
from featstore.schema import MEMORY_BUDGET, VAL_FRAC, VARIANT

if TYPE_CHECKING:
    import torch

    from featstore.probing.base import FittedProbe


class ProbeInputError(FeatstoreError, ValueError):
    """Arrays, labels or settings `Probe` cannot learn from or predict with: a FeatstoreError that is also the
    ValueError scikit-learn's tools (and its `check_estimator`) expect of an estimator given bad input."""


class ProbeTypeError(FeatstoreError, TypeError):
    """Features that are not numbers (an object array holding a dict): the TypeError numpy itself raises."""


_NOT_FITTED: type | None = None  # made on first use: it subclasses scikit-learn's NotFittedError


def _not_fitted() -> FeatstoreError:
    """Predicting before `fit`: a FeatstoreError that is also scikit-learn's NotFittedError where scikit-learn is
    installed (what its tools catch), without featstore importing scikit-learn anywhere else."""
    message = "this Probe is not fitted yet: call fit(X, y) before predict"
    try:
        from sklearn.exceptions import NotFittedError
    except ImportError:  # pragma: no cover - scikit-learn is a dev dependency
        return ProbeInputError(message)
    global _NOT_FITTED
    if _NOT_FITTED is None:
        _NOT_FITTED = type("ProbeNotFitted", (FeatstoreError, NotFittedError), {"__module__": __name__})
    return _NOT_FITTED(message)


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
    from featstore.probing.estimator_variant import EstimatorFit

    if isinstance(fitted, LinearFit):
        return int(fitted.weight.shape[1])
    if isinstance(fitted, EstimatorFit):
        return fitted.width()
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
    from featstore.probing.estimator_variant import EstimatorFit

    x = _checked_rows(fitted, x, who)
    if isinstance(fitted, EstimatorFit):
        return fitted.predict_proba(x)
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


def _column_labels(y: Any, rows: int) -> np.ndarray:
    """y as one label per row: a column vector [rows, 1] is raveled with scikit-learn's DataConversionWarning;
    [rows, classes] (a distribution per row, for `lens`) is kept; missing, non-finite or continuous labels are
    refused (scikit-learn's words: 'Unknown label type')."""
    if y is None:
        raise ProbeInputError("y is None: Probe requires y to be passed, but the target y is None")
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
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

    def __init__(self, variant: str = VARIANT, *, seed: int = 0, val_frac: float = VAL_FRAC, split_seed: int = 0,
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
            raise FeatstoreError("give a registered variant's name ('linear', 'knn', ...)",
                                 field="variant", value=self.variant)
        variant = get_variant(self.variant)
        return type(variant)(**{**variant.params, **self._params}) if self._params else variant

    def fit(self, X: np.ndarray, y: np.ndarray, is_val: np.ndarray | None = None) -> Probe:
        """Learn from every row of X; `is_val` [rows] bool marks the rows used for model selection."""
        from featstore.probing.run import parse_bytes
        from featstore.probing.source import FeatureSource
        from featstore.probing.split import checked
        from featstore.probing.trainer import FitRows, fit_probes
        from featstore.runtime import resolve_device

        try:  # what __init__ and set_params stored, checked here (scikit-learn's rule)
            variant = self._variant()
            checked(split_seed=self.split_seed, val_frac=self.val_frac,
                    **({} if self.threads is None else {"threads": self.threads}))  # None: as many as are idle
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
        source = FeatureSource.from_arrays([x.numpy()], device, parse_bytes(self.memory_budget), [projection])
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
