"""The other jobs from Python, one per command (`featstore merge`, `export`, `gc`, `cost`, `circuits`, `cka`,
`gate`, `zoo`, `study`, `demo`, `anchors`): each a thin typed call of the workflow (or core function) that does
the work, so that the CLI and a notebook run the same code. (The jobs' modules load torch or DuckDB: each function
imports what it runs.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from featstore.api.jobs import _config_or_fields
from featstore.errors import FeatstoreTypeError
from featstore.nets.listing import anchor_listing
from featstore.schema import DEMO_DATASET, GATE_SPLIT, MIN_AGE_S, VIEW, check_field

if TYPE_CHECKING:
    from featstore.compute.attribution import CircuitConfig, CircuitResult
    from featstore.compute.similarity import CkaResult
    from featstore.compute.specs import RunOptions
    from featstore.records import ModelCost
    from featstore.workflows.demo import DemoResult
    from featstore.workflows.gate import GateResult
    from featstore.workflows.gc import Unreferenced
    from featstore.workflows.merge import MergeResult
    from featstore.workflows.study import StudyResult
    from featstore.workflows.zoo import ZooConfig, ZooResult


def anchors(model: str, every: bool = False) -> list[str]:
    """The lines `featstore anchors` prints: the anchors a model gets by default with what each hooks, or (`every`)
    every name `anchors=` accepts, one per line; a preset's defaults are read without loading the model."""
    return anchor_listing(_model_name(model), every)


def _model_name(model: object) -> str:
    if not isinstance(model, str):
        raise FeatstoreTypeError("give a model's name ('resnet18', 'timm/vit_small_patch16_224', "
                                 "...)", field="model", value=model)
    return model


def merge(db: str | Path, sources: str | Path | Sequence[str | Path], replace: bool = False) -> MergeResult:
    """Fold `sources` (databases of jobs that ran at the same time: one path or a list) into `db`, all or nothing
    (`featstore merge`); merging a source twice changes nothing."""
    from featstore.analytics.selection import database, databases
    from featstore.workflows.merge import merge as run_merge

    return run_merge(database(db), databases(sources, "sources", empty=True), replace)


def export(db: str | Path, out: str | Path) -> list[Path]:
    """Every table of `db` as Parquet under `out` (`featstore export`); returns the files written."""
    from featstore.workflows.export import export as run_export

    return run_export(db, out)


def gc(store: str | Path, dbs: str | Path | Sequence[str | Path] = (), model: str | None = None,
       min_age: float = MIN_AGE_S, dry_run: bool = False) -> list[Unreferenced]:
    """Remove the saved probe versions no run names, where every database in reach says so (`dbs`: one path or a
    list) and nothing of them was written for `min_age` seconds (`featstore gc`); returns every unreferenced
    version, removable or kept."""
    from featstore.analytics.selection import databases
    from featstore.workflows.gc import collect

    return collect(store, databases(dbs, "dbs", empty=True), model, min_age, dry_run)


def cost(model: str, db: str | Path, store: str | Path | None = None, *, device: str | None = None,
         batch_sizes: int | Sequence[int] | None = None, repeats: int | None = None, image_size: int | None = None,
         threads: int | None = None, on_start: Callable[[], None] | None = None) -> list[ModelCost]:
    """Time every prefix of the network and every probe at each anchor, into the database (`featstore cost`);
    `batch_sizes` one or a list; None: the job's own default. `on_start()` is called once the input is checked,
    before the timing."""
    from featstore.analytics.selection import database, integers, plain
    from featstore.workflows.cost import measure_model

    sizes = integers(batch_sizes, "batch_sizes", "batch sizes")
    counts = {"repeats": repeats, "image_size": image_size, "threads": threads}
    given = {"device": device, "batch_sizes": sizes and [check_field("batch_size", b) for b in sizes],
             **{k: check_field(k, plain(v)) for k, v in counts.items() if v is not None}, "on_start": on_start}
    return measure_model(_model_name(model), database(db), store, **{k: v for k, v in given.items() if v is not None})


def circuits(config: CircuitConfig | None = None, /, *, db: str | Path, **fields: Any) -> CircuitResult:
    """EAP-IG edge scores of a ViT on one view into the database (`featstore circuits`): a `CircuitConfig` or its
    fields (model=ModelSpec(...), images=ImageSource(...), view=..., ...)."""
    from featstore.compute.attribution import CircuitConfig
    from featstore.workflows.circuits import run_circuits

    _config_or_fields("circuits", config, fields)
    return run_circuits(config if config is not None else CircuitConfig(**fields), Path(db))


def cka(store: str | Path, model: str, db: str | Path, view: str = VIEW, unbiased: bool = False,
        threads: int | None = None, progress: bool = False) -> CkaResult:
    """Linear CKA between every pair of a model's anchors from the stored features, into the database
    (`featstore cka`)."""
    from featstore.analytics.selection import database
    from featstore.workflows.cka import compute_cka

    return compute_cka(store, _model_name(model), database(db), view, unbiased, threads, progress)


def gate(db: str | Path, run: str | None = None, split: str = GATE_SPLIT,
         on_start: Callable[[str], None] | None = None) -> GateResult:
    """Fit the learned early-exit gate of a run (default: the database's only run) on its `split` images
    (`featstore gate`); `on_start(run_id)` is called once the input is checked, before the work."""
    from featstore.analytics.selection import database, only_run
    from featstore.workflows.gate import train_gate

    db = database(db)
    run_id = only_run(db, run)
    return train_gate(db, run_id, split, on_start=None if on_start is None else lambda: on_start(run_id))


def zoo(config: ZooConfig | None = None, /, **fields: Any) -> ZooResult:
    """A model zoo's ID/OOD accuracies and circuits, and how well DDB and CSS predict OOD accuracy (`featstore
    zoo`): a `ZooConfig` or its fields (config=TOML file, db=..., ...)."""
    from featstore.workflows.zoo import ZooConfig, run_zoo

    _config_or_fields("zoo", config, fields)
    return run_zoo(config if config is not None else ZooConfig(**fields))


def study(path: str | Path, data: str | Path | None = None, out: str | Path | None = None, progress: bool = True,
          store: str | Path | None = None, threads: int | None = None) -> StudyResult:
    """Run a declared grid (a TOML file) end to end; a rerun skips finished steps (`featstore study`)."""
    from featstore.workflows.study import run_study

    return run_study(path, data, out, progress, store, threads)


def demo(out: str | Path, dataset: str = DEMO_DATASET, epochs: int | None = None, limit: int | None = None,
         run: RunOptions | None = None) -> DemoResult:
    """The whole pipeline offline on generated images (`featstore demo`): a trained ResNet-18, its store, probes,
    database and report under `out`."""
    from featstore.workflows.demo import run_demo

    return run_demo(Path(out), dataset=dataset, epochs=epochs, limit=limit, run=run)


def load_demo() -> None:
    """Import what `demo` runs (torch, torchvision, zarr, DuckDB, Polars and the workflows) without running it: the
    CLI loads them before the work starts, with Python's cyclic collector paused meanwhile."""
    import featstore.workflows.demo  # noqa: F401


def example_images(folder: str | Path, size: int = 32, limit: int | None = None) -> Path:
    """scikit-learn's handwritten digits (real images that ship offline) as a folder of PNGs, one subfolder per
    class, `size` px: the images docs/python.md builds its store of (needs scikit-learn)."""
    from featstore.workflows.demo import digits_image_folder

    return digits_image_folder(folder, size, limit)
