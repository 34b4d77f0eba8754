"""Any scikit-learn style estimator (`fit(X, y)`, `predict_proba(X)`) as a probe variant: a clone fitted per anchor
on the train rows' raw stored features, in store order, and kept in the store pickled.

Unlike the registered variants, an estimator variant is an instance made per job (`EstimatorVariant(estimator,
name)`), handed to the probe job as it is: nothing is added to the global registry (`VARIANTS`), so two jobs in one
process, or one that fails, never see each other's. Its runs are named `name`; what identifies them is the digest of
the estimator's full settings (`estimator_digest`), recorded with the runs beside its repr.
"""

from __future__ import annotations

import copy
import hashlib
import json
import pickle
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from featstore.errors import FeatstoreError
from featstore.probing.base import (
    PROBE_NAME,
    VARIANTS,
    AnchorContext,
    FittedProbe,
    Plan,
    ProbeGroup,
    ProbeVariant,
    check_probe_name,
)
from featstore.records import ends_like_a_run_part

STORED = "estimator"  # the array a fit is kept as: its pickle's bytes, uint8 [folds, bytes]


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
    ('pipeline-3f2a9c01'), so two estimators of one class never take each other's runs; more digits where 8 would
    end like a cross-fit part ('-cf123456', which a probe name reads back as --cross-fit 123456)."""
    stem = re.sub(r"[^a-z0-9_.-]+", "-", type(estimator).__name__.lower()).strip("-._")[:48] or "estimator"
    digest, cut = estimator_digest(estimator), 8
    while cut < 15 and ends_like_a_run_part(f"{stem}-{digest[:cut]}"):  # '-cf123456' reads back as a cross-fit
        cut += 1
    name = f"{stem}-{digest[:cut]}"
    assert PROBE_NAME.fullmatch(name), name
    return name


CONVERGENCE_WARNINGS = ("ConvergenceWarning",)  # scikit-learn's category (and any subclass), known by its name


def _fitted_clone(estimator: Any, x: np.ndarray, y: np.ndarray) -> tuple[Any, str | None]:
    """A fresh copy of the user's estimator (scikit-learn's `clone` when it is installed), fitted on x, y, and the
    first line of the convergence warning its fit gave (None: it gave none), so the run records it unconverged.
    Its other warnings are said as they were."""
    try:
        from sklearn.base import clone
    except ImportError:  # pragma: no cover - scikit-learn is a dev dependency
        fresh = copy.deepcopy(estimator)
    else:
        fresh = clone(estimator)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fitted = fresh.fit(x, y)
    unconverged = None
    for w in caught:
        if any(c.__name__ in CONVERGENCE_WARNINGS for c in w.category.__mro__):
            unconverged = unconverged or f"{w.category.__name__}: {str(w.message).splitlines()[0]}"
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return fitted, unconverged


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


@dataclass(kw_only=True)
class EstimatorFit(FittedProbe):
    """A fitted estimator of one anchor: predicts by its predict_proba; the store keeps it pickled."""

    estimator: Any
    pickled: bytes = b""  # the estimator pickled once, when fitted: what the store keeps, and what the sha256 in
    # its record (`pickle_sha256`, in the run's probe_fits rows) is of

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        proba = np.asarray(self.estimator.predict_proba(x.detach().cpu().numpy()))
        best = proba.argmax(axis=1)
        classes = np.asarray(getattr(self.estimator, "classes_", np.arange(proba.shape[1])))
        return (torch.from_numpy(classes[best].astype(np.int64)),
                torch.from_numpy(proba[np.arange(len(best)), best].astype(np.float32)))

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """[rows, classes] probabilities: the estimator's own."""
        return np.asarray(self.estimator.predict_proba(np.asarray(x, dtype=np.float32)))

    def width(self) -> int | None:
        """The feature width the estimator was fitted on (None: it does not say)."""
        width = getattr(self.estimator, "n_features_in_", None)
        return int(width) if isinstance(width, int | np.integer) else None

    def arrays(self) -> dict[str, np.ndarray]:
        return {STORED: np.frombuffer(self.pickled or pickle.dumps(self.estimator), dtype=np.uint8).copy()}

    @classmethod
    def from_pickle(cls, blob: bytes) -> EstimatorFit:
        """A fit from the bytes the store keeps (only ever for bytes the caller trusts: unpickling runs code)."""
        return cls(estimator=pickle.loads(blob), pickled=blob)


