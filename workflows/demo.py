"""`featstore demo`: the whole pipeline, offline, on a CPU, in about a minute.

A generated image set (`layouts`: dots whose arrangement is the class, coloured by class in half the images
only; or scikit-learn's 8x8 digits as a second preset) -> a torchvision ResNet-18 trained on its train split
once (cached as a state dict, then loaded by `--weights PATH` like any checkpoint) -> a store with the preset
anchors and two corruption views -> probes (`linear` on every view; `knn`, `lens` and `paper` on the clean one, so
that `featstore compare` can set every definition of "when it decides" side by side) -> learned exit gates ->
DuckDB -> measured exit costs -> k-sweep, early-exit simulation and report.
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
from featstore.build import BuildConfig, build
from featstore.datasets import ImageSet, ViewDataset, discover
from featstore.errors import FeatstoreError
from featstore.models import load_model
from featstore.preprocessing import Preprocessing
from featstore.probing.split import make_split
from featstore.specs import ImageSource, ModelSpec, RunOptions
from featstore.threads import ThreadPolicy
from featstore.views import parse_views
from featstore.workflows.cost import measure_model
from featstore.workflows.gate import train_gate
from featstore.workflows.layouts import LAYOUTS, LayoutConfig, layout_image_folder
from featstore.workflows.probe import ProbeConfig, probe

IMAGE_SIZE = 32
VIEWS = "clean,gaussian_noise-2,gaussian_blur-1"
CLEAN_ONLY_VARIANTS = ("knn", "lens", "paper")  # beside linear on every view: the definitions compare reads


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


def fit_resnet18(x: torch.Tensor, y: torch.Tensor, train: torch.Tensor, num_classes: int, epochs: int,
                 seed: int = 0, progress: bool = True, desc: str = "training resnet18",
                 threads: int | None = None) -> torch.nn.Module:
    """Train torchvision's resnet18 from scratch on rows `train` of a normalised in-memory batch (AdamW, one-cycle
    learning rate to 2e-3, batches of 64): the demo's recipe, shared with bench/demo_depth.py. The weights are
    initialised from torch's global generator (seed it first); `seed` orders the batches. CPU threads: `threads`,
    or the idle cores, looked at again as batches go (`featstore.threads`)."""
    import torchvision
    from tqdm import tqdm

    model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    optimiser = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    per_epoch = -(-len(train) // 64)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=2e-3, total_steps=epochs * per_epoch)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    bar = tqdm(total=epochs * len(train), unit="img", desc=desc, disable=not progress, dynamic_ncols=True,
               leave=True)
    with ThreadPolicy(threads, x.device) as policy:
        for epoch in range(epochs):
            order = train[torch.randperm(len(train), generator=gen)]
            for i in range(0, len(order), 64):
                policy.update()
                batch = order[i : i + 64]
                loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                schedule.step()
                bar.update(len(batch))
                bar.set_postfix(epoch=f"{epoch + 1}/{epochs}", loss=f"{loss.item():.3f}", threads=policy.current,
                                refresh=False)
    bar.close()
    return model.eval()


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


def run_demo(out: Path, dataset: str = "layouts", epochs: int | None = None, limit: int | None = None,
             run: RunOptions | None = None) -> DemoResult:
    """Everything under out/<dataset>/: images, cached network, store, database and report. `run` gives the
    progress bars and CPU threads of every step (its device is the CPU's: the demo is a CPU demo)."""
    run = run or RunOptions()
    if dataset not in DATASETS:
        raise FeatstoreError(f"--dataset {dataset!r}: choose one of {', '.join(DATASETS)}")
    preset = DATASETS[dataset]
    epochs = preset.epochs if epochs is None else epochs
    if epochs < 1:
        raise FeatstoreError(f"--epochs {epochs}: train for at least one epoch")
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
    timed("probe", lambda: probe(ProbeConfig(store=store, model="resnet18", db=db, view="all", run=run)))
    for variant in CLEAN_ONLY_VARIANTS:
        timed("probe", lambda v=variant: probe(ProbeConfig(store=store, model="resnet18", db=db, variant=v, run=run)))
    clean_runs = q.query(db, "SELECT run_id FROM runs WHERE view = 'clean' ORDER BY run_id")["run_id"].to_list()
    timed("gate", lambda: [train_gate(db, run) for run in clean_runs])
    record_image_source(db, data, discover(data).class_names)
    timed("cost", lambda: measure_model("resnet18", db, store, device="cpu", batch_sizes=(1,), repeats=5,
                                        threads=run.threads))
    report = home / "report"
    timed("report", lambda: write_report(db, report))
    sweep = q.k_sweep(db).filter((pl.col("view") == "clean") & (pl.col("probe") == "linear"))
    return DemoResult(db, report / "report.html", sweep, q.corruption_shift(db, 2), seconds)
