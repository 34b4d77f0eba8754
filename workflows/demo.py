"""`featstore demo`: the whole pipeline, offline, on a CPU, in a few minutes.

Real images that a dependency ships (scikit-learn's 8x8 digits, upsampled to 32 px) -> a torchvision
ResNet-18 trained on them once (cached as a state dict, then loaded by `--weights PATH` like any checkpoint)
-> a store with the preset anchors and two corruption views -> probes -> DuckDB -> measured exit costs ->
k-sweep, early-exit simulation and report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from featstore.analytics.costs import measure_model
from featstore.analytics.report import write_report
from featstore.build import BuildConfig, build
from featstore.datasets import ViewDataset, discover
from featstore.models import load_model
from featstore.probing.run import ProbeConfig, probe
from featstore.probing.split import make_split
from featstore.synthetic import digits_image_folder
from featstore.views import parse_views

IMAGE_SIZE = 32
VIEWS = "clean,gaussian_noise-2,gaussian_blur-1"


@dataclass
class DemoResult:
    db: Path
    report: Path
    seconds: dict


def train_digits_resnet(data: Path, target: Path, epochs: int, seed: int = 0, progress: bool = True) -> Path:
    """Train torchvision's resnet18 (10 classes) on the train split of the digits, with featstore's own
    preprocessing at 32 px, and save its state dict. Test images are never trained on."""
    torch.manual_seed(seed)
    import torchvision

    prep = load_model("resnet18", weights="none", seed=seed, image_size=IMAGE_SIZE).preprocessing
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    images = discover(data)
    dataset = ViewDataset(images, prep, parse_views("clean"))
    x = prep.normalize(torch.stack([dataset[i][1][0] for i in range(len(dataset))]))
    y = torch.from_numpy(images.labels)
    train = torch.from_numpy(np.flatnonzero(make_split(images.image_ids, seed) == "train"))
    optimiser = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    steps = epochs * -(-len(train) // 64)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=2e-3, total_steps=steps)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for epoch in range(epochs):
        order = train[torch.randperm(len(train), generator=gen)]
        for i in range(0, len(order), 64):
            batch = order[i : i + 64]
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
        if progress:
            print(f"  training resnet18 on digits: epoch {epoch + 1}/{epochs}, loss {loss.item():.3f}", flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), target)
    return target


def run_demo(out: Path, epochs: int = 4, limit: int | None = None, progress: bool = True) -> DemoResult:
    out = Path(out)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    data = out / "digits"
    if not data.exists():
        digits_image_folder(data, size=IMAGE_SIZE, limit=limit)
    weights = out / f"digits-resnet18-e{epochs}.pth"
    if not weights.exists():  # cached: a second demo run skips training
        train_digits_resnet(data, weights, epochs, progress=progress)
    seconds["train"] = time.perf_counter() - start

    start = time.perf_counter()
    store = out / "digits.zarr"
    build(BuildConfig(model="resnet18", data=data, store=store, weights=str(weights), image_size=IMAGE_SIZE,
                      views=VIEWS, chunk_rows=256, progress=progress))
    seconds["build"] = time.perf_counter() - start

    start = time.perf_counter()
    db = out / "featstore.duckdb"
    probe(ProbeConfig(store=store, model="resnet18", db=db, view="all", progress=progress))
    seconds["probe"] = time.perf_counter() - start

    start = time.perf_counter()
    measure_model("resnet18", db, store, device="cpu", batch_sizes=(1,), repeats=10)
    seconds["cost"] = time.perf_counter() - start

    start = time.perf_counter()
    report = write_report(db, out / "report")
    seconds["report"] = time.perf_counter() - start
    return DemoResult(db, report, seconds)
