"""`featstore probe`: fit probes from the store, save them back into it, land every prediction in DuckDB.

All checks (store complete, DB free and of the same image set, variant known) run before anything is
trained or written. A run's identity carries every parameter that changes its results (variant parameters,
probe seed, projection width, training view, cross-fit): rerunning a command replaces its own runs, another
parameter set lands beside them. Store and database commit together: the probe weights are written as a new
version first, then every predicted view's rows in one transaction, and only then is that version made
current, so a failure anywhere leaves the old weights and rows in place.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from featstore import __version__
from featstore.analytics import db as fsdb
from featstore.errors import FeatstoreError
from featstore.probing.base import FittedProbe, ProbeVariant, get_variant
from featstore.probing.source import FeatureSource
from featstore.probing.split import make_folds, make_split
from featstore.probing.trainer import FitRows, fit_probes, predict
from featstore.runtime import resolve_device
from featstore.store import FeatureStore, model_key


@dataclass
class ProbeConfig:
    """Everything `featstore probe` takes; the CLI only fills this in."""

    store: Path
    model: str
    db: Path
    view: str = "clean"
    variant: str = "linear"
    train_on_view: str | None = None
    cross_fit: int = 0
    seed: int = 0  # probe seed: initialisation, shuffling, projections
    split_seed: int = 0  # train/val/test split and cross-fit folds, fixed per database
    val_frac: float = 0.1
    memory_budget: str = "4GB"
    device: str = "auto"
    progress: bool = True  # one progress bar per probe fit
    threads: int | None = None  # CPU threads for fitting; None: the cores idle at the start (probing/threads.py)


WRITE_WAIT_S = 120.0  # how long the final writes wait for readers (`featstore sql`) to let go of the database


@dataclass
class ProbesIdentity:
    """One set of fitted probes: what names its runs and its place in the store."""

    variant: ProbeVariant
    probe_id: str  # the variant's canonical id, e.g. 'linear:epochs=12'
    probe_name: str  # <model>/probes/<probe_name>/ in the store
    version: str  # the store version holding these weights
    train_view: str
    weights_id: str  # the network's weights, from the store config
    n_anchors: int


def parse_bytes(text: str | int) -> int:
    """'4GB', '512MB', '0' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise FeatstoreError(f"--memory-budget {text!r}: give a size such as 4GB, 512MB or 0")
    return int(float(m.group(1)) * 1024 ** "_KMGT".index(m.group(2).upper() or "_"))


def run_id_for(key: str, view: str, label: str, train_view: str, cross_fit: int, seed: int) -> str:
    """'resnet50/gaussian_noise-1/linear:epochs=12/train=clean/cf5/seed1'; `label` is the variant's canonical id."""
    rid = f"{key}/{view}/{label}"
    if train_view != view:
        rid += f"/train={train_view}"
    if cross_fit:
        rid += f"/cf{cross_fit}"
    if seed:
        rid += f"/seed{seed}"
    return rid


def probe_name_for(label: str, train_view: str, cross_fit: int, seed: int) -> str:
    """Where a run's probes live in the store: <model>/probes/<name>/ (shared by every view it predicts)."""
    return label + (f"-cf{cross_fit}" if cross_fit else "") + (f"-seed{seed}" if seed else "") + f"@{train_view}"


