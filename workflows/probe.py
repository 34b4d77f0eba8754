"""`featstore probe`: fit probes from the store, save them back into it, land every prediction in DuckDB.

All checks (store complete, DB free and of the same image set, variant known) run before anything is
trained or written. Rerunning a command replaces its own runs, another parameter set lands beside them (see
`featstore.probing.run` for what names a run). Store and database commit together: the probe weights are
written as a new version first (a name of this job's own, recording the database and split in its attrs), then
every predicted view's rows in one transaction, and only then is that version made current, so a failure anywhere
leaves the old weights and rows in place. The versions this database's runs no longer name are dropped then, and
no others: two jobs of one probe name (other databases, or one view each) keep each other's weights.

Ctrl-C (SIGINT) during that write rolls it back: the first interrupt raises where the write is, every further one
is only noted until the rollback is done, and the job ends with `Interrupted` (a `KeyboardInterrupt`, so Python
code that stops on Ctrl-C still does, whose message says what was rolled back: the CLI prints it in one line and
exits 2). Once the rows
are committed, an interrupt waits for the job's last steps.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch

from featstore.analytics import db as fsdb
from featstore.compute.specs import RunOptions
from featstore.errors import FeatstoreError, Interrupted, Name
from featstore.probing.base import ProbeVariant, get_variant
from featstore.probing.run import (
    ProbeData,
    ProbeSettings,
    check_complete,
    fit_all,
    fit_plans,
    model_outputs,
    parse_bytes,
    predict_view,
    save_probes,
    trains_streamed,
)
from featstore.records import DatasetInfo, ProbeRun, RunIdentity, RunRows
from featstore.runtime import resolve_device
from featstore.schema import MEMORY_BUDGET, VAL_FRAC, VARIANT, VIEW, check_fields, comma_list, default
from featstore.store.reader import FeatureStore, model_key, new_probe_version
from featstore.store.writer import StoreWriter
from featstore.threads import ThreadPolicy
from featstore.version import __version__


@dataclass(frozen=True)
class ProbeConfig:
    """Everything `featstore probe` takes; the CLI only fills this in. `run.seed` is the probe seed
    (initialisation, shuffling, projections); `run.threads` the CPU threads for fitting (None: the cores idle
    when the fit starts); `run.progress` one bar per probe fit."""

    store: str | Path  # a folder, or an object-store URL (featstore.store.location)
    model: str  # the store group
    db: Path
    view: str = VIEW
    variant: str | ProbeVariant = VARIANT  # a registered variant's spec, or a variant made for this job
    train_on_view: str | None = None
    cross_fit: int = default("cross_fit")
    split_seed: int = default("split_seed")  # train/val/test split and cross-fit folds, fixed per database
    val_frac: float = VAL_FRAC
    memory_budget: str = MEMORY_BUDGET
    run: RunOptions = field(default_factory=RunOptions)
    # keep the runs when the database already holds every one of them from this job (the same run ids and
    # parameters, featstore's version among them, their weights in the store): a rerun of the demo, or one after
    # an interruption, does not fit them again
    keep_landed: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "db", Path(self.db))  # callers may pass a string
        check_fields(self, ("view", "train_on_view", "cross_fit", "split_seed", "val_frac", "memory_budget"))

    @property
    def settings(self) -> ProbeSettings:
        return ProbeSettings(self.cross_fit, self.run.seed, self.split_seed, self.val_frac)


@dataclass
class _Job:
    """What a probe config resolves to in its store: the views to predict, the training view, the variant, the
    rows, and whether the fit streams (all part of the runs' names)."""

    store: FeatureStore
    key: str
    views: list[str]
    train_view: str
    variant: ProbeVariant
    data: ProbeData
    cfg: ProbeConfig

    @classmethod
    def resolve(cls, cfg: ProbeConfig, store: FeatureStore, device: torch.device) -> _Job:
        key = model_key(cfg.model)
        store.model_attrs(key)  # an unknown model is a one-line error
        views = store.views(key) if cfg.view == "all" else comma_list(cfg.view)
        train_view = cfg.train_on_view or ("clean" if "clean" in store.views(key) else views[0])
        variant = cfg.variant if isinstance(cfg.variant, ProbeVariant) else get_variant(cfg.variant)
        variant.bind(store, key, train_view)  # its own checks (knn's reference store, the lens's head), before work
        data = ProbeData(store, key, store.anchors(key), list(dict.fromkeys([train_view, *views])), device,
                         parse_bytes(cfg.memory_budget), cfg.settings)
        return cls(store, key, views, train_view, variant, data, cfg)

    @cached_property
    def streamed(self) -> bool:
        return trains_streamed(self.data, self.variant)

    def identity(self, view: str) -> RunIdentity:
        """The run that predicts `view`."""
        return RunIdentity(self.key, view, self.variant.canonical_id, self.train_view, self.cfg.cross_fit,
                           self.cfg.run.seed, self.streamed)

    @property
    def probe_name(self) -> str:
        """The name the probes are stored under: one for every view they predict."""
        return self.identity(self.train_view).probe_name

    def run_id(self, view: str) -> str:
        return self.identity(view).run_id


def pinned_strength(params: dict) -> float | None:
    """The L2 strength C a variant's parameters pin (`linear:C=0.5`); None where C=0 leaves it to the search (each
    fit's C is in `probe_fits.C`) or the variant has no C."""
    c = params.get("C")
    return float(c) if isinstance(c, int | float) and not isinstance(c, bool) and c > 0 else None


def check_val_rows(data: ProbeData, cfg: ProbeConfig) -> None:
    """Every fit needs train rows, and val rows (early stopping, model selection and the recorded val accuracy read
    them): a val fraction that leaves a fit none of either is refused before training, not learnt as untrained
    weights marked converged."""
    for k, (rows, _) in enumerate(fit_plans(data)):
        if not len(rows.train):
            where = (f"fold {k} of ", Name("cross_fit", cfg.cross_fit)) if cfg.cross_fit else ("the split",)
            raise FeatstoreError(*where, f" holds no train rows ({len(rows.val)} val rows of {len(data.valid)} "
                                 f"usable images); a probe learns from some: pass a smaller ", Name("val_frac"),
                                 ", or more images", field="val_frac", value=cfg.val_frac)
        if not len(rows.val):
            where = (f"fold {k} of ", Name("cross_fit", cfg.cross_fit)) if cfg.cross_fit else ("the split",)
            raise FeatstoreError(*where, f" holds no val rows ({len(rows.train)} train rows of {len(data.valid)} "
                                 f"usable images); early stopping and the val accuracy need some: pass a larger ",
                                 Name("val_frac"), field="val_frac", value=cfg.val_frac)


def planned_run_ids(cfg: ProbeConfig) -> list[str]:
    """The run ids `probe(cfg)` writes, one per predicted view, from the store's sizes alone (nothing is read or
    trained): what a study checks for in the database."""
    job = _Job.resolve(cfg, FeatureStore(cfg.store), torch.device("cpu"))
    return [job.run_id(view) for view in job.views]


@dataclass(frozen=True)
class ProbeResult:
    """What one probe job did: the runs it wrote (one per predicted view) as `identities` (`RunIdentity`: model,
    view, variant id, train view, cross-fit, seed, streamed) and as their ids, `runs`; those of them that replaced a
    run of the same id the database held (a rerun, or another estimator under the same name), and whether
    `keep_landed` found every run landed and fitted nothing. Iterating it, indexing it and `len` read `runs`, the
    run ids."""

    identities: tuple[RunIdentity, ...]
    replaced: tuple[str, ...] = ()
    kept: bool = False

    @property
    def runs(self) -> tuple[str, ...]:
        return tuple(identity.run_id for identity in self.identities)

    def __iter__(self) -> Iterator[str]:
        return iter(self.runs)

    def __len__(self) -> int:
        return len(self.runs)

    def __getitem__(self, index: int) -> str:
        return self.runs[index]


def probe(cfg: ProbeConfig) -> list[str]:
    """`probe_job`'s run ids: what `featstore probe` writes."""
    return list(probe_job(cfg).runs)


class _Interrupts:
    """SIGINT while the database write is under way: the first raises KeyboardInterrupt where the write is (so it
    is rolled back), later ones only count until the job has cleaned up; `raising` off after the commit."""

    def __init__(self) -> None:
        self.count, self.raising = 0, True

    def __call__(self, signum, frame) -> None:
        self.count += 1
        if self.raising and self.count == 1:
            raise KeyboardInterrupt


@contextmanager
def _interrupts_noted() -> Iterator[_Interrupts]:
    """Install `_Interrupts` for SIGINT in the main thread (elsewhere Python delivers no signal: nothing to do)."""
    noted = _Interrupts()
    if threading.current_thread() is not threading.main_thread():
        noted.raising = False
        yield noted
        return
    before = signal.signal(signal.SIGINT, noted)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, before)


