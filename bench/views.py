"""What a noise view's draws cost on the CPU: generator 3 (32-bit hashing, `gaussian_field32`, what new views use)
against generator 2 (SplitMix64 over int64 and a 2^20-knot table, `gaussian_field`, what stores made with it keep)
and generator 1 (per-image torch.Generator draws, for reference), side by side in one process, in fresh rounds that
interleave them (2 3 1 2 3 1 ...) so that a change of the machine's load falls on all alike.

Prints, per thread count, the milliseconds per image and view (a [3, size, size] crop) of each generator: wall
(the best round) and CPU of every thread (the best round: spinning OpenMP workers show there), generator 2's over
generator 3's as a ratio, and the target (generator 3 <= 1 ms wall per 224 px image on 2 threads, quiet). The
allocator is tuned as `featstore build` tunes it. The
machine's load (os.getloadavg) is printed before and after: on a shared machine the wall figures say little, the
CPU figures and the ratios more.

    python bench/views.py [--images 16] [--size 224] [--rounds 7] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch

from featstore.images.views import gaussian_field, gaussian_field32, parse_view
from featstore.runtime import tune_allocator

CPU = torch.device("cpu")
TARGET_MS = 1.0


def generators(ids: list[int], shape: tuple[int, int, int]) -> dict[int, Callable[[], object]]:
    """Each generator's draws for the batch `ids` of one noise view, by generator number."""
    view = parse_view("gaussian_noise-1")
    return {2: lambda: gaussian_field(view.name, ids, shape, CPU),
            3: lambda: gaussian_field32(view.name, ids, shape, CPU),
            1: lambda: torch.stack([view.noise(i, shape) for i in ids])}


def timed(threads: int, ids: list[int], shape: tuple[int, int, int], rounds: int) -> dict[int, tuple[float, float]]:
    """generator -> (best wall ms, best CPU ms) per image at `threads` torch threads."""
    torch.set_num_threads(threads)
    draws = generators(ids, shape)
    for draw in draws.values():  # tables made, buffers and thread pools warm
        draw()
    best = {g: (float("inf"), float("inf")) for g in draws}
    for _ in range(rounds):
        for g, draw in draws.items():
            wall, cpu = time.perf_counter(), time.process_time()
            draw()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            best[g] = (min(best[g][0], wall * 1e3 / len(ids)), min(best[g][1], cpu * 1e3 / len(ids)))
    return best


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=16, help="images per batch (one call per batch)")
    parser.add_argument("--size", type=int, default=224, help="the crop's side in pixels")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per generator (the best is kept)")
    parser.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated")
    args = parser.parse_args()
    tune_allocator()  # as the build does: freed batches stay in the heap, not page faults on every call
    ids = list(range(1_000, 1_000 + args.images))
    shape = (3, args.size, args.size)
    print(f"{args.images} images of {shape} per call, best of {args.rounds} rounds; load (1, 5, 15 min) {load()}; "
          f"{os.cpu_count()} cores, torch {torch.__version__}")
    print("threads | gen 2 wall ms | gen 3 wall ms | ratio 2/3 | gen 2 CPU ms | gen 3 CPU ms | CPU ratio | "
          "gen 1 wall / CPU ms")
    for threads in (int(t) for t in args.threads.split(",")):
        best = timed(threads, ids, shape, args.rounds)
        (w2, c2), (w3, c3), (w1, c1) = best[2], best[3], best[1]
        print(f"{threads} | {w2:.3f} | {w3:.3f} | {w2 / w3:.1f}x | {c2:.3f} | {c3:.3f} | {c2 / c3:.1f}x | "
              f"{w1:.3f} / {c1:.3f}")
        if threads == 2 and args.size == 224:
            print(f"  target: generator 3 <= {TARGET_MS} ms per 224 px image and view on 2 threads: "
                  f"{w3:.3f} ms ({'met' if w3 <= TARGET_MS else 'not met'} at load {load()})")
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
