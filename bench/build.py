"""Benchmark `featstore build` against the bare forward pass and a naive hook-and-copy extraction loop.

All three run in this one process on the same generated JPEGs (resnet18, 224 px crop, CPU by default) and
the script prints images/s and the ratios its targets are stated in:
  build / bare forward  (target >= 0.90)      build / naive loop  (target >= 1.5)
The bare forward is the model alone (no taps) on tensors decoded beforehand, as the library builds it
(contiguous); it is also timed in channels_last, the layout featstore runs convolutional models in, so the
second ratio isolates what decoding, taps and writes cost on top of the same forward. The naive loop is what a
thingsvision-style extractor does: hook every anchor, copy each full output to the host with .cpu() every
batch, pool in numpy, save .npy chunks. Rounds alternate between the three to spread machine noise.

    python bench/build.py [--images 256] [--model resnet18] [--device cpu] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
from featstore.images.datasets import ViewDataset, collate, discover
from featstore.images.loading import default_workers
from featstore.images.views import View
from featstore.nets.anchors import PRESETS
from featstore.nets.models import load_model
from featstore.runtime import resolve_device, tune_allocator
from featstore.workflows.build import BuildConfig, build

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the generated test data
from synthetic import make_image_folder  # noqa: E402


def bare_forward(model: torch.nn.Module, batches: list[torch.Tensor], device: torch.device,
                 memory_format: torch.memory_format = torch.contiguous_format) -> float:
    model.to(memory_format=memory_format)
    start = time.perf_counter()
    with torch.inference_mode():
        for x in batches:
            model(x.to(device).contiguous(memory_format=memory_format))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def featstore_build(data: Path, model: str, device: str, batch: int, workers: int, size: int | None) -> float:
    store = Path(tempfile.mkdtemp()) / "bench.zarr"
    start = time.perf_counter()
    build(BuildConfig(model=ModelSpec(model, "none", size), images=ImageSource(data), store=store,
                      run=RunOptions(device=device, batch_size=batch, workers=workers, progress=False)))
    seconds = time.perf_counter() - start
    shutil.rmtree(store.parent)
    return seconds


def naive_loop(data: Path, model_name: str, device: torch.device, batch: int, workers: int,
               size: int | None) -> float:
    """Hooks keep full feature maps; each batch copies them to the host, pools in numpy, saves .npy files.
    Decoding goes through a plain DataLoader with the same number of workers (capped at cores-1, as a user
    would set it), through featstore's own decode function so that both decode the same pixels."""
    workers = min(workers, max(0, (os.cpu_count() or 1) - 1))
    out = Path(tempfile.mkdtemp())
    start = time.perf_counter()
    loaded = load_model(model_name, "none", 0, size)
    model = loaded.module.to(device)
    images = discover(data)
    loader = torch.utils.data.DataLoader(ViewDataset(images, loaded.preprocessing, [View("clean")]),
                                         batch_size=batch, collate_fn=collate, num_workers=workers)
    modules = dict(model.named_modules())
    names = [a if not a.endswith(".mid") else a[:-4] + ".bn1" for a in PRESETS[model_name]]
    captured: dict[str, torch.Tensor] = {}
    for n in names:
        modules[n].register_forward_hook(lambda m, i, o, n=n: captured.__setitem__(n, o.detach().clone()))
    with torch.inference_mode():
        for b, (_, (x,), _) in enumerate(loader):
            model(loaded.preprocessing.normalize(x.to(device)))
            for n in names:
                full = captured[n].cpu().numpy()
                np.save(out / f"{n}_{b:05d}.npy", full.mean(axis=(2, 3)) if full.ndim == 4 else full)
    seconds = time.perf_counter() - start
    shutil.rmtree(out)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    tune_allocator()
    device = resolve_device(args.device)
    workers = args.workers if args.workers is not None else default_workers(device)
    tmp = Path(tempfile.mkdtemp())
    per_class = max(1, args.images // 8)
    data = make_image_folder(tmp / "images", n_classes=8, per_class=per_class, size=(500, 375))
    n = 8 * per_class

    loaded = load_model(args.model, "none", 0, args.image_size)
    model = loaded.module.to(device)
    images = discover(data)
    decoded = []
    for p in images.paths:
        with Image.open(data / p) as im:
            decoded.append(loaded.preprocessing.crop_uint8(im.convert("RGB")))
    batches = [loaded.preprocessing.normalize(torch.stack(decoded[i:i + args.batch_size]))
               for i in range(0, n, args.batch_size)]
    bare_forward(model, batches[:1], device)  # warm-up

    times: dict[str, list[float]] = {"bare forward": [], "bare forward NHWC": [], "featstore build": [],
                                     "naive loop": []}
    for _ in range(args.rounds):
        times["bare forward"].append(bare_forward(model, batches, device))
        times["bare forward NHWC"].append(bare_forward(model, batches, device, torch.channels_last))
        times["featstore build"].append(featstore_build(data, args.model, args.device, args.batch_size, workers,
                                                        args.image_size))
        times["naive loop"].append(naive_loop(data, args.model, device, args.batch_size, workers, args.image_size))
    shutil.rmtree(tmp)

    rate = {k: n / min(v) for k, v in times.items()}
    print(f"{args.model}, {n} generated 500x375 JPEGs, crop {loaded.preprocessing.crop}, device {device}, "
          f"batch {args.batch_size}, {workers} decode process(es), {torch.get_num_threads()} torch threads, "
          f"best of {args.rounds}")
    for k, r in rate.items():
        print(f"  {k:18s} {r:8.1f} img/s")
    print(f"  build / bare forward = {rate['featstore build'] / rate['bare forward']:.2f}  (target >= 0.90)")
    print(f"  build / bare forward NHWC = {rate['featstore build'] / rate['bare forward NHWC']:.2f}")
    print(f"  build / naive loop   = {rate['featstore build'] / rate['naive loop']:.2f}  (target >= 1.5)")


if __name__ == "__main__":
    main()