def probe_job(cfg: ProbeConfig) -> ProbeResult:
    """Train (once) and predict every requested view; returns the runs written and those they replaced.

    The database is read before training (is it of this image set?) only if it exists, and opened for the writes
    at the end, so that `featstore sql` can read it while the probes train; a database that this job would have
    been the first to fill is not left behind, empty, when the job fails before its commit."""
    FeatureStore(cfg.store)  # a missing store is an error, not a new empty one
    store = StoreWriter(cfg.store)
    job = _Job.resolve(cfg, store, resolve_device(cfg.run.device))
    key, views, train_view, variant, data = job.key, job.views, job.train_view, job.variant, job.data
    for v in dict.fromkeys([train_view, *views]):
        check_complete(store, key, v)
    store.location.check_writable(key)
    if cfg.cross_fit > len(data.valid) // 2:
        raise FeatstoreError(f"the store has {len(data.valid)} usable images, so at "
                             f"most {len(data.valid) // 2} folds (each fold must hold out at least 2 images)",
                             field="cross_fit", value=cfg.cross_fit)
    check_val_rows(data, cfg)
    image_attrs = store.image_attrs()
    info = DatasetInfo(image_attrs["fingerprint"], image_attrs.get("source", ""), str(cfg.store),
                       cfg.split_seed, cfg.val_frac)
    source = store.source(key)
    probe_name = job.probe_name
    pinned_c = pinned_strength(variant.params)
    version = new_probe_version()
    params = {**variant.params, "split_seed": cfg.split_seed, "val_frac": cfg.val_frac, "featstore": __version__,
              "weights_id": store.config(key).weights_id}  # the identity has its own columns (`ProbeRun.columns`)
    identities = tuple(job.identity(view) for view in views)
    planned, held = [identity.run_id for identity in identities], {}
    if Path(cfg.db).exists():  # read-only beside `featstore sql`'s readers; a writer holding it is refused now
        con = fsdb.connect(cfg.db, read_only=True)
        try:
            fsdb.check_dataset(con, cfg.db, info)
            fsdb.check_source(con, cfg.db, source)
            if cfg.keep_landed:
                held = fsdb.run_params(con, planned)
        finally:
            con.close()
    if cfg.keep_landed and _landed(held, planned, params, store, key):
        return ProbeResult(identities, kept=True)
    outputs = []
    with ThreadPolicy(cfg.run.threads, data.device) as threads:  # the reads and predictions too, not only the fits
        fits = fit_all(data, variant, train_view, cfg.run.progress, cfg.run.threads)
        for view in views:
            threads.update()  # a view is the unit of prediction
            predicted = predict_view(data, fits, view, cfg.run.progress, f"{key} {variant.name} predict {view}")
            run = ProbeRun(job.identity(view), variant.name, params, len(data.valid), len(data.anchors),
                           str(cfg.store), version, pinned_c)
            rows = RunRows(run, data.table["image_id"][data.valid], predicted.pred, predicted.conf, predicted.fold,
                           predicted.fit_records)
            outputs.append((rows, model_outputs(data, view)))
            data.release(view)
    table, labels = data.table, data.table["label"]
    con, was_empty, replaced = None, False, ()
    with _interrupts_noted() as interrupts:
        try:  # weights as a new version, then the rows in one transaction, then that version becomes current
            save_probes(data, probe_name, version, fits, variant,
                        {"database": str(cfg.db.resolve()), "split_seed": cfg.split_seed})
            con = fsdb.connect(cfg.db, wait_s=fsdb.WRITE_WAIT_S)
            was_empty = fsdb.is_empty(con)
            if not fsdb.check_dataset(con, cfg.db, info):
                split = data.split.copy()
                split[data.skipped] = "skipped"
                fsdb.register_images(con, info, table["image_id"], table["path"], labels, split,
                                     image_attrs.get("class_names"))
            fsdb.check_source(con, cfg.db, source)  # another job may have filled it meanwhile
            fsdb.register_source(con, source)
            fsdb.register_anchors(con, key, data.anchors)
            named = fsdb.probe_versions(con, key, probe_name)  # what this database's runs read before this job
            held_before = fsdb.run_params(con, planned)
            replaced = tuple(r for r in planned if r in held_before)
            fsdb.write_runs(con, [rows for rows, _ in outputs])
            interrupts.raising = False  # committed: the rest finishes, whatever Ctrl-C says now
        except BaseException as e:
            interrupts.raising = False  # the cleanup below runs to its end
            if not (interrupts.count and _committed(con, planned, version)):  # else Ctrl-C came just after COMMIT
                store.discard_probe_version(key, probe_name, version)
                if con is not None:
                    if was_empty:  # everything in it is this job's, written under its lock: no empty database is left
                        fsdb.remove_database(cfg.db)
                    con.close()
                if interrupts.count:  # Ctrl-C, as a KeyboardInterrupt or as DuckDB's InterruptException
                    raise Interrupted(f"interrupted while writing the runs into {cfg.db}: the write was rolled back, "
                                      f"the database holds what it held before and the store its old probes") from None
                raise e
        retired = sorted(named - fsdb.probe_versions(con, key, probe_name))
        try:
            store.make_probe_current(key, probe_name, version, retired)
            for rows, (pred, conf) in outputs:
                fsdb.replace_model_outputs(con, key, rows.run.identity.view, table["image_id"][data.valid], pred, conf)
        finally:
            con.close()
    return ProbeResult(identities, replaced)


