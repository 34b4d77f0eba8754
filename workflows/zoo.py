"""`featstore zoo`: the study DDB and CSS exist for. For every model of a zoo, its top-1 accuracy and its circuit
on an in-distribution (ID) image set and on one or more out-of-distribution (OOD) sets; then, across the
models, how well each label-free circuit metric predicts OOD accuracy (DDB, before deployment) or the accuracy
drop (CSS, after deployment): R² of the linear fit, Spearman and Kendall correlations (`zoo_eval`, and the τ
sweep `zoo_tau_sweep`).

The zoo is a TOML file ([id], [[ood]], [[models]]; relative paths are relative to it): docs/zoo.md gives the
format.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from featstore.analytics import db as fsdb
from featstore.analytics.circuit_graphs import store_graph_css
from featstore.analytics.queries import query
from featstore.compute.attribution import CircuitConfig, compute_circuit, load_graph
from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
from featstore.errors import FeatstoreError
from featstore.images.datasets import ViewDataset, labels_for_head
from featstore.images.views import parse_view
from featstore.records import ZooRow
from featstore.schema import FIELDS, IG_STEPS, TAU, TIMM_WEIGHTS, TOP_N, VIEW, Text, check_fields
from featstore.threads import ThreadPolicy
from featstore.workflows.toml_files import TABLE, entries, local_path, read_toml, section


@dataclass(frozen=True)
class ImageSetSpec:
    """One image set of the zoo: its name in the runs, where its images are, and the view applied to them."""

    name: str
    images: ImageSource
    view: str = VIEW


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: its key in the database and the network."""

    name: str
    model: ModelSpec


@dataclass(frozen=True)
class ZooSpec:
    study: str
    id: ImageSetSpec
    ood: list[ImageSetSpec]
    models: list[ZooModel]


@dataclass(frozen=True)
class ZooConfig:
    """Everything `featstore zoo` takes; the CLI only fills this in. `limit` caps every image set (default: the
    circuits' 500)."""

    config: Path
    db: Path
    ig_steps: int = IG_STEPS
    limit: int | None = None
    tau: float = TAU
    top_n: int = TOP_N
    run: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self) -> None:
        check_fields(self, ("ig_steps", "limit", "tau", "top_n"))


@dataclass
class ZooResult:
    study: str
    runs: list[ZooRow] = field(default_factory=list)
    table: object = None  # polars frame of zoo_eval for this study


SET_KEYS = {"name": Text(), "data": Text(), "view": Text(), "labels": Text()}
MODEL_KEYS = {"name": Text(), "model": Text(), "weights": Text(), "image_size": FIELDS["image_size"]}


def read_zoo(path: str | Path) -> ZooSpec:
    """Parse and check a zoo TOML file; every problem (an unknown key, a value of the wrong type) is one line
    naming the file and the entry."""
    path = Path(path)
    doc = read_toml(path, f"no zoo file at {path}; write a TOML file with [id], [[ood]] and [[models]]", str(path))
    doc = section(str(path), doc, {"id": TABLE, "ood": TABLE, "models": TABLE, "study": Text()},
                  {"id", "ood", "models"})
    base = path.parent

    def image_set(where: str, entry: object, default_name: str | None, default_data: Path | None) -> ImageSetSpec:
        entry = section(where, entry, SET_KEYS, set() if default_data else {"data"})
        name = entry.get("name", default_name)
        if not name:
            raise FeatstoreError(f"{where}: give each OOD set a name")
        parse_view(entry.get("view", "clean"))  # a bad view name fails here, before any model runs
        source = ImageSource(local_path(entry["data"], base) if "data" in entry else default_data,
                             local_path(entry["labels"], base) if "labels" in entry else None)
        return ImageSetSpec(name, source, entry.get("view", "clean"))

    id_set = image_set(f"{path} [id]", doc["id"], "id", None)
    oods = [image_set(f"{path} [[ood]] #{i + 1}", o, None, id_set.images.data)
            for i, o in enumerate(entries(doc["ood"]))]
    models = []
    for i, entry in enumerate(entries(doc["models"])):
        entry = section(f"{path} [[models]] #{i + 1}", entry, MODEL_KEYS, {"name", "model"})
        weights = entry.get("weights", TIMM_WEIGHTS)
        models.append(ZooModel(entry["name"], ModelSpec(
            entry["model"], weights if weights in ("default", "none") else str(local_path(weights, base)),
            entry.get("image_size"))))
    names = [s.name for s in [id_set, *oods]]
    for what, values in (("image set", names), ("model", [m.name for m in models])):
        repeated = {v for v in values if values.count(v) > 1}
        if repeated:
            raise FeatstoreError(f"{path}: {what} name {sorted(repeated)[0]!r} appears twice; names key the runs")
    if len(models) < 3:
        raise FeatstoreError(f"{path}: a zoo needs at least 3 models to correlate anything (found {len(models)})")
    return ZooSpec(doc.get("study", path.stem), id_set, oods, models)


