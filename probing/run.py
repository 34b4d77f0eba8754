"""The computation of `featstore probe`, with no database: fit one set of probes from a store (one 70/30 split, or
K cross-fit folds) and predict views with them. `featstore.workflows.probe` checks, persists and commits.

A run's identity carries every parameter that changes its results (variant parameters, probe seed, projection
width, training view, cross-fit, and whether the fit rows fit the memory budget or were streamed by chunk, which
gives other batches): `featstore.records.RunIdentity` is the only place it is spelled and read.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from featstore.errors import FeatstoreError, Name, Step
from featstore.nets.anchors import Anchor
from featstore.probing.base import FittedProbe, ProbeVariant
from featstore.probing.source import FeatureSource, holds_prepared
from featstore.probing.split import make_folds, make_split
from featstore.probing.trainer import FitRows, fit_probes, predict, predict_bar
from featstore.schema import VAL_FRAC, parse_size
from featstore.store.reader import FeatureStore


def parse_bytes(text: str | int) -> int:
    """'4GB', '512MB', '0' -> bytes."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise FeatstoreError(f"{e}", field="memory_budget", value=text) from None


@dataclass(frozen=True)
class ProbeSettings:
    """How one set of probes is fitted: everything but the store and the variant that changes its results."""

    cross_fit: int = 0
    seed: int = 0  # probe seed: initialisation, shuffling, projections
    split_seed: int = 0  # train/val/test split and cross-fit folds, fixed per database
    val_frac: float = VAL_FRAC


@dataclass
class ProbeData:
    """The rows of one model of a store that a probe job learns from and predicts: the valid (not skipped in
    any view used) rows, their labels and split, and where their features are read (device, memory budget)."""

    store: FeatureStore
    key: str
    anchors: list[Anchor]
    views: list[str]  # every view the job reads (training view first)
    device: torch.device
    memory_budget: int
    settings: ProbeSettings

    def __post_init__(self) -> None:
        self._sources: dict[str, FeatureSource] = {}

    @cached_property
    def table(self) -> dict[str, np.ndarray]:
        return self.store.image_table()

    @cached_property
    def skipped(self) -> np.ndarray:
        out = np.zeros(len(self.table["label"]), dtype=bool)
        for v in self.views:
            out |= self.store.read_skipped(self.key, v)
        return out

    @cached_property
    def valid(self) -> np.ndarray:
        return np.flatnonzero(~self.skipped)

    @cached_property
    def split(self) -> np.ndarray:
        return make_split(self.table["image_id"], self.settings.split_seed, val_frac=self.settings.val_frac)

    @cached_property
    def num_classes(self) -> int:
        """The probes' softmax width: the store's recorded class count. A label outside it (a crafted or damaged
        image table: one label of 2,000,000 among 200 rows would make a 2,000,001-way softmax) is refused; a store
        that records no class names takes the largest label + 1, refused where more classes than rows would have no
        row (labels that are no class indices)."""
        labels = np.asarray(self.table["label"])
        names = self.store.image_attrs().get("class_names") or []
        if not len(labels):
            return max(len(names), 1)
        low, top = int(labels.min()), int(labels.max())
        if low < 0 or (names and top >= len(names)):
            bad = low if low < 0 else top
            raise FeatstoreError(f"store {self.store.location}: label {bad} of its image table is no class index of "
                                 f"its {len(names)} classes (0..{len(names) - 1}); nothing was fitted: rebuild the "
                                 f"store's image table (", Step("fs.build(...)", "build"), " from ", Name("data"), ")")
        absent = top + 1 - len(np.unique(labels))
        if not names and absent > len(labels):
            raise FeatstoreError(f"store {self.store.location}: its largest label, {top}, makes a {top + 1:,}-way "
                                 f"softmax in which {absent:,} classes have none of the {len(labels):,} rows; "
                                 f"nothing was fitted: its labels are no class indices")
        return max(len(names), top + 1)

    def source(self, view: str) -> FeatureSource:
        """One read of a view's valid rows, shared by training and prediction."""
        if view not in self._sources:
            self._sources[view] = FeatureSource(self.store, self.key, view, self.anchors, self.valid, self.device,
                                                self.memory_budget)
        return self._sources[view]

    def release(self, view: str) -> None:
        """Drop a view's features (one view in memory at a time)."""
        self._sources.pop(view, None)


