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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import duckdb
import polars as pl

from featstore.analytics.queries import paper_table
from featstore.analytics.report import write_report
from featstore.build import BuildConfig, build
from featstore.errors import FeatstoreError
from featstore.probing.base import get_variant
from featstore.probing.run import run_id_for
from featstore.store import FeatureStore, model_key
from featstore.workflows.probe import ProbeConfig, probe
from featstore.workflows.toml_files import read_toml

# paper_table columns shown beside the published figures; both stable-but-wrong readings face the paper's one
COMPARED = {"last_anchor_accuracy": "last_anchor_accuracy", "mean_layer": "mean_layer", "f_early": "f_early",
            "f_late": "f_late", "never_stable": "never_stable",
            "stable_but_wrong_among_stable": "stable_but_wrong", "stable_but_wrong_of_all": "stable_but_wrong",
            "corruption_delta": "corruption_delta"}


@dataclass
class ModelSpec:
    name: str  # as --model takes it
    weights: str
    key: str  # store group and DuckDB model
    image_size: int | None = None
    anchors: str | None = None


@dataclass
class Study:
    name: str
    file: Path
    data: Path
    labels: Path | None
    limit: int | None
    out: Path
    views: list[str]
    models: list[ModelSpec]
    variants: list[str]
    seeds: list[int]
    split_seed: int = 0
    cross_fit: int = 0
    k: int = 2
    build: dict = field(default_factory=dict)  # batch_size, chunk_rows, device, workers, precision
    probe: dict = field(default_factory=dict)  # device, memory_budget, val_frac
    published: dict = field(default_factory=dict)  # model name -> {statistic: value}
    published_source: str = ""


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
    store: Path
    report: Path
    table: pl.DataFrame
    ran: list[str]
    skipped: list[str]
    published_source: str


BUILD_KEYS = ("batch_size", "chunk_rows", "device", "workers", "precision")
PROBE_KEYS = ("device", "memory_budget", "val_frac")


def load_study(path: str | Path, data: str | Path | None = None, out: str | Path | None = None) -> Study:
    """Read and check a study file; `data` and `out` override its data.path and the default output folder."""
    path = Path(path)
    spec = read_toml(path, f"study file {path} does not exist; see studies/paper.toml for the format",
                     f"study file {path}")
    name = str(spec.get("name") or path.stem)
    section = spec.get("data", {})
    where = data or section.get("path")
    if not where:
        raise FeatstoreError(f"study file {path} names no images: give --data or [data] path")
    base = path.parent
    labels = section.get("labels")
    models = []
    for m in spec.get("models", []):
        if "name" not in m:
            raise FeatstoreError(f"study file {path}: every [[models]] entry needs a name")
        weights = m.get("weights", "auto")
        for w in [weights] if isinstance(weights, str) else weights:
            key = model_key(m["name"]) if isinstance(weights, str) else model_key(f"{m['name']}.{w}")
            models.append(ModelSpec(m["name"], str(w), key, m.get("image_size"), m.get("anchors")))
    if not models:
        raise FeatstoreError(f"study file {path} lists no [[models]]")
    probe_section = spec.get("probe", {})
    variants = list(probe_section.get("variants", ["linear"]))
    for v in variants:
        get_variant(v)  # unknown variants fail before anything runs
    build_section = spec.get("build", {})
    views = list(build_section.get("views", ["clean"]))
    if "clean" not in views:
        raise FeatstoreError(f"study file {path}: views must include clean (probes train on it)")
    published, source = _published(spec, base)
    return Study(
        name=name, file=path, data=_resolve(where, base if not data else Path.cwd()),
        labels=_resolve(labels, base) if labels else None, limit=section.get("limit"),
        out=Path(out) if out else Path.cwd() / f"study-{name}", views=views, models=models, variants=variants,
        seeds=[int(s) for s in probe_section.get("seeds", [0])], split_seed=int(probe_section.get("split_seed", 0)),
        cross_fit=int(probe_section.get("cross_fit", 0)), k=int(spec.get("k", 2)),
        build={k: build_section[k] for k in BUILD_KEYS if k in build_section},
        probe={k: probe_section[k] for k in PROBE_KEYS if k in probe_section},
        published=published, published_source=source)


def _resolve(p: str | Path, base: Path) -> Path:
    p = Path(p).expanduser()
    return p if p.is_absolute() else base / p


