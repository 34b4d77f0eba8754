"""How many CPU threads a probe fit uses: all cores when they are free, fewer when other processes keep them busy.

torch splits every kernel over its intra-op threads and waits for the slowest; when another process holds a
core, each kernel waits for a descheduled thread and a fit slows down several-fold (the measurements behind
this policy are in `bench/probes.py --contention`). So the fit takes one thread per core that is idle right
now: cores minus the other runnable threads, read a few times from /proc/loadavg (an instantaneous count,
unlike the load averages), at least one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def runnable_elsewhere(samples: int = 5, interval: float = 0.02) -> float:
    """Mean number of runnable threads besides this one (0 where /proc/loadavg is missing)."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, IndexError, ValueError):
            return 0.0
        if i + 1 < samples:
            time.sleep(interval)
    return sum(counts) / len(counts)


def idle_cores() -> int:
    """Threads for a CPU fit: the cores nobody else is running on now, at least one."""
    return max(1, min(cores(), round(cores() - runnable_elsewhere())))


@contextmanager
def fit_threads(threads: int | None, device: torch.device) -> Iterator[int]:
    """Run the block with `threads` intra-op threads (None: `idle_cores()`; ignored off the CPU), then restore."""
    before = torch.get_num_threads()
    n = before if device.type != "cpu" else threads or idle_cores()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
