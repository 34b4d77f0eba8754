"""Benchmark `featstore cka`'s streamed linear CKA (featstore/compute/similarity.py) against the plain in-memory
computation in numpy (every anchor loaded, columns centred, ||Xaᵀ Xb||² of every pair), each in its own process
so that its peak resident memory is its own; both in float64 on the same store, with the largest difference of
their matrices printed beside the timings.

Store: `--rows` images x `--anchors` anchors of width `--dim` (default 50,000 x 12 x 2048, the ImageNet-val shape
of resnet50's widest anchors), rectified Gaussian features with a few shared directions, float16 as builds store
them, written chunk by chunk into a real store (tests/synthetic.py `write_feature_store`). The streamed one holds
one chunk of every anchor it sums plus at most --memory-budget of running sums; numpy holds all features in float64
(rows x dim x anchors x 8 bytes: 9.8 GB at the default shape).

    python bench/cka.py [--rows 50000] [--width 2048] [--anchors 12] [--threads 1] [--memory-budget 1GB]
                        [--unbiased] [--skip-numpy] [--concurrent]
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the generated test data
from synthetic import write_feature_store  # noqa: E402


def peak_bytes() -> int:
    """This process's peak resident set (Linux VmHWM: ru_maxrss would carry over the parent's)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024


def make_store(path: Path, rows: int, dim: int, anchors: int, seed: int = 0) -> None:
    """Features whose similarity falls with the distance between anchors (each a noisy mix of the previous)."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(0, 1, (rows, 4)).astype(np.float32)
    feats, x = [], rng.normal(0, 1, (rows, dim)).astype(np.float32)
    for _ in range(anchors):
        x = 0.8 * x + 0.6 * rng.normal(0, 1, (rows, dim)).astype(np.float32)
        mix = shared @ rng.normal(0, 1, (4, dim)).astype(np.float32)
        feats.append(np.maximum(x + mix + 0.5, 0).astype(np.float16))
    write_feature_store(path, feats, np.zeros(rows, dtype=np.int64), 2, chunk_rows=1024)


def numpy_cka(store: str, unbiased: bool) -> np.ndarray:
    """The careful in-memory baseline: each anchor's full matrix as float64, centred in place, ||Xᵀ X||_F once per
    anchor and ||Yᵀ X||_F² once per pair (78 products for 12 anchors, as many as the streamed sums)."""
    from featstore.store.reader import FeatureStore

    if unbiased:
        raise SystemExit("the numpy baseline is the biased estimator (the n x n unbiased one is tests/test_cka.py's)")
    fs = FeatureStore(store)
    xs = []
    for anchor in fs.anchors("synthetic"):
        x = fs.read("synthetic", "clean", anchor.name).astype(np.float64)
        x -= x.mean(0)
        xs.append(x)
    norms = [np.linalg.norm(x.T @ x) for x in xs]
    out = np.eye(len(xs))
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            out[i, j] = out[j, i] = np.square(xs[j].T @ xs[i]).sum() / (norms[i] * norms[j])
    return out


def child(method: str, store: str, threads: int, budget: int, unbiased: bool, out: str) -> None:
    """One computation in this process; prints seconds, CPU seconds and peak resident memory as JSON."""
    import torch

    torch.set_num_threads(threads)
    start, cpu = time.perf_counter(), time.process_time()
    if method == "streamed":
        from featstore.compute.similarity import anchor_cka

        result = anchor_cka(store, "synthetic", unbiased=unbiased, memory_budget=budget, threads=threads)
        matrix, passes = result.matrix, result.passes
    else:
        matrix, passes = numpy_cka(store, unbiased), 1
    np.save(out, matrix)
    print(json.dumps({"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu,
                      "peak": peak_bytes(), "passes": passes}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--dim", "--width", type=int, default=2048)
    parser.add_argument("--anchors", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory-budget", default="1GB")
    parser.add_argument("--unbiased", action="store_true")
    parser.add_argument("--skip-numpy", action="store_true", help="Only the streamed computation.")
    parser.add_argument("--concurrent", action="store_true",
                        help="Run both computations at once (one process each; wall time then shares the cores).")
    parser.add_argument("--child", nargs=3, metavar=("METHOD", "STORE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    from featstore.probing.run import parse_bytes

    budget = parse_bytes(args.memory_budget)
    if args.child:
        child(args.child[0], args.child[1], args.threads, budget, args.unbiased, args.child[2])
        return
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "s.zarr"
        start = time.perf_counter()
        make_store(store, args.rows, args.dim, args.anchors)
        print(f"store: {args.rows} rows x {args.anchors} anchors x {args.dim} wide (float16), written in "
              f"{time.perf_counter() - start:.1f} s; {args.threads} thread(s), budget {args.memory_budget}")
        methods = ("streamed", *(() if args.skip_numpy else ("numpy",)))
        flags = [f"--threads={args.threads}", f"--memory-budget={args.memory_budget}",
                 *(["--unbiased"] if args.unbiased else [])]
        env = {**os.environ, **{k: str(args.threads) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                                "MKL_NUM_THREADS")}}  # numpy's BLAS too
        results = {}

        def launch(method: str) -> subprocess.Popen:
            return subprocess.Popen([sys.executable, __file__, *flags, "--child", method, str(store),
                                     str(Path(tmp) / f"{method}.npy")], stdout=subprocess.PIPE, text=True, env=env)

        running = [launch(m) for m in methods] if args.concurrent else []
        for i, method in enumerate(methods):
            job = running[i] if args.concurrent else launch(method)
            out, _ = job.communicate()
            if job.returncode:
                raise SystemExit(f"the {method} computation failed (exit {job.returncode})")
            results[method] = {**json.loads(out.strip().splitlines()[-1]),
                               "matrix": np.load(Path(tmp) / f"{method}.npy")}
        base = results.get("numpy")
        print(f"{'method':10s} {'seconds':>9s} {'cpu s':>9s} {'peak MB':>9s} {'passes':>7s} {'time/numpy':>11s} "
              f"{'memory/numpy':>13s}")
        for method, r in results.items():
            ratio = (f"{r['seconds'] / base['seconds']:11.2f} {r['peak'] / base['peak']:13.2f}" if base else "")
            print(f"{method:10s} {r['seconds']:9.1f} {r['cpu']:9.1f} {r['peak'] / 2**20:9.0f} {r['passes']:7d} {ratio}")
        if base is not None:
            gap = np.abs(results["streamed"]["matrix"] - base["matrix"]).max()
            print(f"largest |streamed - numpy| over the CKA matrix: {gap:.2e}")
        m = results["streamed"]["matrix"]
        print(f"CKA of neighbouring anchors {np.mean(np.diag(m, 1)):.3f}, first vs last {m[0, -1]:.3f}")


if __name__ == "__main__":
    main()
