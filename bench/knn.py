"""Benchmark the `knn` probe against the `linear` probe on the same store, CPU, end to end (`featstore probe`: read
the store, fit every anchor, predict every row, write DuckDB), each in its own process so that its peak resident
memory is its own. Target: knn within 2x linear's time at the 1,000-class bench shape, memory bounded.

Stores (tests/synthetic.py `pooled_activations`, ImageNet-shaped: balanced classes, a few dominant directions):
- default: 1,000 classes x 36 rows, 12 anchors of the resnet18 preset's widths (bench/probes.py --imagenet);
- `--per-class 50 --dims resnet50`: 50,000 rows, 12 anchors of the resnet50 preset's widths (up to 2048);
- `--per-class 50 --dims 2048x12 --memory-only`: 50,000 x 12 anchors of width 2048 (4.9 GB as float32, above the
  4 GB default memory budget, so the features stream): knn's peak memory at its stated bound, from the fit (every
  train row memorised) and the prediction of the first `--blocks` query blocks (each block is freed before the
  next, so the peak does not grow with more of them); the full prediction is not run (hours on two cores).

knn's memory, by construction: its references (train rows x sum of widths x 2 bytes, float16) + the features held
by the source (all valid rows x sum of widths x 4 bytes when within --memory-budget, else one chunk) + one block x
tile of scores (2048 x 8192 x 4 bytes) per anchor being predicted. Printed beside the measured peak.

    python bench/knn.py [--per-class 36] [--dims resnet18|resnet50|2048x12|64,512] [--variants linear,knn] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the generated test data
from synthetic import pooled_activations, write_feature_store  # noqa: E402

DIMS = {"resnet18": [64, 64, 64, 64, 128, 128, 256, 256, 512, 512, 512, 512],
        "resnet50": [64, 256, 256, 512, 512, 1024, 1024, 1024, 1024, 2048, 2048, 2048],
        "2048x12": [2048] * 12}


def peak_bytes() -> int:
    """This process's peak resident set: VmHWM where Linux has it, since ru_maxrss carries over the high-water mark
    of the parent it was forked from (here the one that generated the store), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(store: str, db: str, variant: str, budget: str) -> None:
    """One `featstore probe` in this process; prints seconds, CPU seconds (user + system, all threads: less
    sensitive than wall time to what else shares the cores) and peak resident memory as JSON."""
    from featstore.compute.specs import RunOptions
    from featstore.runtime import tune_allocator
    from featstore.workflows.probe import ProbeConfig, probe

    tune_allocator()
    start = time.perf_counter()
    probe(ProbeConfig(store=Path(store), model="synthetic", db=Path(db), variant=variant, memory_budget=budget,
                      run=RunOptions(device="cpu", progress=False)))
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": seconds, "cpu_seconds": usage.ru_utime + usage.ru_stime,
                      "peak_bytes": peak_bytes(), "load": os.getloadavg()[0]}))


def memory_child(store: str, variant: str, budget: str, blocks: str) -> None:
    """knn's fit and the first `blocks` query blocks through the same code as `featstore probe`, without writing."""
    import torch

    from featstore.probing.base import get_variant
    from featstore.probing.run import ProbeData, ProbeSettings, fit_all, parse_bytes
    from featstore.probing.source import IN_MEMORY_BLOCK
    from featstore.probing.trainer import predict
    from featstore.runtime import tune_allocator
    from featstore.store.reader import FeatureStore

    tune_allocator()
    baseline = peak_bytes()  # the interpreter with torch loaded
    fs = FeatureStore(store)
    data = ProbeData(fs, "synthetic", fs.anchors("synthetic"), ["clean"], torch.device("cpu"), parse_bytes(budget),
                     ProbeSettings())
    start = time.perf_counter()
    fits = fit_all(data, get_variant(variant), "clean", progress=False, threads=None)
    fitted = time.perf_counter()
    rows = data.valid[: int(blocks) * max(IN_MEMORY_BLOCK, fs.chunk_rows("synthetic"))]
    predict(data.source("clean"), fits[0].probes, rows)
    done = time.perf_counter()
    print(json.dumps({"fit_seconds": fitted - start, "predicted_rows": len(rows), "predict_seconds": done - fitted,
                      "in_memory": data.source("clean").in_memory, "baseline_bytes": baseline,
                      "peak_bytes": peak_bytes()}))


def run(store: Path, db: Path, variant: str, budget: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(store), str(db), variant, budget],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    con = duckdb.connect(str(db), read_only=True)
    result["accuracy"] = [a for (a,) in con.execute(
        "SELECT avg((p.pred = i.label)::INT) FROM predictions p JOIN images i USING (image_id) "
        "WHERE i.split = 'test' GROUP BY p.anchor ORDER BY p.anchor").fetchall()]
    con.close()
    return result