def check_zoo(spec: ZooSpec, cfg: ZooConfig) -> None:
    """Before any circuit runs: every model loads, its head covers the image sets' classes, and its rewritten
    graph reproduces it on a few ID images (the self-check every circuits run repeats)."""
    sets = [spec.id, *spec.ood]
    images = {s.name: _circuit_config(cfg, model=None, image_set=s).source.discover(cfg.run.seed) for s in sets}
    for model in spec.models:
        loaded, graph = load_graph(model.model, cfg.run.seed, cfg.run.device, model.name)
        for s in sets:
            try:
                labels_for_head(images[s.name], loaded.num_classes)  # the rule compute_circuit scores with
            except FeatstoreError as e:
                raise FeatstoreError(f"zoo model {model.name}, image set {s.name}: ", *e.whole()) from e
        probe = ViewDataset(images[spec.id.name], loaded.preprocessing, [parse_view(spec.id.view)])
        x = torch.stack([probe[i][1][0] for i in range(min(4, len(probe)))])
        device = next(graph.model.parameters()).device
        with ThreadPolicy(cfg.run.threads, device):
            graph.self_check(loaded.preprocessing.normalize(x.to(device)))
        del loaded, graph


def run_zoo(cfg: ZooConfig) -> ZooResult:
    """Accuracies and circuits of every zoo model on every image set, into the database; then the table."""
    spec = read_zoo(cfg.config)
    check_zoo(spec, cfg)
    result = ZooResult(spec.study)
    con = fsdb.connect(cfg.db)
    try:
        for model in spec.models:
            rows = []
            for role, image_set in [("id", spec.id)] + [("ood", s) for s in spec.ood]:
                circuit = compute_circuit(_circuit_config(cfg, model, image_set))
                fsdb.write_circuit(con, circuit.run, circuit.edges, circuit.scores)
                rows.append(ZooRow(spec.study, circuit.run.model, image_set.name, role, circuit.accuracy,
                                   circuit.run.n_images, circuit.run.run_id))
            fsdb.replace_zoo_runs(con, rows)
            result.runs += rows
        id_run = {r.model: r.circuit_run for r in result.runs if r.role == "id"}
        pairs = [(id_run[r.model], r.circuit_run) for r in result.runs if r.role == "ood"]
        store_graph_css(con, pairs, cfg.top_n)
    finally:
        con.close()
    result.table = query(cfg.db, "SELECT * FROM zoo_eval(tau := ?, top_n := ?) WHERE study = ?",
                         [cfg.tau, cfg.top_n, spec.study])
    return result


def _circuit_config(cfg: ZooConfig, model: ZooModel | None, image_set: ImageSetSpec) -> CircuitConfig:
    """The circuit run of one zoo model on one image set (`model` None: only its image source is used)."""
    images = replace(image_set.images, limit=cfg.limit)
    return CircuitConfig(model=model.model if model else ModelSpec("none"), images=images, view=image_set.view,
                         ig_steps=cfg.ig_steps, name=model.name if model else None, dataset=image_set.name,
                         run=cfg.run)
