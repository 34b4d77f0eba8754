"""The build's own CPU cost per image: what the main thread (the one that feeds the GPU) spends outside the decode and
the forward, measured on a CPU with a null network of ResNet-50's tap shapes.

On a GPU machine the forward and the decode run on the device; what is left on the main thread's CPU (Python per
batch and per image, pathlib, hashing, checksums, Zarr writes, waiting for the GIL) is what caps `build`'s img/s
below the GPU's. Here the network is a null one with ResNet-50's twelve anchor widths (64 ... 2048) and 1,000
logits, so the store writes exactly what a ResNet-50 store writes per image (12,864 + 1,000 values), while the
forward costs ~nothing; the images are tiny JPEGs at a 16 px crop, so decoding and normalising cost little.

Printed per code version, in µs per image over the chunk loop: the main thread's CPU time; its share spent getting
the next input batch (reading, decoding, making the views: on a CPU the build does that on the main thread, taking
turns with the forward; on CUDA, worker processes and a thread of its own do); their difference, what the main
thread spends feeding the forward and handing its outputs on (the figure docs/benchmarks.md tracks: target <= 50
µs); the whole process's CPU time and the loop's wall time. Each measurement runs in a process of its own; with
`--baseline-python` (the interpreter of an environment where another commit of featstore is installed) the two
versions alternate, to spread machine noise.

    python bench/build_overhead.py [--images 8192] [--rounds 3] [--baseline-python /tmp/old/.venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESNET50_DIMS = [64, 256, 256, 512, 512, 1024, 1024, 1024, 1024, 2048, 2048, 2048]


def null_network(dims: list[int], classes: int = 1000):
    """A network whose anchors have `dims` channels and whose logits have `classes`, at ~no compute: each anchor
    scales one input value per channel, so the taps pool [B, C, 1, 1] maps, and the head reads three values."""
    import torch
    from torch import nn

    class Stage(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.randn(1, width, 1, 1))

        def forward(self, corner: torch.Tensor) -> torch.Tensor:
            return corner[:, :1] * self.scale

    class NullNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stages = nn.ModuleList(Stage(d) for d in dims)
            self.fc = nn.Linear(3, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            corner = x[:, :, :1, :1]
            for stage in self.stages:
                stage(corner)
            return self.fc(torch.flatten(corner, 1))

    torch.manual_seed(0)
    return NullNet().eval()


def measure(data: Path, images: int, views: str, batch: int, chunk_rows: int) -> dict:
    """One build of the null network in this process: CPU and wall per image of the chunk loop."""
    import featstore.workflows.build as build_module
    from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
    from featstore.images.preprocessing import Preprocessing
    from featstore.nets.models import IMAGENET_MEAN, IMAGENET_STD, LoadedModel

    prep = Preprocessing(18, 16, IMAGENET_MEAN, IMAGENET_STD)
    module = null_network(RESNET50_DIMS)
    build_module.load_model = lambda *a, **k: LoadedModel("null", "null", "torchvision", module, "null", prep, 1000)
    timed: dict = {}
    inner = build_module._run_chunks

    def run_chunks(*args, **kwargs):  # the chunk loop, timed on the thread that runs it (the main thread)
        cpu, proc, wall = time.thread_time(), time.process_time(), time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            timed.update(cpu=time.thread_time() - cpu, proc=time.process_time() - proc,
                         wall=time.perf_counter() - wall)

    build_module._run_chunks = run_chunks
    make_inputs = build_module.input_batches

    def input_batches(*args, **kwargs):  # the input path's share of the main thread (on CUDA: other threads')
        batches = iter(make_inputs(*args, **kwargs))
        while True:
            start = time.thread_time()
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                timed["input"] = timed.get("input", 0.0) + time.thread_time() - start
            yield batch

    build_module.input_batches = input_batches
    store = Path(tempfile.mkdtemp(prefix="overhead-")) / "s.zarr"
    anchors = ",".join(f"stages.{i}" for i in range(len(RESNET50_DIMS)))
    cfg = build_module.BuildConfig(model=ModelSpec("null", "none"), images=ImageSource(data, limit=images),
                                   store=store, views=views, anchors=anchors, chunk_rows=chunk_rows,
                                   decode="gpu", run=RunOptions(device="cpu", batch_size=batch, progress=False,
                                                                threads=1))
    result = build_module.build(cfg)
    n = result.images_processed
    us = 1e6 / n
    return {"images": n, "main_cpu_us": timed["cpu"] * us, "input_us": timed["input"] * us,
            "process_cpu_us": timed["proc"] * us, "wall_us": timed["wall"] * us, "build_seconds": result.seconds}


def make_images(root: Path, n: int) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from synthetic import make_image_folder

    if not root.exists():
        make_image_folder(root, n_classes=8, per_class=-(-n // 8), size=(20, 18))
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=8192)
    parser.add_argument("--views", default="clean")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--chunk-rows", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-python", help="the python of an environment with another version installed")
    parser.add_argument("--data", type=Path, help="image folder [default: generated under the temp folder]")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single measurement, as JSON
    args = parser.parse_args()
    data = make_images(args.data or Path(tempfile.gettempdir()) / f"overhead-images-{args.images}", args.images)
    if args.one:
        print(json.dumps(measure(data, args.images, args.views, args.batch, args.chunk_rows)))
        return
    versions = {"this": sys.executable}
    if args.baseline_python:
        versions["baseline"] = args.baseline_python
    rows: dict[str, list[dict]] = {k: [] for k in versions}
    for _ in range(args.rounds):
        for name, python in versions.items():
            out = subprocess.run([python, str(Path(__file__).resolve()), "--one", "--images", str(args.images),
                                  "--views", args.views, "--batch", str(args.batch), "--chunk-rows",
                                  str(args.chunk_rows), "--data", str(data)],
                                 env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                                 cwd=tempfile.gettempdir())
            if out.returncode:
                raise SystemExit(f"{name}: {out.stderr[-3000:]}")
            rows[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.images} images, views {args.views}, batch {args.batch}, chunk {args.chunk_rows}, "
          f"{os.cpu_count()} cores; median of {args.rounds} alternating rounds (µs per image)")
    print(f"{'version':10} {'main CPU':>9} {'input':>8} {'main - input':>13} {'process CPU':>12} {'wall':>8}")
    for name, rs in rows.items():
        med = {k: sorted(r[k] for r in rs)[len(rs) // 2] for k in rs[0]}
        print(f"{name:10} {med['main_cpu_us']:9.1f} {med['input_us']:8.1f} "
              f"{med['main_cpu_us'] - med['input_us']:13.1f} {med['process_cpu_us']:12.1f} {med['wall_us']:8.1f}")


if __name__ == "__main__":
    main()
