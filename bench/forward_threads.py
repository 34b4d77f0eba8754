"""How far the build's forward moves with the thread count, and whether that moves a prediction of the default probe.

oneDNN's convolutions and MKL's matrix products split their sums by thread count, so the stored features of
`featstore build --threads 1` and `--threads 2` differ in their last bits (bit-identity across thread counts is not
to be had on the CPU; a resume is bit-identical at the same count, docs/build.md). This builds the digits (a
random-init resnet18 at 32 px, the test suite's digits store) at both counts, prints the largest difference of
every anchor's features and of the logits, then probes both stores with the default `linear` and counts the
predictions and decision layers that differ.

    python bench/forward_threads.py [--store-dtype float32]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb
import numpy as np

from featstore.store.reader import FeatureStore
from featstore.workflows.demo import digits_image_folder


def featstore(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "featstore.cli.main", *args, "--no-progress"], check=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store-dtype", default="auto", help="as featstore build's (float32: the forward's own bits)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    data = digits_image_folder(tmp / "images", size=32)
    preds, layers = {}, {}
    for threads in (1, 2):
        store, db = tmp / f"t{threads}.zarr", tmp / f"t{threads}.duckdb"
        featstore("build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--data", str(data),
                  "--store", str(store), "--threads", str(threads), "--store-dtype", args.store_dtype)
        featstore("probe", "--store", str(store), "--model", "resnet18", "--db", str(db), "--threads", "1")
        con = duckdb.connect(str(db), read_only=True)
        preds[threads] = con.execute("SELECT pred FROM predictions ORDER BY image_id, anchor").fetchnumpy()["pred"]
        layers[threads] = [con.execute("SELECT image_id, layer FROM decision_layers(?) ORDER BY image_id",
                                       [k]).fetchall() for k in (1, 2, 3, 4)]
        con.close()
    one, two = FeatureStore(tmp / "t1.zarr"), FeatureStore(tmp / "t2.zarr")
    print(f"stored features, --threads 1 vs 2 (--store-dtype {args.store_dtype}):")
    print("  anchor             dim   values differing   largest |difference|   largest relative")
    for anchor in one.anchors("resnet18"):
        a = one.read("resnet18", "clean", anchor.name).astype(np.float64)
        b = two.read("resnet18", "clean", anchor.name).astype(np.float64)
        diff = np.abs(a - b)
        rel = diff / np.maximum(np.abs(a), 1e-3)
        print(f"  {anchor.name:18s} {anchor.dim:4d}   {(diff > 0).mean():15.4%}   {diff.max():20.3g}   "
              f"{rel.max():16.3g}")
    la, lb = (s.read_logits("resnet18", "clean").astype(np.float64) for s in (one, two))
    print(f"  logits: {(la != lb).mean():.4%} of values differ, largest |difference| {np.abs(la - lb).max():.3g}")
    differ = int((preds[1] != preds[2]).sum())
    print(f"default linear probe on each store (--threads 1): {differ} of {preds[1].size} predictions differ; "
          f"decision layers identical at k = 1..4: {[layers[1][i] == layers[2][i] for i in range(4)]}")


if __name__ == "__main__":
    main()
