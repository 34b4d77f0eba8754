"""Benchmark the decision-timeline SQL against the per-image Python loop a user would write without it.

50,000 images x 12 anchors x 35 runs (5 models x 7 views) of synthetic predictions are written into DuckDB the
way `featstore probe` writes them (which also derives the `decisions` table, timed separately). Then the full
k = 1..4 summary sweep (`decision_sweep(4)`: mean, median, std, early/mid/late, never-stable and
stable-but-wrong per run and k) is timed against a plain-Python loop over the same predictions computing the
same numbers, and the two are checked to agree.

    python bench/analytics.py [--images 50000] [--models 5] [--views 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.records import DatasetInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the generated test data
from synthetic import run_rows  # noqa: E402

ANCHORS = 12


def synthetic_predictions(rng: np.random.Generator, n: int, t: int, classes: int = 1000) -> np.ndarray:
    """Predictions that settle at a bimodal anchor with flicker before it, some never settling."""
    preds = rng.integers(0, classes, (n, t + 1), dtype=np.int32)
    settle = np.where(rng.random(n) < 0.4, rng.integers(0, 4, n), rng.integers(7, t + 2, n))
    final = rng.integers(0, classes, n)
    for s in range(t + 1):
        rows = settle <= s
        preds[rows, s] = final[rows]
    return preds


def python_sweep(preds: np.ndarray, labels: np.ndarray, ks=(1, 2, 3, 4)) -> dict[int, dict]:
    """What a user writes without SQL: a loop over images, docs/design.md §7 literally, then the statistics."""
    t = preds.shape[1] - 1
    out = {}
    rows = preds.tolist()
    for k in ks:
        layers, stable_correct = [], []
        for timeline, label in zip(rows, labels.tolist(), strict=True):
            layer = t
            for start in range(t - k + 1):
                window = timeline[start : start + k + 1]
                if all(p == window[0] for p in window):
                    layer = start
                    break
            layers.append(layer)
            if layer < t:
                stable_correct.append(timeline[layer] == label)
        n = len(layers)
        out[k] = {"mean": sum(layers) / n, "median": statistics.median(layers), "std": statistics.pstdev(layers),
                  "f_early": sum(v < 0.3 * t for v in layers) / n,
                  "f_late": sum(v >= 0.7 * t for v in layers) / n,
                  "never_stable": sum(v == t for v in layers) / n,
                  "stable_but_wrong": 1 - sum(stable_correct) / max(1, len(stable_correct))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--models", type=int, default=5)
    parser.add_argument("--views", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    db = Path(tempfile.mkdtemp()) / "bench.duckdb"
    con = fsdb.connect(db)
    n = args.images
    ids = np.arange(n)
    labels = rng.integers(0, 1000, n)
    fsdb.register_images(con, DatasetInfo("bench", "synthetic", "-", 0), ids, np.array([f"{i}" for i in ids]),
                         labels, np.full(n, "test"))
    write = []
    truth = {}
    for m in range(args.models):
        for v in range(args.views):
            run_id = f"model{m}/view{v}/linear"
            preds = synthetic_predictions(rng, n, ANCHORS - 1)
            run = {"run_id": run_id, "model": f"model{m}", "view": f"view{v}", "train_view": "view0",
                   "probe": "linear", "params": {}, "cross_fit": 0, "seed": 0, "store": "-"}
            start = time.perf_counter()
            fsdb.write_runs(con, [run_rows(run, ids, preds, rng.random(preds.shape))])
            write.append(time.perf_counter() - start)
            truth[run_id] = preds
    con.close()
    runs = len(truth)
    print(f"{n} images x {ANCHORS} anchors x {runs} runs = {n * ANCHORS * runs:,} predictions")
    print(f"  write + derive decisions per run: median {statistics.median(write):.2f} s")

    times = []
    for _ in range(3):
        start = time.perf_counter()
        sweep = q.k_sweep(db, [1, 2, 3, 4])
        times.append(time.perf_counter() - start)
    sql_time = min(times)

    start = time.perf_counter()
    con = fsdb.connect(db, read_only=True)
    reference = {}
    for run_id in truth:
        preds = con.execute("SELECT pred FROM predictions WHERE run_id = ? ORDER BY image_id, anchor",
                            [run_id]).fetchnumpy()["pred"].reshape(n, ANCHORS)
        reference[run_id] = python_sweep(preds, labels)
    con.close()
    loop_time = time.perf_counter() - start

    worst = 0.0
    for row in sweep.iter_rows(named=True):
        ref = reference[row["run_id"]][row["k"]]
        worst = max(worst, max(abs(row[key] - ref[key]) for key in ref))
    print(f"  SQL sweep k=1..4, all runs: {sql_time:.3f} s (best of 3)   target < 1 s")
    print(f"  Python per-image loop:      {loop_time:.1f} s   ->  SQL is {loop_time / sql_time:.0f}x faster "
          f"(target >= 50x)")
    print(f"  largest difference between the two over {len(sweep)} (run, k) rows and 7 statistics: {worst:.2e}")


if __name__ == "__main__":
    main()
