"""`featstore zoo`: the study DDB and CSS exist for. For every model of a zoo, its top-1 accuracy and its circuit
on an in-distribution (ID) image set and on one or more out-of-distribution (OOD) sets; then, across the
models, how well each label-free circuit metric predicts OOD accuracy (DDB, before deployment) or the accuracy
drop (CSS, after deployment): R² of the linear fit, Spearman and Kendall correlations (`zoo_eval`, and the τ
sweep `zoo_tau_sweep`).

The zoo is a TOML file; relative paths are relative to it:

    study = "digits"                  # optional; default: the file's name
    [id]
    data = "digits-test"              # ImageFolder (or flat folder with labels = "labels.csv")
    view = "clean"                    # optional; name = "id" by default
    [[ood]]
    name = "noise"
    view = "gaussian_noise-3"         # data defaults to the ID folder: a corruption view of it
    [[ood]]
    name = "other"
    data = "other-folder"             # or another folder of the same classes
    [[models]]
    name = "vit-e8"                   # the model's key in the database
    model = "test_vit"                # a timm VisionTransformer name
    weights = "vit-e8.pth"            # default | none | a state-dict path
    image_size = 64                   # optional
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from featstore.analytics import db as fsdb
from featstore.analytics.circuit_graphs import store_graph_css
from featstore.analytics.queries import query
from featstore.circuits import CircuitConfig, compute_circuit, load_graph
from featstore.datasets import ViewDataset, discover
from featstore.errors import FeatstoreError
from featstore.views import parse_view
from featstore.workflows.toml_files import read_toml


@dataclass(frozen=True)
class ImageSetSpec:
    name: str
    data: str
    view: str = "clean"
    labels: str | None = None


@dataclass(frozen=True)
class ZooModel:
    name: str
    model: str
    weights: str = "default"
    image_size: int | None = None


@dataclass(frozen=True)
class ZooSpec:
    study: str
    id: ImageSetSpec
    ood: list[ImageSetSpec]
    models: list[ZooModel]


@dataclass
class ZooConfig:
    """Everything `featstore zoo` takes; the CLI only fills this in."""

    config: str
    db: str
    ig_steps: int = 5
    limit: int | None = 500
    batch_size: int = 32
    device: str = "auto"
    workers: int | None = None
    seed: int = 0
    tau: float = 0.3
    top_n: int = 200
    progress: bool = True


@dataclass
class ZooResult:
    study: str
    runs: list[tuple] = field(default_factory=list)  # (model, dataset, role, accuracy, n_images, circuit_run)
    table: object = None  # polars frame of zoo_eval for this study


def _section(where: str, table: dict, required: set[str], optional: set[str]) -> dict:
    if not isinstance(table, dict):
        raise FeatstoreError(f"{where} must be a table of keys")
    unknown = set(table) - required - optional
    if unknown:
        raise FeatstoreError(f"{where}: unknown key {sorted(unknown)[0]!r} (allowed: "
                             f"{', '.join(sorted(required | optional))})")
    missing = required - set(table)
    if missing:
        raise FeatstoreError(f"{where}: missing key {sorted(missing)[0]!r}")
    return table


def read_zoo(path: str | Path) -> ZooSpec:
    """Parse and check a zoo TOML file; every problem is one line naming the file and the entry."""
    path = Path(path)
    doc = read_toml(path, f"no zoo file at {path}; write a TOML file with [id], [[ood]] and [[models]]", str(path))
    _section(str(path), doc, {"id", "ood", "models"}, {"study"})
    base = path.parent

    def local(p: str) -> str:
        return str(p if Path(p).expanduser().is_absolute() else base / p)

    def image_set(where: str, entry: dict, default_name: str | None, default_data: str | None) -> ImageSetSpec:
        entry = _section(where, entry, set() if default_data else {"data"}, {"name", "data", "view", "labels"})
        name = entry.get("name", default_name)
        if not name:
            raise FeatstoreError(f"{where}: give each OOD set a name")
        parse_view(entry.get("view", "clean"))  # a bad view name fails here, before any model runs
        return ImageSetSpec(str(name), local(entry["data"]) if "data" in entry else default_data,
                            entry.get("view", "clean"), local(entry["labels"]) if "labels" in entry else None)

    id_set = image_set(f"{path} [id]", doc["id"], "id", None)
    ood = doc["ood"] if isinstance(doc["ood"], list) else [doc["ood"]]
    oods = [image_set(f"{path} [[ood]] #{i + 1}", o, None, id_set.data) for i, o in enumerate(ood)]
    models = []
    for i, entry in enumerate(doc["models"] if isinstance(doc["models"], list) else [doc["models"]]):
        entry = _section(f"{path} [[models]] #{i + 1}", entry, {"name", "model"}, {"weights", "image_size"})
        weights = str(entry.get("weights", "default"))
        models.append(ZooModel(str(entry["name"]), str(entry["model"]),
                               weights if weights in ("default", "none") else local(weights),
                               entry.get("image_size")))
    names = [s.name for s in [id_set, *oods]]
    for what, values in (("image set", names), ("model", [m.name for m in models])):
        repeated = {v for v in values if values.count(v) > 1}
        if repeated:
            raise FeatstoreError(f"{path}: {what} name {sorted(repeated)[0]!r} appears twice; names key the runs")
    if len(models) < 3:
        raise FeatstoreError(f"{path}: a zoo needs at least 3 models to correlate anything (found {len(models)})")
    return ZooSpec(str(doc.get("study", path.stem)), id_set, oods, models)


def check_zoo(spec: ZooSpec, cfg: ZooConfig) -> None:
    """Before any circuit runs: every model loads, its head covers the image sets' classes, and its rewritten
    graph reproduces it on a few ID images (the self-check every circuits run repeats)."""
    sets = [spec.id, *spec.ood]
    images = {s.name: discover(s.data, s.labels, cfg.limit, cfg.seed) for s in sets}
    for model in spec.models:
        loaded, graph = load_graph(model.model, model.weights, cfg.seed, model.image_size, cfg.device, model.name)
        for s in sets:
            classes = int(images[s.name].labels.max()) + 1
            if classes > loaded.num_classes:
                raise FeatstoreError(f"model {model.name} has {loaded.num_classes} outputs but image set {s.name} "
                                     f"has {classes} classes; its accuracy would be meaningless")
        probe = ViewDataset(images[spec.id.name], loaded.preprocessing, [parse_view(spec.id.view)])
        x = torch.stack([probe[i][1][0] for i in range(min(4, len(probe)))])
        device = next(graph.model.parameters()).device
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
                circuit = compute_circuit(CircuitConfig(
                    model=model.model, data=image_set.data, view=image_set.view, labels=image_set.labels,
                    weights=model.weights, image_size=model.image_size, ig_steps=cfg.ig_steps, limit=cfg.limit,
                    batch_size=cfg.batch_size, device=cfg.device, workers=cfg.workers, seed=cfg.seed,
                    progress=cfg.progress, name=model.name, dataset=image_set.name))
                fsdb.write_circuit(con, circuit.run, circuit.edges, circuit.scores)
                rows.append((circuit.run["model"], image_set.name, role, circuit.accuracy, circuit.run["n_images"],
                             circuit.run["run_id"]))
            fsdb.replace_zoo_runs(con, spec.study, rows)
            result.runs += rows
        pairs = [(next(r[5] for r in result.runs if r[0] == m and r[2] == "id"), run)
                 for m, _, role, _, _, run in result.runs if role == "ood"]
        store_graph_css(con, pairs, cfg.top_n)
    finally:
        con.close()
    result.table = query(cfg.db, "SELECT * FROM zoo_eval(tau := ?, top_n := ?) WHERE study = ?",
                         [cfg.tau, cfg.top_n, spec.study])
    return result