@dataclass
class Fit:
    """One fit of every anchor's probe: the rows it predicts (all valid rows, or its held-out fold)."""

    predicted: np.ndarray
    probes: list[FittedProbe]


@dataclass
class ViewPredictions:
    """One view predicted by a set of probes: per valid row and anchor the argmax and its probability, the fold
    of each row (cross-fit), and one record per (fold, anchor) fit."""

    view: str
    pred: np.ndarray  # [n, A] int32
    conf: np.ndarray  # [n, A] float32
    fold: np.ndarray | None  # [n] int16
    fit_records: list[tuple[int, int, dict]]


Plan = tuple[FitRows, np.ndarray]  # the rows one fit learns from, and the rows it predicts


def fit_plans(data: ProbeData, targets: np.ndarray | None = None) -> list[Plan]:
    """One fit on the 70/30 split, or K fits whose held-out folds cover every valid image once; `targets` are
    the probability rows a probe that learns from the model is handed instead of labels."""
    settings, valid, labels = data.settings, data.valid, data.table["label"]
    if not settings.cross_fit:
        in_split = lambda name: valid[data.split[valid] == name]  # noqa: E731
        return [(FitRows(in_split("train"), in_split("val"), labels, targets), valid)]
    plans = []
    folds = make_folds(len(valid), settings.cross_fit, settings.split_seed)
    for k in range(settings.cross_fit):
        fit_rows = valid[folds != k]
        n_val = int(round(settings.val_frac * len(fit_rows)))
        order = np.random.default_rng(settings.split_seed + 100 + k).permutation(fit_rows)
        plans.append((FitRows(np.sort(order[n_val:]), np.sort(order[:n_val]), labels, targets),
                      valid[folds == k]))
    return plans


def _projections(data: ProbeData, variant: ProbeVariant) -> list[torch.Tensor | None]:
    return [variant.projection(a.dim, a.index, data.settings.seed) for a in data.anchors]


def trains_streamed(data: ProbeData, variant: ProbeVariant) -> bool:
    """True when some fit of this job cannot hold its prepared rows within the memory budget: the trainer then
    learns from shuffled chunks instead of permutations of all rows, other batches that give other predictions,
    so the run carries it in its id. Sizes only; no feature is read."""
    projections = _projections(data, variant)
    stored = sum(a.dim for a in data.anchors)
    width = sum(a.dim if p is None else int(p.shape[1]) for a, p in zip(data.anchors, projections, strict=True))
    projected = any(p is not None for p in projections)
    for rows, _ in fit_plans(data):
        n_source = len(rows.train) + len(rows.val) if projected else len(data.valid)
        n_fit = len(rows.train) + (len(rows.val) if variant.plan(len(rows.train)).train_on_val else 0)
        if not holds_prepared(n_source * stored * 4, n_fit * width * 4, data.memory_budget):
            return True
    return False


def fit_all(data: ProbeData, variant: ProbeVariant, train_view: str, progress: bool,
            threads: int | None) -> list[Fit]:
    """Fit every plan of `fit_plans` (one, or one per cross-fit fold)."""
    settings = data.settings
    targets = head_distribution(data, train_view) if variant.learns_from == "model" else None
    num_classes = data.num_classes if targets is None else targets.shape[1]
    plans = fit_plans(data, targets)
    fits = []
    for k, (rows, predicted) in enumerate(plans):
        projections = _projections(data, variant)
        if any(p is not None for p in projections):
            source = FeatureSource(data.store, data.key, train_view, data.anchors,
                                   np.concatenate([rows.train, rows.val]), data.device, data.memory_budget,
                                   projections)
        else:
            source = data.source(train_view)
        label = f"{data.key} {variant.label}" + (f" fold {k + 1}/{len(plans)}" if settings.cross_fit else "")
        label += " (streaming)" if not source.in_memory else ""
        fitted = fit_probes(source, variant, rows, num_classes, settings.seed + k, progress, label, threads)
        fits.append(Fit(predicted, [f if p is None else f.unprojected(p) for f, p in zip(fitted, projections,
                                                                                        strict=True)]))
    return fits


