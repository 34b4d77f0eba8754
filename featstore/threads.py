"""How many CPU threads featstore's compute uses: one per core that nobody else is running on, re-decided as the
work goes on.

torch splits every kernel over its intra-op threads and waits for the slowest at the end of it. When another
process holds a core, a thread of ours is descheduled there and every kernel waits for it: a command that takes
all cores beside one busy process runs several times slower, not 2x (measured: `bench/contention.py`). So each
compute (the build's forward, the demo's training, `cost`, `circuits`, the probes) runs under a `ThreadPolicy`:
at every natural unit of work (a store chunk, an epoch, a pass of L-BFGS, a batch of circuit images) it may look
again at the machine and take one thread per idle core, at least one, so a command that started on a busy machine
takes the cores back when they free up. `--threads N` pins the count instead. What was used is recorded with the
results (store chunks, `probe_fits`, `circuit_runs`), since float sums split over another number of threads can
differ in the last bits.

Idle cores are read from the kernel's instantaneous count of runnable threads (`/proc/loadavg`, unlike the load
averages), less this process's own runnable threads (`/proc/self/task/*/stat`), a few samples averaged.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from featstore.errors import FeatstoreWarning, Name

Reading = Callable[[], float]  # other processes' runnable threads, now


class TooManyThreads(FeatstoreWarning):
    """More CPU threads asked for than the process may run on: each kernel then waits for descheduled threads."""


def check_pinned(threads: int | None) -> None:
    """`--threads N` beyond the cores this process may run on: one warning line; the work runs on `pinned_count`
    threads, the cores (100,000 threads crashed OpenMP, a million exhausted the machine's processes)."""
    if threads is not None and threads > cores():
        warnings.warn(TooManyThreads(
            f"this process may run on {cores()} core(s), so it runs {cores()} threads (more threads than cores make "
            f"every kernel wait for descheduled threads); give at most {cores()} or leave ", Name("threads"), " out",
            field="threads", value=threads), stacklevel=3)


def pinned_count(threads: int) -> int:
    """The threads a pinned `--threads` runs: at most the cores this process may run on."""
    return min(threads, cores())


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _own_runnable() -> int:
    """This process's threads that are running or runnable now (the reader itself included)."""
    count = 0
    for stat in Path("/proc/self/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the thread ended meanwhile
            continue
        count += text[text.rfind(")") + 2 :].startswith("R")
    return max(count, 1)


def runnable_elsewhere(samples: int = 3, interval: float = 0.005) -> float:
    """Mean number of runnable threads of other processes (0 where /proc is missing)."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, IndexError, ValueError):
            return 0.0
        counts.append(max(0, running - _own_runnable()))
        if i + 1 < samples:
            time.sleep(interval)
    return sum(counts) / len(counts)


def choose(others: float, available: int) -> int:
    """Threads for `available` cores when `others` runnable threads of other processes compete: one per core
    they leave idle, at least one."""
    return max(1, min(available, round(available - others)))


def idle_cores(read: Reading = runnable_elsewhere) -> int:
    return choose(read(), cores())


class ThreadPolicy:
    """The intra-op thread count of one command's CPU compute, from its start to its end.

    Use it as a context manager around the work and call `update()` at each unit of work: a pinned count
    (`threads`) is set once; otherwise the count follows the idle cores, looked at again at most every `every`
    seconds. Off the CPU (`device` cuda) it changes nothing. `used` lists every count the work ran with, in the
    order first used; `recorded` is what results keep (None off the CPU). `read` and `clock` are injectable for
    tests (the machine's real load otherwise)."""

    def __init__(self, threads: int | None = None, device: torch.device | str = "cpu", every: float = 1.0,
                 read: Reading = runnable_elsewhere, clock: Callable[[], float] = time.monotonic,
                 sets_torch: bool = True):
        self.pinned = threads
        self.sets_torch = sets_torch  # False: only decide; the work spreads itself over `current` threads
        self.on_cpu = torch.device(device).type == "cpu"
        self.every, self.read, self.clock = every, read, clock
        self.current = torch.get_num_threads()
        self.used: list[int] = []
        self._before: int | None = None
        self._last = -float("inf")

    def __enter__(self) -> ThreadPolicy:
        self._before = torch.get_num_threads()
        self.update(force=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._before is not None:
            torch.set_num_threads(self._before)

    def update(self, force: bool = False) -> int:
        """At a unit boundary: the thread count for the next unit (set in torch), re-decided when due."""
        if not self.on_cpu:
            return self.current
        now = self.clock()
        if force or (self.pinned is None and now - self._last >= self.every):
            self._last = now
            n = pinned_count(self.pinned) if self.pinned else choose(self.read(), cores())
            if self.sets_torch and n != torch.get_num_threads():
                torch.set_num_threads(n)
            self.current = n
        if self.current not in self.used:
            self.used.append(self.current)
        return self.current

    @property
    def recorded(self) -> int | list[int] | None:
        """The count the work used, or every count in the order first used when the policy changed it."""
        if not self.on_cpu:
            return None
        return self.used[0] if len(self.used) == 1 else list(self.used)