def probe(cfg: ProbeConfig) -> list[str]:
    """Train (once) and predict every requested view; returns the run ids written.

    The database is opened twice: briefly before training (is it free, and of this image set?) and for the
    writes at the end, so that `featstore sql` can read it while the probes train."""
    FeatureStore(cfg.store)  # a missing store is an error, not a new empty one
    store = FeatureStore(cfg.store, mode="a")
    key = model_key(cfg.model)
    attrs = store.model_attrs(key)
    anchors = store.anchors(key)
    views = store.views(key) if cfg.view == "all" else [v.strip() for v in cfg.view.split(",") if v.strip()]
    train_view = cfg.train_on_view or ("clean" if "clean" in store.views(key) else views[0])
    for v in dict.fromkeys([train_view, *views]):
        _check_complete(store, key, v, cfg)
    if cfg.cross_fit == 1 or cfg.cross_fit < 0:
        raise FeatstoreError("--cross-fit K needs K >= 2 (or 0 for the single 70/30 split)")
    variant = get_variant(cfg.variant)
    device = resolve_device(cfg.device)
    budget = parse_bytes(cfg.memory_budget)
    store.check_writable(key)

    table = store.image_table()
    image_attrs = store.image_attrs()
    labels = table["label"]
    num_classes = max(len(image_attrs.get("class_names", [])), int(labels.max()) + 1)
    skipped = np.zeros(len(labels), dtype=bool)
    for v in dict.fromkeys([train_view, *views]):
        skipped |= store.read_skipped(key, v)
    valid = np.flatnonzero(~skipped)
    if cfg.cross_fit > len(valid) // 2:
        raise FeatstoreError(f"--cross-fit {cfg.cross_fit}: the store has {len(valid)} usable images, so at most "
                             f"{len(valid) // 2} folds (each fold must hold out at least 2 images)")
    split = make_split(table["image_id"], cfg.split_seed, val_frac=cfg.val_frac)
    info = fsdb.DatasetInfo(image_attrs["fingerprint"], image_attrs.get("source", ""), str(cfg.store),
                            cfg.split_seed, cfg.val_frac)
    con = fsdb.connect(cfg.db)
    try:
        fsdb.check_dataset(con, cfg.db, info)
    finally:
        con.close()
    sources: dict[str, FeatureSource] = {}

    def source_for(view: str) -> FeatureSource:
        """One read of a view's valid rows, shared by training and prediction."""
        if view not in sources:
            sources[view] = FeatureSource(store, key, view, anchors, valid, device, budget)
        return sources[view]

    fits = _fit(cfg, store, key, anchors, train_view, variant, device, budget, split, valid, labels, num_classes,
                source_for)
    probe_id = variant.canonical_id
    ident = ProbesIdentity(variant, probe_id, probe_name_for(probe_id, train_view, cfg.cross_fit, cfg.seed),
                           time.strftime("v%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:8], train_view,
                           attrs["config"]["weights_id"], len(anchors))
    probe_name, version = ident.probe_name, ident.version
    outputs = []
    for view in views:
        rows = _run_rows(cfg, key, view, ident, fits, valid, table["image_id"], source_for(view))
        outputs.append((rows, _model_outputs(store, key, view, valid)))
        sources.pop(view, None)  # one view's features in memory at a time
    con = None
    try:  # weights as a new version, then the rows in one transaction, then that version becomes current
        _save_probes(store, key, probe_name, version, anchors, fits, variant, cfg)
        con = fsdb.connect(cfg.db, wait_s=WRITE_WAIT_S)
        if not fsdb.check_dataset(con, cfg.db, info):
            fsdb.register_images(con, info, table["image_id"], table["path"], labels,
                                 np.where(skipped, "skipped", split), image_attrs.get("class_names"))
        fsdb.register_anchors(con, key, anchors)
        fsdb.write_runs(con, [rows for rows, _ in outputs])
    except BaseException:
        store.discard_probe_version(key, probe_name, version)
        if con is not None:
            con.close()
        raise
    try:
        store.make_probe_current(key, probe_name, version)
        for rows, (pred, conf) in outputs:
            fsdb.replace_model_outputs(con, key, rows.run["view"], table["image_id"][valid], pred, conf)
    finally:
        con.close()
    return [rows.run["run_id"] for rows, _ in outputs]


def _run_rows(cfg: ProbeConfig, key: str, view: str, ident: ProbesIdentity, fits, valid: np.ndarray,
              image_id: np.ndarray, source: FeatureSource) -> fsdb.RunRows:
    """Predict one view with the fitted probes: the rows its run writes."""
    pred = np.empty((len(valid), ident.n_anchors), dtype=np.int32)
    conf = np.empty((len(valid), ident.n_anchors), dtype=np.float32)
    for predicted, fitted in fits:
        where = np.searchsorted(valid, predicted)
        pred[where], conf[where] = predict(source, fitted, predicted)
    fold = None
    if cfg.cross_fit:
        fold = np.empty(len(valid), dtype=np.int16)
        for k, (predicted, _) in enumerate(fits):
            fold[np.searchsorted(valid, predicted)] = k
    run_id = run_id_for(key, view, ident.probe_id, ident.train_view, cfg.cross_fit, cfg.seed)
    run = {"run_id": run_id, "model": key, "view": view, "train_view": ident.train_view, "probe": ident.variant.name,
           "params": {**ident.variant.params, "probe_id": ident.probe_id, "probe_name": ident.probe_name,
                      "probe_version": ident.version, "split_seed": cfg.split_seed, "val_frac": cfg.val_frac,
                      "featstore": __version__, "weights_id": ident.weights_id},
           "cross_fit": cfg.cross_fit, "seed": cfg.seed, "store": str(cfg.store)}
    if not np.isfinite(conf).all():  # the stored features were checked; this guards the arithmetic
        raise FeatstoreError(f"probes of {key!r} predict NaN on view {view!r}; nothing was written (check the "
                             f"store with `featstore verify {cfg.store}`)")
    fit_rows = [(k, a, f.record()) for k, (_, fitted) in enumerate(fits) for a, f in enumerate(fitted)]
    return fsdb.RunRows(run, image_id[valid], pred, conf, fold, fit_rows)


def _fit(cfg, store, key, anchors, train_view, variant, device, budget, split, valid, labels, num_classes,
         source_for):
    """One fit on the 70/30 split, or K fits whose held-out folds cover every valid image once. Returns, per fit,
    the rows it predicts (all valid rows, or its held-out fold) and its probes."""
    plans: list[tuple[FitRows, np.ndarray]] = []
    if cfg.cross_fit:
        folds = make_folds(len(valid), cfg.cross_fit, cfg.split_seed)
        for k in range(cfg.cross_fit):
            fit_rows = valid[folds != k]
            n_val = int(round(cfg.val_frac * len(fit_rows)))
            order = np.random.default_rng(cfg.split_seed + 100 + k).permutation(fit_rows)
            plans.append((FitRows(np.sort(order[n_val:]), np.sort(order[:n_val]), labels), valid[folds == k]))
    else:
        in_split = lambda name: valid[split[valid] == name]  # noqa: E731
        plans.append((FitRows(in_split("train"), in_split("val"), labels), valid))
    fits = []
    for k, (rows, predicted) in enumerate(plans):
        projections = [variant.projection(a.dim, a.index, cfg.seed) for a in anchors]
        if any(p is not None for p in projections):
            source = FeatureSource(store, key, train_view, anchors, np.concatenate([rows.train, rows.val]), device,
                                   budget, projections)
        else:
            source = source_for(train_view)
        label = f"{key} {variant.label}" + (f" fold {k + 1}/{len(plans)}" if cfg.cross_fit else "")
        label += " (streaming)" if not source.in_memory else ""
        fitted = fit_probes(source, variant, rows, num_classes, cfg.seed + k, cfg.progress, label, cfg.threads)
        fits.append((predicted, [_unproject(f, p) for f, p in zip(fitted, projections, strict=True)]))
    return fits


def _unproject(fitted: FittedProbe, projection: torch.Tensor | None) -> FittedProbe:
    """Fold a fixed projection into the weights, so every probe reads the raw stored features."""
    if projection is None:
        return fitted
    weight = fitted.weight @ projection.T.to(fitted.weight.device)
    return replace(fitted, weight=weight, info={**fitted.info, "projected_from": int(projection.shape[0]),
                                                "projected_to": int(projection.shape[1])})


def _save_probes(store, key, name, version, anchors, fits, variant, cfg) -> None:
    for a, anchor in enumerate(anchors):
        weight = np.stack([f[a].weight.cpu().numpy() for _, f in fits])
        bias = np.stack([f[a].bias.cpu().numpy() for _, f in fits])
        store.write_probe(key, name, anchor.name, weight, bias,
                          {"variant": variant.name, "params": variant.params, "seed": cfg.seed,
                           "split_seed": cfg.split_seed, "cross_fit": cfg.cross_fit,
                           "folds": [f[a].record() for _, f in fits]}, version)


def _model_outputs(store, key, view, valid) -> tuple[np.ndarray, np.ndarray]:
    """The model's own head on the valid rows: argmax and max softmax of the stored logits."""
    logits = torch.from_numpy(store.read_logits(key, view)[valid].astype(np.float32))
    conf, pred = torch.softmax(logits, dim=-1).max(dim=-1)
    return pred.numpy(), conf.numpy()


def _check_complete(store: FeatureStore, key: str, view: str, cfg: ProbeConfig) -> None:
    """Every chunk done and intact (files present, decodable, no NaN outside skipped rows), before training."""
    done = store.done(key, view)
    if not done.all():
        missing = np.flatnonzero(~done)
        raise FeatstoreError(
            f"store {cfg.store}: view {view!r} of {key!r} is incomplete ({int(done.sum())}/{done.size} chunks, "
            f"first missing chunk {int(missing[0])}); resume it by rerunning the same `featstore build` command")
    problems = store.check_view(key, view)
    if problems:
        raise FeatstoreError(
            f"store {cfg.store} is damaged: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1
                                                              else "")
            + "; rerun the same `featstore build` to re-do those chunks (`featstore verify` lists them)")
