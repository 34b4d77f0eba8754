"""The CPU thread policy (featstore/threads.py): idle cores seen -> threads chosen, re-decided as the load changes
(the load reading and the clock injected, never the machine's own), pinned counts, restoring, what is recorded;
and commands given --threads 1 compute with one thread (recorded, and torch's count inside the work)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from featstore import threads as fst
from featstore.threads import ThreadPolicy, choose


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Load:
    """Other processes' runnable threads, as the test sets them; counts how often it was read."""

    def __init__(self, others: float):
        self.others, self.reads = others, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.others


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(fst, "cores", lambda: 4)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("others", "cores", "threads"), [
    (0, 4, 4), (1, 4, 3), (1.4, 4, 3), (1.6, 4, 2), (3, 4, 1), (7, 4, 1), (0, 1, 1), (1, 2, 1), (0.3, 2, 2)])
def test_one_thread_per_idle_core_at_least_one(others, cores, threads):
    assert choose(others, cores) == threads


def test_the_count_follows_the_load_at_each_unit_once_due(four_cores):
    load, clock = Load(0), Clock()
    with ThreadPolicy(read=load, clock=clock, every=1.0) as policy:
        assert policy.current == 4 and torch.get_num_threads() == 4
        load.others = 3  # the machine got busy
        clock.now = 0.5
        assert policy.update() == 4 and load.reads == 1  # not due yet: the load is not even read
        clock.now = 1.0
        assert policy.update() == 1 and torch.get_num_threads() == 1
        load.others = 1
        clock.now = 2.5
        assert policy.update() == 3 and torch.get_num_threads() == 3  # cores freed up: taken back
    assert policy.used == [4, 1, 3] and policy.recorded == [4, 1, 3]


def test_a_pinned_count_never_reads_the_load_and_is_restored(four_cores):
    torch.set_num_threads(2)
    load, clock = Load(0), Clock()
    with ThreadPolicy(1, read=load, clock=clock) as policy:
        for t in range(5):
            clock.now = float(t)
            assert policy.update() == 1 and torch.get_num_threads() == 1
    assert load.reads == 0 and policy.recorded == 1
    assert torch.get_num_threads() == 2


def test_off_the_cpu_nothing_changes_and_nothing_is_recorded(four_cores):
    torch.set_num_threads(2)
    with ThreadPolicy(1, "cuda", read=Load(3)) as policy:
        assert policy.update() == 2 and torch.get_num_threads() == 2
    assert policy.recorded is None


def test_the_reading_counts_other_processes_not_this_one():
    """A busy child process is seen (a runnable thread elsewhere); the reading is a count, never negative. The
    machine may be shared, so only what a busy child must add is checked."""
    child = subprocess.Popen([sys.executable, "-c", "import sys\nprint(flush=True)\nwhile True: pass"],
                             stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # it runs
        assert fst.runnable_elsewhere(samples=5) >= 0.9
    finally:
        child.kill()
        child.wait()
    assert fst._own_runnable() >= 1  # the reading thread itself


class Seen:
    """torch's thread count each time the wrapped function runs (inside the work)."""

    def __init__(self, monkeypatch, owner, name: str):
        self.counts: list[int] = []
        real = getattr(owner, name)

        def wrapped(*args, **kwargs):
            self.counts.append(torch.get_num_threads())
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapped)


def one(db, sql: str):
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def _two_threads_before():
    """Start every command test from 2 threads, so that one thread inside the work is the command's doing."""
    torch.set_num_threads(2)


def test_build_and_probe_given_one_thread_compute_with_one(image_dir, tmp_path, monkeypatch):
    from featstore.compute import prefix_costs as cost_module
    from featstore.nets.extraction import Tapper
    from featstore.probing import run as probe_run
    from featstore.probing.lbfgs import SoftmaxObjective
    from featstore.store.reader import FeatureStore

    from conftest import run_cli

    store, db = tmp_path / "s.zarr", tmp_path / "f.duckdb"
    forward, passes = Seen(monkeypatch, Tapper, "forward"), Seen(monkeypatch, SoftmaxObjective, "__call__")
    _two_threads_before()
    run_cli("build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--data", image_dir,
            "--store", store, "--chunk-rows", "6", "--workers", "0", "--no-progress", "--threads", "1")
    assert forward.counts and set(forward.counts) == {1} and torch.get_num_threads() == 2
    assert FeatureStore(store).threads_used("resnet18", "clean") == [1]
    predictions = Seen(monkeypatch, probe_run, "predict")
    run_cli("probe", "--store", store, "--model", "resnet18", "--db", db, "--no-progress", "--threads", "1")
    assert passes.counts and set(passes.counts) == {1}
    assert predictions.counts == [1] and torch.get_num_threads() == 2  # the predictions too, not only the fits
    assert one(db, "SELECT list(DISTINCT info->>'threads') FROM probe_fits") == ["1"]
    timings = Seen(monkeypatch, cost_module, "median_ms")
    run_cli("cost", "--model", "resnet18", "--db", db, "--store", store, "--repeats", "1", "--threads", "1")
    assert timings.counts and set(timings.counts) == {1}
    assert one(db, "SELECT list(DISTINCT device) FROM model_costs")[0].endswith(", 1 threads")


def test_circuits_given_one_thread_compute_with_one(image_dir, tmp_path, monkeypatch):
    from featstore.compute.attribution import ViTGraph

    from conftest import run_cli

    db = tmp_path / "f.duckdb"
    passes = Seen(monkeypatch, ViTGraph, "slot_gradients")
    _two_threads_before()
    run_cli("circuits", "--model", "vit_tiny_patch16_224", "--weights", "none", "--image-size", "32", "--data",
            image_dir, "--db", db, "--ig-steps", "1", "--workers", "0", "--no-progress", "--threads", "1")
    assert passes.counts and set(passes.counts) == {1}
    assert one(db, "SELECT params->>'threads' FROM circuit_runs") == "1"


def test_the_demos_training_given_one_thread_trains_with_one(monkeypatch):
    from featstore.workflows.demo import fit_resnet18

    steps = Seen(monkeypatch, torch.nn.functional, "cross_entropy")
    _two_threads_before()
    x, y = torch.randn(8, 3, 32, 32), torch.arange(8) % 2
    fit_resnet18(x, y, torch.arange(8), 2, epochs=1, progress=False, threads=1)
    assert steps.counts == [1, 1] and torch.get_num_threads() == 2  # one batch: two micro-batches