def _published(spec: dict, base: Path) -> tuple[dict, str]:
    if not spec.get("published"):
        return {}, ""
    figures = _resolve(spec["published"], base)
    table = read_toml(figures, f"published figures {figures} do not exist; fix `published` in the study file",
                      f"published figures {figures}")
    return table.get("models", {}), table.get("source", str(figures))


def plan(study: Study) -> list[Step]:
    """Every step of the study in order: builds, then probes, then the report."""
    store, db = study.out / "store.zarr", study.out / "featstore.duckdb"
    steps = []
    for m in study.models:
        cfg = BuildConfig(model=m.name, data=study.data, store=store, views=",".join(study.views),
                          labels=study.labels, weights=m.weights, anchors=m.anchors, image_size=m.image_size,
                          limit=study.limit, name=m.key if m.key != model_key(m.name) else None, progress=False,
                          **study.build)
        params = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items() if k != "progress"}
        steps.append(Step(f"build {m.key}", params, f"build {m.key} [{len(study.views)} views]",
                          lambda cfg=cfg: build(cfg), lambda key=m.key: _built(store, key, study.views)))
    for m in study.models:
        for variant in study.variants:
            for seed in study.seeds:
                cfg = ProbeConfig(store=store, model=m.key, db=db, view=",".join(study.views), variant=variant,
                                  cross_fit=study.cross_fit, seed=seed, split_seed=study.split_seed,
                                  progress=False, **study.probe)
                runs = [run_id_for(m.key, v, get_variant(variant).canonical_id, "clean", study.cross_fit, seed)
                        for v in study.views]
                params = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()
                          if k != "progress"}
                steps.append(Step(f"probe {runs[0]}", params, f"probe {m.key} {variant} seed {seed}",
                                  lambda cfg=cfg: probe(cfg), lambda runs=runs: _probed(db, runs)))
    report = study.out / "report"
    steps.append(Step("report", {"k": study.k}, "report", lambda: write_report(db, report),
                      lambda: (report / "report.html").is_file()))
    return steps


def _built(store: Path, key: str, views: list[str]) -> bool:
    if not (store / "zarr.json").is_file():
        return False
    fs = FeatureStore(store)
    if key not in fs.models():
        return False
    return all(v in fs.views(key) and fs.done(key, v).all() for v in views)


def _probed(db: Path, runs: list[str]) -> bool:
    if not db.is_file():
        return False
    con = duckdb.connect(str(db), read_only=True)
    try:
        found = {r for (r,) in con.execute("SELECT run_id FROM runs WHERE list_contains(?, run_id)", [runs]).fetchall()}
    finally:
        con.close()
    return found == set(runs)


def run_study(path: str | Path, data: str | Path | None = None, out: str | Path | None = None,
              progress: bool = True) -> StudyResult:
    """Run every unfinished step of the study, then return the paper-shaped table beside the published one."""
    study = load_study(path, data, out)
    if not study.data.is_dir():
        raise FeatstoreError(f"image folder {study.data} does not exist; pass --data or fix [data] path")
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
    return StudyResult(db, study.out / "store.zarr", study.out / "report" / "report.html", beside_paper(study, db),
                       ran, skipped, study.published_source)


def beside_paper(study: Study, db: Path) -> pl.DataFrame:
    """One row per (model, weights, statistic): ours at k (first variant, first seed) and the paper's figure."""
    variant = get_variant(study.variants[0]).canonical_id
    ours = paper_table(db, study.k)
    rows = []
    for m in study.models:
        run_id = run_id_for(m.key, "clean", variant, "clean", study.cross_fit, study.seeds[0])
        found = ours.filter(pl.col("run_id") == run_id).to_dicts()
        paper = study.published.get(m.name, {})
        for column, figure in COMPARED.items():
            value = found[0].get(column) if found else None
            rows.append({"model": m.key, "weights": m.weights, "statistic": column,
                         "featstore": None if value is None else float(value),
                         "paper": None if figure not in paper else float(paper[figure])})
    return pl.DataFrame(rows, schema={"model": pl.String, "weights": pl.String, "statistic": pl.String,
                                      "featstore": pl.Float64, "paper": pl.Float64})


def _jsonable(params: dict) -> dict:
    return json.loads(json.dumps(params, default=str))


def _bar(progress: bool, total: int, name: str):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="step", desc=name, dynamic_ncols=True)
