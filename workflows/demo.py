"""`featstore demo`: the whole pipeline, offline, on a CPU, in about a minute.

A generated image set (`layouts`: dots whose arrangement is the class, coloured by class in half the images only; or
scikit-learn's 8x8 digits as a second preset) -> a torchvision ResNet-18 trained on its train split once (cached as
a state dict, then loaded by `--weights PATH` like any checkpoint) -> a store with the preset anchors and two
corruption views -> probes (`linear` on every view; `knn`, `head-probe` and `paper` on the clean one, so that
`featstore compare` can set every definition of "when it decides" side by side, and `linear` one step of its C grid
either way, so that the report can say how much of the timeline the probe decides) -> learned exit gates -> DuckDB
-> measured exit costs -> k-sweep, early-exit simulation and report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch
from PIL import Image

from featstore.analytics import queries as q
from featstore.analytics.db import record_image_source
from featstore.analytics.report import write_report
from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
from featstore.errors import FeatstoreError
from featstore.images.datasets import ImageSet, ViewDataset, discover
from featstore.images.preprocessing import Preprocessing
from featstore.images.views import parse_views
from featstore.nets.models import load_model
from featstore.probing.split import make_split
from featstore.schema import DEMO_DATASET, K
from featstore.threads import ThreadPolicy
from featstore.workflows.build import BuildConfig, build
from featstore.workflows.cka import compute_cka
from featstore.workflows.cost import measure_model
from featstore.workflows.gate import train_gate
from featstore.workflows.layouts import LAYOUTS, LayoutConfig, layout_image_folder
from featstore.workflows.probe import ProbeConfig, probe

IMAGE_SIZE = 32
VIEWS = "clean,gaussian_noise-2,gaussian_blur-1"
CLEAN_ONLY_VARIANTS = ("knn", "head-probe", "paper")  # beside linear on every view: the definitions compare reads
# linear one step of its C grid either way from the C each anchor's val rows choose: with the families above, the
# probe set of the report's opening section (docs/design.md §5, "Robustness")
NEIGHBOUR_C = ("linear:C_step=-1", "linear:C_step=1")


def digits_image_folder(root: str | Path, size: int = 32, limit: int | None = None) -> Path:
    """scikit-learn's 8x8 handwritten digits (real data that ships offline) as an ImageFolder of PNGs,
    upsampled to `size` px, grey as RGB. Needs scikit-learn (a dev/demo dependency)."""
    from sklearn.datasets import load_digits

    root = Path(root)
    digits = load_digits()
    images, targets = digits.images, digits.target
    if limit is not None:
        images, targets = images[:limit], targets[:limit]
    for i, (img, y) in enumerate(zip(images, targets, strict=True)):
        folder = root / f"digit_{int(y)}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (np.clip(img / 16.0, 0, 1) * 255).astype(np.uint8)
        Image.fromarray(pixels).convert("RGB").resize((size, size), Image.BILINEAR).save(folder / f"{i:04d}.png")
    return root


@dataclass(frozen=True)
class DemoDataset:
    """One demo image set: how to write it (into a folder, optionally only `limit` images) and how long to
    train the network on it by default."""

    write: Callable[[Path, int | None], Path]
    epochs: int
    what: str


def _layouts(root: Path, limit: int | None) -> Path:
    per_class = LayoutConfig.per_class if limit is None else max(1, limit // len(LAYOUTS))
    return layout_image_folder(root, LayoutConfig(size=IMAGE_SIZE, per_class=per_class))


DATASETS: dict[str, DemoDataset] = {
    "layouts": DemoDataset(_layouts, 5, "dot layouts, class colour in half the images"),
    "digits": DemoDataset(lambda root, limit: digits_image_folder(root, size=IMAGE_SIZE, limit=limit), 4,
                          "scikit-learn's 8x8 digits"),
}


@dataclass
class DemoResult:
    db: Path
    report: Path
    sweep: pl.DataFrame  # k-sweep of the clean run
    shift: pl.DataFrame  # corruption shift at k = 2
    seconds: dict[str, float]


def clean_batch(images: ImageSet, prep: Preprocessing) -> torch.Tensor:
    """Every image of a set through featstore's own preprocessing, normalised, as one [N, 3, H, W] batch: what
    the small networks of the demo and the benchmarks train on, in memory."""
    dataset = ViewDataset(images, prep, parse_views("clean"))
    return prep.normalize(torch.stack([dataset[i][1][0] for i in range(len(dataset))]))


MICRO_BATCHES = 2  # each batch of 64 is two micro-batches of 32, each computed on one thread


def fit_resnet18(x: torch.Tensor, y: torch.Tensor, train: torch.Tensor, num_classes: int, epochs: int,
                 seed: int = 0, progress: bool = True, desc: str = "training resnet18",
                 threads: int | None = None) -> torch.nn.Module:
    """Train torchvision's resnet18 from scratch on rows `train` of a normalised in-memory batch (AdamW, one-cycle
    learning rate to 2e-3, batches of 64): the demo's recipe, shared with bench/demo_depth.py. The weights are
    initialised from torch's global generator (seed it first); `seed` orders the batches.

    The same network whatever the thread count: float sums split over another number of threads differ in the last
    bits, and minutes of training turn that into another network. So each batch is `MICRO_BATCHES` micro-batches,
    each run forward and backward on one thread (batch norm over its own 32 rows, on its own copy of the running
    statistics), their gradient sums and statistics added in a fixed order; with two threads (`threads`, or the
    idle cores, looked at again as batches go: `featstore.threads`) the micro-batches run side by side."""
    import copy
    from concurrent.futures import ThreadPoolExecutor

    import torchvision
    from torch.func import functional_call
    from tqdm import tqdm

    model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    # foreach: the same bits as the per-tensor loop (checked), in a few passes over the 11 M weights instead of ten
    # small ops per tensor (the per-tensor loop took about a tenth of the training's time)
    optimiser = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4, foreach=True)
    per_epoch = -(-len(train) // 64)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=2e-3, total_steps=epochs * per_epoch)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    replicas = [copy.deepcopy(model) for _ in range(MICRO_BATCHES)]  # functional_call swaps a module's tensors

    def micro_batch(j: int, rows: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], dict]:
        stats = {k: v.clone() for k, v in buffers.items()}
        out = functional_call(replicas[j], ({**params, **stats},), (x[rows],))
        loss = torch.nn.functional.cross_entropy(out, y[rows], reduction="sum")
        return loss.detach(), torch.autograd.grad(loss, list(params.values())), stats

    bar = tqdm(total=epochs * len(train), unit="img", desc=desc, disable=not progress, dynamic_ncols=True,
               leave=True)
    before = torch.get_num_threads()
    with ThreadPolicy(threads, x.device, sets_torch=False) as policy, ThreadPoolExecutor(MICRO_BATCHES) as pool:
        torch.set_num_threads(1)
        try:
            for epoch in range(epochs):
                order = train[torch.randperm(len(train), generator=gen)]
                for i in range(0, len(order), 64):
                    batch = order[i : i + 64]
                    parts = [p for p in torch.chunk(batch, MICRO_BATCHES) if len(p)]
                    if policy.update() > 1:
                        results = list(pool.map(micro_batch, range(len(parts)), parts))
                    else:
                        results = [micro_batch(j, p) for j, p in enumerate(parts)]
                    # the sums and AdamW's step are elementwise: the same bits at any thread count (checked)
                    torch.set_num_threads(policy.current)
                    for k, param in enumerate(params.values()):
                        param.grad = _in_order([r[1][k] for r in results]).div_(len(batch))
                    with torch.no_grad():
                        for name, value in buffers.items():  # running statistics: the micro-batches' mean
                            stats = [r[2][name] for r in results]
                            value.copy_(_in_order(stats).div_(len(stats)) if value.is_floating_point() else stats[0])
                    optimiser.step()
                    schedule.step()
                    torch.set_num_threads(1)
                    bar.update(len(batch))
                    loss = float(sum(r[0] for r in results)) / len(batch)
                    bar.set_postfix(epoch=f"{epoch + 1}/{epochs}", loss=f"{loss:.3f}", threads=policy.current,
                                    refresh=False)
        finally:
            torch.set_num_threads(before)
    bar.close()
    return model.eval()


def _in_order(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The sum of tensors added first to last (a fixed order: the same bits however they were computed), into the
    first one (fresh gradients and statistics no one else reads: no copy of the 11 M weights' worth)."""
    total = tensors[0]
    for t in tensors[1:]:
        total += t
    return total


