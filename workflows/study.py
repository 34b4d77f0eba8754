"""`featstore study`: a declared grid (models x weights x views x probe variants x probe seeds) run end to end.

A study file (TOML, see studies/paper.toml) names the image set, the models and their weights, the views and
the probes. The study builds one store, probes every model into one database (decision layers are derived as
rows land), writes the report, and returns the paper-shaped table beside the paper's published figures.

Resumable at every step: each finished step is recorded in `<out>/study-state.json` with its parameters, and a
rerun skips a step whose record matches and whose output is still there (a build that was cut short resumes
chunk by chunk, since `featstore build` itself is resumable). One progress bar covers the whole study.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import duckdb
import polars as pl

from featstore.analytics import db as fsdb
from featstore.analytics.queries import paper_table_spread, population, run_ids_among
from featstore.analytics.report import write_report
from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
from featstore.errors import FeatstoreError, Name
from featstore.images.views import parse_view
from featstore.nets.anchors import PRESETS
from featstore.nets.depth import DEFAULT_COUNT
from featstore.probing.base import get_variant
from featstore.records import RunIdentity
from featstore.schema import (
    CHUNK_ROWS,
    FIELDS,
    MEMORY_BUDGET,
    VAL_FRAC,
    WEIGHTS,
    Either,
    K,
    ListOf,
    Real,
    Text,
    comma_list,
    default,
    shown,
)
from featstore.store.location import StoreLocation
from featstore.store.reader import FeatureStore, model_key
from featstore.workflows.build import BuildConfig, build
from featstore.workflows.probe import ProbeConfig, planned_run_ids, probe
from featstore.workflows.toml_files import TABLE, entries, local_path, read_toml, section

# paper_table columns shown beside the published figures; both stable-but-wrong readings face the paper's one
COMPARED = {"last_anchor_accuracy": "last_anchor_accuracy", "mean_layer": "mean_layer", "f_early": "f_early",
            "f_late": "f_late", "never_stable": "never_stable",
            "stable_but_wrong_among_stable": "stable_but_wrong", "stable_but_wrong_of_all": "stable_but_wrong",
            "corruption_delta": "corruption_delta"}


@dataclass(frozen=True)
class StudyModel:
    """One model x weights of the study: the network, its key in the store and database, its anchors, how its
    token anchors are read (`pool`: cls | mean, None = the build's default) and which published row it faces."""

    spec: ModelSpec
    key: str
    anchors: str | None = None
    pool: str | None = None
    figures: str = ""


@dataclass(frozen=True)
class Study:
    """A study file, checked: the image set, the models, the views, how to build and how to probe."""

    name: str
    file: Path
    images: ImageSource
    out: Path
    views: list[str]
    models: list[StudyModel]
    variants: list[str]
    seeds: list[int]
    split_seed: int = 0
    cross_fit: int = 0
    k: int = K
    chunk_rows: int = CHUNK_ROWS
    precision: str = default("precision")
    build_run: RunOptions = field(default_factory=RunOptions)  # batch_size, device, workers
    probe_run: RunOptions = field(default_factory=RunOptions)  # device
    memory_budget: str = MEMORY_BUDGET
    val_frac: float = VAL_FRAC
    published: dict = field(default_factory=dict)  # model name -> {statistic: value}
    published_source: str = ""
    store: str | Path | None = None  # a folder or object-store URL [default: <out>/store.zarr]

    @property
    def store_at(self) -> str | Path:
        return self.store if self.store is not None else self.out / "store.zarr"


@dataclass
class Step:
    id: str  # unique and stable: what the state file records
    params: dict  # a change of any of these reruns the step
    label: str
    run: Callable[[], None]
    done: Callable[[], bool]  # is its output there?


@dataclass
class StudyResult:
    db: Path
    store: str | Path
    report: Path
    table: pl.DataFrame
    ran: list[str]
    skipped: list[str]
    published_source: str
    population: str = ""  # which images the table counts, and how many


KEYS = {"": {"models": TABLE, "name": Text(), "k": FIELDS["k"], "published": Text(), "data": TABLE, "build": TABLE,
             "probe": TABLE},
        "data": {"path": Text(), "labels": Text(), "limit": FIELDS["limit"]},
        "build": {"views": ListOf(Text()), "batch_size": FIELDS["batch_size"], "chunk_rows": FIELDS["chunk_rows"],
                  "device": Text(), "workers": FIELDS["workers"], "precision": FIELDS["precision"]},
        "probe": {"variants": ListOf(Text()), "seeds": ListOf(FIELDS["seed"]), "split_seed": FIELDS["split_seed"],
                  "cross_fit": FIELDS["cross_fit"], "device": Text(), "memory_budget": FIELDS["memory_budget"],
                  "val_frac": FIELDS["val_frac"]},
        "models": {"name": Text(), "weights": Either((Text(), ListOf(Text()))), "image_size": FIELDS["image_size"],
                   "anchors": Text(), "pool": FIELDS["pool"], "key": Text(), "figures": Text()}}
REQUIRED = {"": {"models"}, "models": {"name"}}  # the keys a table must hold (docs/study.md: in bold)


def load_study(path: str | Path, data: str | Path | None = None, out: str | Path | None = None,
               store: str | Path | None = None) -> Study:
    """Read and check a study file; `data` and `out` override its data.path and the default output folder,
    `store` the store's place (<out>/store.zarr; any --store value, e.g. an s3:// URL).
    Every key is checked before anything runs: an unknown one (a typo such as `seed = ...`), a value of the
    wrong type (`seeds = "01"`) or out of range (`k = 0`) is one line naming it and the file."""
    path = Path(path)
    spec = read_toml(path, f"study file {path} does not exist; see studies/paper.toml for the format",
                     f"study file {path}")
    where = f"study file {path}"
    spec = section(where, spec, KEYS[""], REQUIRED[""])
    found = {name: section(f"{where} [{name}]", spec.get(name, {}), KEYS[name]) for name in ("data", "build",
                                                                                              "probe")}
    name = spec.get("name") or path.stem
    section_data, build_section, probe_section = found["data"], found["build"], found["probe"]
    located = data or section_data.get("path")
    if not located:
        raise FeatstoreError(f"study file {path} names no images: give ", Name("data"), " or [data] path")
    base = path.parent
    labels = section_data.get("labels")
    images = ImageSource(local_path(located, base if not data else Path.cwd()),
                         local_path(labels, base) if labels else None, section_data.get("limit"))
    models = []
    for i, entry in enumerate(entries(spec["models"])):
        m = section(f"{where} [[models]] #{i + 1}", entry, KEYS["models"], REQUIRED["models"])
        weights = m.get("weights", WEIGHTS)
        for w in [weights] if isinstance(weights, str) else weights:
            named = m.get("key") or (m["name"] if isinstance(weights, str) else f"{m['name']}.{w}")
            models.append(StudyModel(ModelSpec(m["name"], str(w), m.get("image_size")), model_key(named),
                                     m.get("anchors"), m.get("pool"), str(m.get("figures", m["name"]))))
    if not models:
        raise FeatstoreError(f"study file {path} lists no [[models]]")
    keys = [m.key for m in models]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise FeatstoreError(f"{where}: two [[models]] entries share the key {twice[0]!r} (a store group and run "
                             f"name); give one of them `key = \"...\"`")
    variants = probe_section.get("variants", ["linear"])
    views = build_section.get("views", ["clean"])
    try:  # unknown views and variants, and parameters out of range, fail before anything runs
        for v in variants:
            get_variant(v)
        for v in views:
            parse_view(v)
    except FeatstoreError as e:
        raise FeatstoreError(f"{where}: ", *e.whole()) from None
    for key, values in (("[build] views", views), ("[probe] variants", variants),
                        ("[probe] seeds", probe_section.get("seeds", []))):
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:
            raise FeatstoreError(f"{where}: {key} lists {shown(twice[0])} twice; list each once")
    if "clean" not in views:
        raise FeatstoreError(f"study file {path}: views must include clean (probes train on it)")
    k = spec.get("k", 2)
    _check_k(where, k, models)
    published, source = _published(spec, base)
    build_run = RunOptions(**{key: build_section[key] for key in ("batch_size", "device", "workers")
                              if key in build_section}, progress=False)
    probe_run = RunOptions(**{key: probe_section[key] for key in ("device",) if key in probe_section}, progress=False)
    optional = {key: v for key, v in {"chunk_rows": build_section.get("chunk_rows"),
                                  "precision": build_section.get("precision"),
                                  "memory_budget": probe_section.get("memory_budget"),
                                  "val_frac": probe_section.get("val_frac")}.items() if v is not None}
    return Study(
        name=name, file=path, images=images, out=Path(out) if out else Path.cwd() / f"study-{name}", views=views,
        models=models, variants=variants, seeds=probe_section.get("seeds", [0]),
        split_seed=probe_section.get("split_seed", 0), cross_fit=probe_section.get("cross_fit", 0),
        k=k, build_run=build_run, probe_run=probe_run, published=published, published_source=source, store=store,
        **optional)


def _check_k(where: str, k: int, models: list[StudyModel]) -> None:
    """k counts the anchors after the first that must agree, so it must be below every model's anchor count (as far
    as the file tells it: its `anchors` list, the model's preset, or the default count; the report checks the
    anchors the store really has)."""
    for m in models:
        count = len(comma_list(m.anchors)) if m.anchors else len(
            PRESETS.get(m.spec.model, [None] * DEFAULT_COUNT))
        if k >= count:
            raise FeatstoreError(f"{where}: k = {k} must be below the {count} anchors of {m.key} (k counts the "
                                 f"anchors after the first that must agree: 1 <= k <= {count - 1})")


FIGURES = {name: Real() for name in COMPARED.values()}


def _published(spec: dict, base: Path) -> tuple[dict, str]:
    """The published figures file, checked like the study file: a number per known statistic per model."""
    if not spec.get("published"):
        return {}, ""
    figures = local_path(spec["published"], base)
    where = f"published figures {figures}"
    table = section(where, read_toml(figures, f"{where} do not exist; fix `published` in the study file", where),
                    {"source": Text(), "k": FIELDS["k"], "models": TABLE})
    models = table.get("models", {})
    models = section(f"{where} [models]", models, dict.fromkeys(models, TABLE) if isinstance(models, dict) else {})
    return ({name: section(f"{where} [models.{name}]", values, FIGURES) for name, values in models.items()},
            table.get("source", str(figures)))


def plan(study: Study) -> list[Step]:
    """Every step of the study in order: builds, then probes, then the report."""
    store, db = study.store_at, study.out / "featstore.duckdb"
    steps = []
    for m in study.models:
        cfg = BuildConfig(model=m.spec, images=study.images, store=store, views=",".join(study.views),
                          anchors=m.anchors, pool=m.pool, chunk_rows=study.chunk_rows, precision=study.precision,
                          name=m.key if m.key != model_key(m.spec.model) else None, run=study.build_run)
        params = _params(cfg)
        steps.append(Step(f"build {m.key}", params, f"build {m.key} [{len(study.views)} views]",
                          lambda cfg=cfg: build(cfg), lambda key=m.key: _built(store, key, study.views)))
    for m in study.models:
        for variant in study.variants:
            for seed in study.seeds:
                cfg = _probe_config(study, m, variant, seed)
                first = RunIdentity(m.key, "clean", get_variant(variant).canonical_id, "clean", study.cross_fit,
                                    seed).run_id
                steps.append(Step(f"probe {first}", _params(cfg), f"probe {m.key} {variant} seed {seed}",
                                  lambda cfg=cfg: probe(cfg), lambda cfg=cfg: _probed(cfg)))
    report = study.out / "report"
    declares = {"models": [m.key for m in study.models], "variants": list(study.variants),
                "seeds": list(study.seeds), "views": list(study.views)}  # a report of other runs is redone
    steps.append(Step("report", {"k": study.k, "declares": declares}, "report",
                      lambda: write_report(db, report, k=study.k, runs=declared_run_ids(study)),
                      lambda: (report / "report.html").is_file()))
    return steps


def _probe_config(study: Study, m: StudyModel, variant: str, seed: int) -> ProbeConfig:
    """The probe step of one model, variant and seed (its runs' ids: `planned_run_ids`, once the store is built;
    the step's own id in the state file is the first run's id as it reads in memory)."""
    return ProbeConfig(store=study.store_at, model=m.key, db=study.out / "featstore.duckdb",
                       view=",".join(study.views), variant=variant, cross_fit=study.cross_fit,
                       split_seed=study.split_seed, val_frac=study.val_frac, memory_budget=study.memory_budget,
                       run=replace(study.probe_run, seed=seed))


def _params(cfg: BuildConfig | ProbeConfig) -> dict:
    """What a step's record keeps of its config: every field that changes its output (not progress bars), in the
    shape the state file has always had (flat, paths as strings)."""
    flat = {}
    for k, v in asdict(cfg).items():
        flat.update(v if isinstance(v, dict) else {k: v})
    flat.pop("progress", None)
    flat.pop("threads", None)  # how many CPU threads computed a step does not make it another step
    return {k: str(v) if isinstance(v, Path) else v for k, v in flat.items()}


def _built(store: str | Path, key: str, views: list[str]) -> bool:
    if not StoreLocation.parse(store).has_store():
        return False
    fs = FeatureStore(store)
    if key not in fs.models():
        return False
    return all(v in fs.views(key) and fs.done(key, v).all() for v in views)


def _probed(cfg: ProbeConfig) -> bool:
    """Are the runs of this probe step in the database (its store built, its run ids as the store's sizes make
    them)?"""
    if not cfg.db.is_file() or not StoreLocation.parse(cfg.store).has_store():
        return False
    runs = planned_run_ids(cfg)
    return run_ids_among(cfg.db, runs) == set(runs)


def run_study(path: str | Path, data: str | Path | None = None, out: str | Path | None = None,
              progress: bool = True, store: str | Path | None = None, threads: int | None = None) -> StudyResult:
    """Run every unfinished step of the study, then return the paper-shaped table beside the published one.
    `threads` pins the CPU threads of its builds and probes (None: the thread policy decides)."""
    study = load_study(path, data, out, store)
    study = replace(study, build_run=replace(study.build_run, threads=threads),
                    probe_run=replace(study.probe_run, threads=threads))
    if not study.images.data.is_dir():
        raise FeatstoreError(f"image folder {study.images.data} does not exist; pass ", Name("data"),
                             " or fix [data] path")
    study.out.mkdir(parents=True, exist_ok=True)
    state_file = study.out / "study-state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    steps = plan(study)
    ran, skipped = [], []
    bar = _bar(progress, len(steps), study.name)
    try:
        for step in steps:
            record = state.get(step.id)
            fresh = bool(ran) and step.id == "report"  # a report older than this run's rows is redone
            if record is not None and record["params"] == _jsonable(step.params) and step.done() and not fresh:
                skipped.append(step.id)
            else:
                if bar is not None:
                    bar.set_description(f"{study.name}: {step.label}")
                started = time.time()
                step.run()
                state[step.id] = {"params": _jsonable(step.params), "seconds": round(time.time() - started, 1),
                                  "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
                tmp = state_file.with_suffix(".tmp")
                tmp.write_text(json.dumps(state, indent=1))
                tmp.replace(state_file)  # the record of a step appears only once it finished
                ran.append(step.id)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    db = study.out / "featstore.duckdb"
    con = declared(study, db)  # the runs the file declares now, not those an earlier version of it left
    try:
        return StudyResult(db, study.store_at, study.out / "report" / "report.html", beside_paper(study, con),
                           ran, skipped, study.published_source, population_line(study, con))
    finally:
        con.close()


def declared(study: Study, db: Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the study's database that sees only the probe runs its file declares (models,
    variants, seeds and views as they read now): a rerun after the file dropped seeds or views reports those it
    keeps, while the database keeps every run for `featstore sql`."""
    return fsdb.connect_several([db], runs=declared_run_ids(study))


def declared_run_ids(study: Study) -> list[str]:
    """The probe runs the study's file declares now (models x variants x seeds, each over its views)."""
    return [r for m in study.models for variant in study.variants for seed in study.seeds
            for r in planned_run_ids(_probe_config(study, m, variant, seed))]


TABLE_SCHEMA = {"model": pl.String, "weights": pl.String, "pool": pl.String, "statistic": pl.String,
                "featstore": pl.Float64, "seed_std": pl.Float64, "seed_min": pl.Float64, "seed_max": pl.Float64,
                "seeds": pl.Int64, "n": pl.Int64, "paper": pl.Float64}


def beside_paper(study: Study, db: Path | duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """One row per (model, weights, statistic): ours at k (first variant) as the mean over the probe seeds with
    their spread (sample std, min, max; `sql/paper_table_spread.sql`), the images each figure counts, and the
    paper's figure."""
    variant = get_variant(study.variants[0]).canonical_id
    spread = paper_table_spread(db, study.k).filter((pl.col("probe_id") == variant) & (pl.col("train_view") == "clean")
                                                    & (pl.col("cross_fit") == study.cross_fit))
    pools = {m.key: m.pool for m in study.models}
    stored = FeatureStore(study.store_at) if StoreLocation.parse(study.store_at).has_store() else None
    rows = []
    for m in study.models:
        found = {r["statistic"]: r for r in spread.filter(pl.col("model") == m.key).to_dicts()}
        paper = study.published.get(m.figures, {})
        pool = pools[m.key] or (stored.config(m.key).token_pool if stored and m.key in stored.models() else None)
        for column, figure in COMPARED.items():
            r = found.get(column, {})
            rows.append({"model": m.key, "weights": m.spec.weights, "pool": pool, "statistic": column,
                         "featstore": r.get("mean"), "seed_std": r.get("std"), "seed_min": r.get("min"),
                         "seed_max": r.get("max"), "seeds": r.get("seeds"), "n": r.get("n"),
                         "paper": None if figure not in paper else float(paper[figure])})
    return pl.DataFrame(rows, schema=TABLE_SCHEMA)


def population_line(study: Study, db: Path | duckdb.DuckDBPyConnection) -> str:
    """Which images the table counts: the image set, how many of its images, by which rule, over which seeds."""
    pop = population(db).filter(pl.col("view") == "clean")
    if pop.is_empty():
        return "population: no probe runs yet"
    counted = sorted(set(pop["counted"].to_list()))
    rule = (f"every image out of sample ({study.cross_fit}-fold cross-fit)" if study.cross_fit
            else "the held-out 30% test split")
    first = pop.row(0, named=True)
    how_many = str(counted[0]) if len(counted) == 1 else f"{counted[0]}-{counted[-1]}"
    return (f"population: {how_many} of {first['images']} images ({first['classes']} classes) of "
            f"{first['source']}: {rule}; probe seeds {', '.join(map(str, study.seeds))}")


def _jsonable(params: dict) -> dict:
    return json.loads(json.dumps(params, default=str))


def _bar(progress: bool, total: int, name: str):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="step", desc=name, dynamic_ncols=True)