def pickle_bytes(values: np.ndarray, where: str) -> bytes:
    """One fold's stored pickle as bytes: uint8, or float32 holding byte values in stores written before bytes
    stayed bytes; anything else is refused (it is no pickle this code wrote), the message starting with `where`."""
    values = np.asarray(values)
    if values.dtype != np.uint8 and not (values.dtype == np.float32 and np.isin(values, np.arange(256)).all()):
        raise FeatstoreError(f"{where}: the store keeps {values.dtype} values where a pickle's bytes belong")
    return values.astype(np.uint8).tobytes()


class EstimatorGroup(ProbeGroup):
    """Fits a clone per anchor on the train rows, in store order, all at once (rows resident) or gathered from one
    epoch of batches (rows streamed)."""

    def __init__(self, ctxs: Sequence[AnchorContext], estimator: Any):
        self.anchors, self.estimator, self.fits = [c.anchor for c in ctxs], estimator, {}
        self.num_classes = ctxs[0].num_classes
        self.seen: dict[int, list] = {a: [] for a in self.anchors}
        self.pickles: dict[int, bytes] = {}
        self.unconverged: dict[int, str | None] = {}  # the convergence warning each anchor's fit gave

    def _fit(self, a: int, x: np.ndarray, y: np.ndarray) -> None:
        self.fits[a], self.unconverged[a] = _fitted_clone(self.estimator, x, y)
        self.pickles[a] = _checked_fit(self.fits[a], x, self.num_classes, a)

    def ready_to_finish(self) -> bool:
        return bool(self.anchors)

    def finish(self, x, y, is_val, on_pass=None) -> None:
        labels = y.cpu().numpy()
        for i, a in enumerate(self.anchors):
            self._fit(a, x[i].cpu().numpy(), labels)
        self.anchors = []

    def step(self, x, y, is_val, report=False) -> None:
        for i, a in enumerate(self.anchors):
            self.seen[a].append((x[i].cpu().numpy(), y.cpu().numpy()))

    def end_epoch(self, epoch, val_x, val_y) -> None:
        for a in self.anchors:
            xs, ys = zip(*self.seen.pop(a), strict=True)
            self._fit(a, np.concatenate(xs), np.concatenate(ys))
        self.anchors = []

    def fitted(self, val_x, val_y) -> dict[int, FittedProbe]:
        out = {}
        for a, est in self.fits.items():
            blob = self.pickles[a]
            unconverged = self.unconverged.get(a)
            fit = EstimatorFit(estimator=est, pickled=blob, epochs=1, converged=unconverged is None,
                               info={"estimator": repr(est), "pickle_sha256": hashlib.sha256(blob).hexdigest(),
                                     **({"unconverged": unconverged} if unconverged else {})})
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


class EstimatorVariant(ProbeVariant):
    """A scikit-learn style estimator as the variant of one job, named `name` (default: `default_name`). Checked
    before any fit: an instance, not a class, with fit and predict_proba, that pickles, under a name that is no
    registered variant's."""

    name = "estimator"  # the class's; each instance carries its runs' name
    label_params = ("estimator", "estimator_sha256")

    def __init__(self, estimator: Any, name: str | None = None):
        if isinstance(estimator, type):
            raise FeatstoreError(f"give an instance ({estimator.__name__}()), not the "
                                 f"class", field="variant", value=estimator.__name__)
        if not (callable(getattr(estimator, "fit", None)) and callable(getattr(estimator, "predict_proba", None))):
            raise FeatstoreError(f"variant {estimator!r}: give a registered variant name or an estimator with "
                                 f"fit(X, y) and predict_proba(X)")
        try:
            pickle.dumps(estimator)  # its fits are kept pickled: found now, not after every anchor is fitted
        except Exception as e:
            raise FeatstoreError(f"does not pickle ({type(e).__name__}: {e}), and the store keeps each fit pickled; "
                                 f"nothing was fitted", field="variant",
                                 value=f"{type(estimator).__name__}(...)") from None
        name = check_probe_name(name if name is not None else default_name(estimator))
        if name in VARIANTS:
            raise FeatstoreError(f"name {name!r} is a registered probe variant; give the estimator's runs another "
                                 f"name")
        super().__init__()
        self.name, self.estimator = name, estimator
        # what identifies the runs: the digest of the full settings (a repr is for reading; scikit-learn's elides
        # past ~700 characters, so two pipelines could share one)
        self.params = {**self.params, "estimator": repr(estimator), "estimator_sha256": estimator_digest(estimator)}

    def plan(self, n_fit: int) -> Plan:
        return Plan(max_epochs=1, batch_size=max(1, n_fit), train_on_val=False)

    def make_group(self, ctxs: Sequence[AnchorContext]) -> ProbeGroup:
        return EstimatorGroup(ctxs, self.estimator)

    def batches_anchors(self) -> bool:
        return True