def train_resnet18(data: Path, target: Path, epochs: int, seed: int = 0, progress: bool = True,
                   threads: int | None = None) -> Path:
    """Train torchvision's resnet18 on the train split of an image folder, with featstore's own
    preprocessing at 32 px, and save its state dict. Test images are never trained on."""
    prep = load_model("resnet18", weights="none", seed=seed, image_size=IMAGE_SIZE).preprocessing  # seeds torch
    images = discover(data)
    train = torch.from_numpy(np.flatnonzero(make_split(images.image_ids, seed) == "train"))
    model = fit_resnet18(clean_batch(images, prep), torch.from_numpy(images.labels), train,
                         len(images.class_names), epochs, seed, progress,
                         desc=f"training resnet18 on {data.parent.name}", threads=threads)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), target)
    return target


def run_demo(out: Path, dataset: str = DEMO_DATASET, epochs: int | None = None, limit: int | None = None,
             run: RunOptions | None = None) -> DemoResult:
    """Everything under out/<dataset>/: images, cached network, store, database and report. `run` gives the
    progress bars and CPU threads of every step (its device is the CPU's: the demo is a CPU demo)."""
    run = run or RunOptions()
    if dataset not in DATASETS:
        raise FeatstoreError(f"choose one of {', '.join(DATASETS)}", field="dataset", value=dataset)
    preset = DATASETS[dataset]
    epochs = preset.epochs if epochs is None else epochs
    if epochs < 1:
        raise FeatstoreError("train for at least one epoch", field="epochs", value=epochs)
    home = Path(out) / dataset
    seconds: dict[str, float] = {}

    def timed(stage: str, work: Callable[[], object]) -> None:
        start = time.perf_counter()
        work()
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - start

    data = home / "images"
    if not data.exists():
        timed("data", lambda: preset.write(data, limit))
    weights = home / f"resnet18-e{epochs}.pth"
    if not weights.exists():  # cached: a second demo run skips training
        timed("train", lambda: train_resnet18(data, weights, epochs, progress=run.progress, threads=run.threads))
    store, db = home / "store.zarr", home / "featstore.duckdb"
    run = RunOptions(progress=run.progress, threads=run.threads)
    timed("build", lambda: build(BuildConfig(model=ModelSpec("resnet18", str(weights), IMAGE_SIZE),
                                             images=ImageSource(data), store=store, views=VIEWS, chunk_rows=256,
                                             run=run)))
    # a rerun (or one after an interruption) keeps the probe runs already landed from this store as they are
    timed("probe", lambda: probe(ProbeConfig(store=store, model="resnet18", db=db, view="all", run=run,
                                             keep_landed=True)))
    for variant in CLEAN_ONLY_VARIANTS + NEIGHBOUR_C:
        timed("probe", lambda v=variant: probe(ProbeConfig(store=store, model="resnet18", db=db, variant=v, run=run,
                                                           keep_landed=True)))
    clean_runs = q.runs(db).filter(pl.col("view") == "clean")["run_id"].to_list()
    timed("gate", lambda: [train_gate(db, run) for run in clean_runs])
    record_image_source(db, data, discover(data).class_names)
    timed("cost", lambda: measure_model("resnet18", db, store, device="cpu", batch_sizes=(1,), repeats=5,
                                        threads=run.threads))
    timed("cka", lambda: compute_cka(store, "resnet18", db, threads=run.threads, progress=run.progress))
    report = home / "report"
    timed("report", lambda: write_report(db, report))
    chosen = q.runs(db).filter((pl.col("view") == "clean") & (pl.col("probe_id") == "linear"))["run_id"]
    sweep = q.k_sweep(db, runs=chosen.to_list())  # the linear probe at its chosen C, not its neighbours
    return DemoResult(db, report / "report.html", sweep, q.corruption_shift(db, K), seconds)