def _committed(con, run_ids: list[str], version: str) -> bool:
    """Whether the database holds every one of `run_ids` naming this job's weights `version`: its write committed
    (an interrupt that lands between the COMMIT and the next line must not discard what the rows name)."""
    if con is None:
        return False
    try:
        held = fsdb.run_params(con, run_ids)
    except Exception:
        return False
    return len(held) == len(run_ids) and all(v == version for _, _, v in held.values())


def _landed(held: dict[str, tuple[str, str, str]], run_ids: list[str], params: dict, store: FeatureStore,
            key: str) -> bool:
    """Whether the runs a database holds (`fsdb.run_params`) are every one of `run_ids`, with these parameters,
    and the store still holds the weights each names."""
    wanted = json.loads(json.dumps(params))
    return len(held) == len(run_ids) and all(
        json.loads(p) == wanted and store.probe_version_exists(key, name, version)
        for p, name, version in held.values())


def missing_weights(store: str | Path, dbs: list[Path]) -> list[str]:
    """The probe runs of these databases whose stored weights this store should hold and does not, one line each:
    a run of a model the store holds, from a database whose source for that model is this store's (its images,
    weights and anchors), naming a version that is not there."""
    fs = FeatureStore(store)
    models = set(fs.models())
    lines = []
    for db in dbs:
        con = fsdb.connect(db, read_only=True)
        try:
            ours = {}
            for run_id, model, name, version in fsdb.run_weights(con):
                if model not in models:
                    continue
                if model not in ours:
                    held = fsdb.model_source(con, model)
                    ours[model] = held is None or not held.differences(fs.source(model))
                if ours[model] and not fs.probe_version_exists(model, name, version):
                    lines.append(f"{db}: run {run_id}: its weights {model}/probes/{name}/{version} are missing")
        finally:
            con.close()
    return lines
