"""Benchmark stores on object storage against local disk: `featstore build` and a streamed `featstore probe`.

A real S3 server (moto's server mode, the one the tests use) runs in its own process on a loopback port, so it
shares this machine's cores with featstore, as a MinIO beside a node would. Both sides run in this one process,
rounds alternating between local disk and S3 to spread machine noise, and the script prints the ratios its
targets are stated in:
  build to S3 / build to local disk          (images/s, target >= 0.8)
  probe streaming from S3 / from local disk  (seconds, target >= 0.7; the memory budget is a quarter of the
                                              features, so every epoch streams every chunk)

    python bench/object_store.py [--images 384] [--image-size 112] [--rows 20000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
from featstore.probing.base import UnconvergedProbe
from featstore.runtime import tune_allocator
from featstore.workflows.build import BuildConfig, build
from featstore.workflows.probe import ProbeConfig, probe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the generated test data, the server
from s3server import s3_server  # noqa: E402
from synthetic import class_clusters, make_image_folder, write_feature_store  # noqa: E402

RESNET18_DIMS = [64, 64, 64, 128, 128, 256, 256, 512, 512, 512]


def timed_build(data: Path, store: str, args) -> float:
    start = time.perf_counter()
    result = build(BuildConfig(model=ModelSpec("resnet18", "none", args.image_size), images=ImageSource(data),
                               store=store, chunk_rows=args.chunk_rows,
                               run=RunOptions(device="cpu", batch_size=32, progress=False)))
    seconds = time.perf_counter() - start
    assert result.chunks_written > 0
    return seconds


def timed_probe(store: str, db: Path, budget: int) -> float:
    start = time.perf_counter()
    probe(ProbeConfig(store=store, model="synthetic", db=db, memory_budget=str(budget), variant="linear:max_epochs=5",
                      run=RunOptions(device="cpu", threads=1, progress=False)))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=384, help="images of the build")
    parser.add_argument("--image-size", type=int, default=112)
    parser.add_argument("--chunk-rows", type=int, default=64)
    parser.add_argument("--rows", type=int, default=20_000, help="rows of the probed store")
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    warnings.simplefilter("ignore", UnconvergedProbe)  # 5 epochs on purpose: the same work on both sides
    tune_allocator()
    tmp = Path(tempfile.mkdtemp())
    per_class = args.images // 4
    data = make_image_folder(tmp / "images", n_classes=4, per_class=per_class, size=(160, 120), seed=3)
    n_images = 4 * per_class
    with s3_server() as server:
        os.environ.update(server.env)
        bucket = server.create_bucket("bench")
        print(f"S3 server: moto at {server.endpoint} (own process); {os.cpu_count()} cores, load "
              f"{os.getloadavg()[0]:.2f} at start", flush=True)

        local_s, s3_s = [], []
        for r in range(args.rounds):
            for side in (("local", "s3") if r % 2 == 0 else ("s3", "local")):
                if side == "local":
                    store = tmp / f"build{r}.zarr"
                    local_s.append(timed_build(data, str(store), args))
                    shutil.rmtree(store)
                else:
                    s3_s.append(timed_build(data, f"{bucket}/build{r}.zarr", args))
        lo, hi = n_images / min(local_s), n_images / min(s3_s)
        print(f"build resnet18 {args.image_size}px, {n_images} images, chunks of {args.chunk_rows} (best of "
              f"{args.rounds}): local {lo:.1f} img/s, S3 {hi:.1f} img/s, ratio {hi / lo:.2f} (target >= 0.8); load "
              f"{os.getloadavg()[0]:.2f}", flush=True)

        feats, labels = class_clusters(args.rows, args.classes, RESNET18_DIMS)
        nbytes = args.rows * sum(RESNET18_DIMS) * 4  # as the probe holds them: float32
        local_store = write_feature_store(tmp / "probe.zarr", feats, labels, args.classes)
        s3_store = f"{bucket}/probe.zarr"
        write_feature_store(s3_store, feats, labels, args.classes)
        local_p, s3_p = [], []
        for r in range(args.rounds):
            for side in (("local", "s3") if r % 2 == 0 else ("s3", "local")):
                db = tmp / f"{side}{r}.duckdb"
                if side == "local":
                    local_p.append(timed_probe(str(local_store), db, nbytes // 4))
                else:
                    s3_p.append(timed_probe(s3_store, db, nbytes // 4))
        lo, hi = min(local_p), min(s3_p)
        print(f"probe linear (5 epochs, 1 thread), {args.rows} rows x {len(RESNET18_DIMS)} anchors "
              f"({nbytes / 1e6:.0f} MB as float32, budget {nbytes // 4 / 1e6:.0f} MB: streamed; best of "
              f"{args.rounds}): local {lo:.1f} s, S3 {hi:.1f} s, ratio {lo / hi:.2f} (target >= 0.7); load "
              f"{os.getloadavg()[0]:.2f}")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