def expected_knn_bytes(n: int, dims: list[int], budget: int) -> int:
    train = int(round(0.9 * round(0.7 * n)))
    source = n * sum(dims) * 4
    return train * sum(dims) * 2 + (source if source <= budget else 1024 * sum(dims) * 4) + 2048 * 8192 * 4 * 2


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:6])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--memory-child":
        memory_child(*sys.argv[2:6])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--per-class", type=int, default=36)
    parser.add_argument("--dims", default="resnet18", help="resnet18 | resnet50 | 2048x12 | a comma list")
    parser.add_argument("--variants", default="linear,knn")
    parser.add_argument("--repeat", type=int, default=1, help="alternate the variants this many times")
    parser.add_argument("--memory-budget", default="4GB")
    parser.add_argument("--keep", help="folder to keep (and reuse) the store in")
    parser.add_argument("--memory-only", action="store_true", help="knn's fit and first --blocks blocks: peak memory")
    parser.add_argument("--blocks", type=int, default=2)
    args = parser.parse_args()
    from featstore.probing.run import parse_bytes
    from featstore.threads import cores, runnable_elsewhere

    dims = DIMS.get(args.dims) or [int(d) for d in args.dims.split(",")]
    tmp = Path(args.keep or tempfile.mkdtemp())
    store = tmp / f"bench-{args.classes}x{args.per_class}-{args.dims}.zarr"
    if not store.exists():
        feats, labels = pooled_activations(args.classes, args.per_class, dims)
        write_feature_store(store, feats, labels, args.classes)
        del feats
    n = args.classes * args.per_class
    print(f"{n} rows ({args.classes} classes x {args.per_class}) x {len(dims)} anchors (widths "
          f"{','.join(map(str, dims))}), CPU, {cores()} cores, other runnable threads at the start: "
          f"{runnable_elsewhere():.1f}", flush=True)
    if args.memory_only:
        out = subprocess.run([sys.executable, __file__, "--memory-child", str(store), "knn", args.memory_budget,
                              str(args.blocks)], capture_output=True, text=True, check=True)
        m = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  knn fit {m['fit_seconds']:.1f} s (features {'in memory' if m['in_memory'] else 'streamed'}), "
              f"{m['predicted_rows']} rows predicted in {m['predict_seconds']:.1f} s; peak resident "
              f"{m['peak_bytes'] / 2**30:.2f} GiB ({(m['peak_bytes'] - m['baseline_bytes']) / 2**30:.2f} GiB above "
              f"the interpreter with torch loaded); expected by construction "
              f"{expected_knn_bytes(n, dims, parse_bytes(args.memory_budget)) / 2**30:.2f} GiB (+ the interpreter)")
        return
    results: dict[str, list[dict]] = {}
    for r in range(args.repeat):
        for variant in args.variants.split(","):
            result = run(store, tmp / f"{variant}-{r}.duckdb", variant, args.memory_budget)
            results.setdefault(variant, []).append(result)
            print(f"  {variant:8s} run {r + 1}: {result['seconds']:8.1f} s ({result['cpu_seconds']:8.1f} CPU s), peak "
                  f"resident {result['peak_bytes'] / 2**30:6.2f} GiB, 1-minute load at the end "
                  f"{result['load']:.1f}", flush=True)
    best = {v: min(x["seconds"] for x in rs) for v, rs in results.items()}
    if "knn" in best and "linear" in best:
        cpu = {v: min(x["cpu_seconds"] for x in rs) for v, rs in results.items()}
        print(f"  knn / linear (best of {args.repeat} each): {best['knn'] / best['linear']:.2f}x wall, "
              f"{cpu['knn'] / cpu['linear']:.2f}x CPU (target <= 2x)")
    if "knn" in results:
        print(f"  knn peak memory expected by construction: "
              f"{expected_knn_bytes(n, dims, parse_bytes(args.memory_budget)) / 2**30:.2f} GiB (+ the interpreter)")
    accs = {v: rs[0]["accuracy"] for v, rs in results.items()}
    print("  test accuracy per anchor: " + "; ".join(
        f"{v} " + " ".join(f"{a:.3f}" for a in acc) for v, acc in accs.items()))
    if len(accs) > 1:
        print("  mean accuracy: " + ", ".join(f"{v} {np.mean(a):.4f}" for v, a in accs.items()))


if __name__ == "__main__":
    main()