def predict_view(data: ProbeData, fits: list[Fit], view: str, progress: bool = False,
                 label: str = "predict") -> ViewPredictions:
    """Predict one view's valid rows with the fitted probes (with `progress`, one bar over its rows)."""
    valid, n_anchors = data.valid, len(data.anchors)
    source = data.source(view)
    pred = np.empty((len(valid), n_anchors), dtype=np.int32)
    conf = np.empty((len(valid), n_anchors), dtype=np.float32)
    bar = predict_bar(label, sum(len(fit.predicted) for fit in fits)) if progress else None
    try:
        for fit in fits:
            where = np.searchsorted(valid, fit.predicted)
            pred[where], conf[where] = predict(source, fit.probes, fit.predicted, bar)
    finally:
        if bar is not None:
            bar.refresh()  # the last count shows, however soon after the one before
            bar.close()
    fold = None
    if data.settings.cross_fit:
        fold = np.empty(len(valid), dtype=np.int16)
        for k, fit in enumerate(fits):
            fold[np.searchsorted(valid, fit.predicted)] = k
    if not np.isfinite(conf).all():  # the stored features were checked; this guards the arithmetic
        raise FeatstoreError(f"probes of {data.key!r} predict NaN on view {view!r}; nothing was written (check the "
                             "store with ", Step(f"fs.open_store({str(data.store.location)!r}).verify()", "verify"),
                             ")")
    records = [(k, a, f.record()) for k, fit in enumerate(fits) for a, f in enumerate(fit.probes)]
    return ViewPredictions(view, pred, conf, fold, records)


def save_probes(data: ProbeData, name: str, version: str, fits: list[Fit], variant: ProbeVariant,
                owner: dict | None = None) -> None:
    """Every anchor's probe, as a new (not yet current) version in the store: what each fit keeps (linear:
    weights [folds, C, D] and biases [folds, C]; knn: which rows it used), stacked over folds; `owner` says which
    database's runs name the version."""
    settings = data.settings
    for a, anchor in enumerate(data.anchors):
        kept = [f.probes[a].arrays() for f in fits]
        arrays = {array: np.stack([k[array] for k in kept]) for array in kept[0]}
        data.store.write_probe(data.key, name, anchor.name, arrays,
                               {"variant": variant.name, "params": variant.params, "seed": settings.seed,
                                "split_seed": settings.split_seed, "cross_fit": settings.cross_fit,
                                "folds": [f.probes[a].record() for f in fits]}, version, owner)


def model_outputs(data: ProbeData, view: str) -> tuple[np.ndarray, np.ndarray]:
    """The model's own head on the valid rows: argmax and max softmax of the stored logits."""
    logits = torch.from_numpy(data.store.read_logits(data.key, view)[data.valid].astype(np.float32))
    conf, pred = torch.softmax(logits, dim=-1).max(dim=-1)
    return pred.numpy(), conf.numpy()


def head_distribution(data: ProbeData, view: str) -> np.ndarray:
    """The model's own output distribution (softmax of the stored logits) of every row of the store, float32
    [rows, head width]: what a variant with `learns_from = "model"` learns (skipped rows are never read)."""
    logits = torch.from_numpy(data.store.read_logits(data.key, view).astype(np.float32))
    return torch.softmax(logits, dim=-1).numpy()


def check_complete(store: FeatureStore, key: str, view: str) -> None:
    """Every array sound and every chunk done and intact (files present, decodable, its values those its commit
    wrote, no NaN or infinity outside skipped rows), before training."""
    damage = store.check_view_arrays(key, view)
    if damage:
        raise FeatstoreError(f"store {store.location} is damaged: {damage[0]}; rerun the same ",
                             Step("fs.build(...)", "build"), " to "
                             "make the view again (",
                             Step("fs.open_store(store).verify()", "verify"), " lists the damage)")
    done = store.done(key, view)
    if not done.all():
        missing = np.flatnonzero(~done)
        raise FeatstoreError(
            f"store {store.location}: view {view!r} of {key!r} is incomplete ({int(done.sum())}/{done.size} chunks, "
            f"first missing chunk {int(missing[0])}); resume it by rerunning the same ",
            Step("fs.build(...)", "build"))
    problems = store.check_view(key, view)
    if problems:
        raise FeatstoreError(
            f"store {store.location} is damaged: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            + "; rerun the same ", Step("fs.build(...)", "build"), " to re-do those chunks (",
             Step("fs.open_store(store).verify()", "verify"), " lists them)")
