"""`featstore probe`: fit probes from the store, save them back into it, land every prediction in DuckDB.

All checks (store complete, DB free and of the same image set, variant known) run before anything is
trained or written. Rerunning a command replaces its own runs, another parameter set lands beside them (see
`featstore.probing.run` for what names a run). Store and database commit together: the probe weights are
written as a new version first, then every predicted view's rows in one transaction, and only then is that
version made current, so a failure anywhere leaves the old weights and rows in place.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from featstore import __version__
from featstore.analytics import db as fsdb
from featstore.errors import FeatstoreError
from featstore.probing.base import get_variant
from featstore.probing.run import (
    ProbeData,
    ProbeSettings,
    check_complete,
    fit_all,
    model_outputs,
    parse_bytes,
    predict_view,
    probe_name_for,
    run_id_for,
    save_probes,
)
from featstore.records import DatasetInfo, ProbeRun, RunRows
from featstore.runtime import resolve_device
from featstore.specs import RunOptions
from featstore.store import FeatureStore, model_key
from featstore.threads import ThreadPolicy


@dataclass(frozen=True)
class ProbeConfig:
    """Everything `featstore probe` takes; the CLI only fills this in. `run.seed` is the probe seed
    (initialisation, shuffling, projections); `run.threads` the CPU threads for fitting (None: the cores idle
    when the fit starts); `run.progress` one bar per probe fit."""

    store: str | Path  # a folder, or an object-store URL (featstore.location)
    model: str  # the store group
    db: Path
    view: str = "clean"
    variant: str = "linear"
    train_on_view: str | None = None
    cross_fit: int = 0
    split_seed: int = 0  # train/val/test split and cross-fit folds, fixed per database
    val_frac: float = 0.1
    memory_budget: str = "4GB"
    run: RunOptions = field(default_factory=RunOptions)

    @property
    def settings(self) -> ProbeSettings:
        return ProbeSettings(self.cross_fit, self.run.seed, self.split_seed, self.val_frac)


def probe(cfg: ProbeConfig) -> list[str]:
    """Train (once) and predict every requested view; returns the run ids written.

    The database is read before training (is it of this image set?) only if it exists, and opened for the writes
    at the end, so that `featstore sql` can read it while the probes train; a database that this job would have
    been the first to fill is not left behind, empty, when the job fails before its commit."""
    FeatureStore(cfg.store)  # a missing store is an error, not a new empty one
    store = FeatureStore(cfg.store, mode="a")
    key = model_key(cfg.model)
    store.model_attrs(key)  # an unknown model is a one-line error
    views = store.views(key) if cfg.view == "all" else [v.strip() for v in cfg.view.split(",") if v.strip()]
    train_view = cfg.train_on_view or ("clean" if "clean" in store.views(key) else views[0])
    for v in dict.fromkeys([train_view, *views]):
        check_complete(store, key, v)
    if cfg.cross_fit == 1 or cfg.cross_fit < 0:
        raise FeatstoreError("--cross-fit K needs K >= 2 (or 0 for the single 70/30 split)")
    variant = get_variant(cfg.variant)
    data = ProbeData(store, key, store.anchors(key), list(dict.fromkeys([train_view, *views])),
                     resolve_device(cfg.run.device), parse_bytes(cfg.memory_budget), cfg.settings)
    store.check_writable(key)
    if cfg.cross_fit > len(data.valid) // 2:
        raise FeatstoreError(f"--cross-fit {cfg.cross_fit}: the store has {len(data.valid)} usable images, so at "
                             f"most {len(data.valid) // 2} folds (each fold must hold out at least 2 images)")
    image_attrs = store.image_attrs()
    info = DatasetInfo(image_attrs["fingerprint"], image_attrs.get("source", ""), str(cfg.store),
                            cfg.split_seed, cfg.val_frac)
    if Path(cfg.db).exists():
        con = fsdb.connect(cfg.db)
        try:
            fsdb.check_dataset(con, cfg.db, info)
        finally:
            con.close()

    probe_id = variant.canonical_id
    seed = cfg.run.seed
    probe_name = probe_name_for(probe_id, train_view, cfg.cross_fit, seed)
    version = time.strftime("v%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:8]
    params = {**variant.params, "probe_id": probe_id, "probe_name": probe_name, "probe_version": version,
              "split_seed": cfg.split_seed, "val_frac": cfg.val_frac, "featstore": __version__,
              "weights_id": store.config(key).weights_id}
    outputs = []
    with ThreadPolicy(cfg.run.threads, data.device) as threads:  # the reads and predictions too, not only the fits
        fits = fit_all(data, variant, train_view, cfg.run.progress, cfg.run.threads)
        for view in views:
            threads.update()  # a view is the unit of prediction
            predicted = predict_view(data, fits, view)
            run = ProbeRun(run_id_for(key, view, probe_id, train_view, cfg.cross_fit, seed), key, view, train_view,
                           variant.name, params, cfg.cross_fit, seed, len(data.valid), len(data.anchors),
                           str(cfg.store))
            rows = RunRows(run, data.table["image_id"][data.valid], predicted.pred, predicted.conf, predicted.fold,
                           predicted.fit_records)
            outputs.append((rows, model_outputs(data, view)))
            data.release(view)
    table, labels = data.table, data.table["label"]
    con, was_empty = None, False
    try:  # weights as a new version, then the rows in one transaction, then that version becomes current
        save_probes(data, probe_name, version, fits, variant)
        con = fsdb.connect(cfg.db, wait_s=fsdb.WRITE_WAIT_S)
        was_empty = fsdb.is_empty(con)
        if not fsdb.check_dataset(con, cfg.db, info):
            split = data.split.copy()
            split[data.skipped] = "skipped"
            fsdb.register_images(con, info, table["image_id"], table["path"], labels, split,
                                 image_attrs.get("class_names"))
        fsdb.register_anchors(con, key, data.anchors)
        fsdb.write_runs(con, [rows for rows, _ in outputs])
    except BaseException:
        store.discard_probe_version(key, probe_name, version)
        if con is not None:
            if was_empty:  # everything in it is this job's, written under its lock: no empty database is left
                fsdb.remove_database(cfg.db)
            con.close()
        raise
    try:
        store.make_probe_current(key, probe_name, version)
        for rows, (pred, conf) in outputs:
            fsdb.replace_model_outputs(con, key, rows.run.view, table["image_id"][data.valid], pred, conf)
    finally:
        con.close()
    return [rows.run.run_id for rows, _ in outputs]
