"""Resume after SIGKILL is bit-identical to an uninterrupted build; two torchrun ranks equal one process."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from conftest import Running, kill_after_next_chunk, run_cli

BUILD = ["--model", "resnet18", "--weights", "none", "--image-size", "32", "--chunk-rows", "8",
         "--batch-size", "4", "--workers", "0", "--views", "clean,gaussian_noise-1", "--no-progress",
         "--threads", "1"]  # other thread counts differ in the last bits (docs/build.md#reliability)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
def done_chunks(store: Path) -> int:
    """The chunks marked done: the done array's chunk files, named by their index. A SIGKILL during zarr's write of
    one leaves its temporary file ("3.<uuid>.partial") beside them, which is not a mark and must not be counted."""
    return sum(p.name.isdigit() for p in (store / "resnet18" / "clean" / "done" / "c").glob("*"))


def arrays(store: Path) -> dict[str, np.ndarray]:
    root = zarr.open_group(str(store), mode="r")
    return {name: node[:] for name, node in root.members(max_depth=None) if isinstance(node, zarr.Array)}


def assert_identical(a: Path, b: Path) -> None:
    x, y = arrays(a), arrays(b)
    assert sorted(x) == sorted(y)
    for name in x:
        assert x[name].dtype == y[name].dtype, name
        assert x[name].tobytes() == y[name].tobytes(), f"{name} differs"


@pytest.fixture(scope="module")
def reference(big_image_dir, tmp_path_factory) -> Path:
    """An uninterrupted build in this process (--threads 1: the same bits as a process of its own), which both
    tests' stores must equal."""
    store = tmp_path_factory.mktemp("reference") / "ref.zarr"
    run_cli("build", "--data", big_image_dir, "--store", store, *BUILD)
    return store


def test_sigkill_then_resume_is_bit_identical(big_image_dir, tmp_path, reference, forked_cli):
    """Two killed runs, one per moment class: the first right after it commits a chunk (its next chunk not begun),
    the second, a resumed run, a random moment after its next commit (mid-chunk, its arrays partly written); then a
    resume to the end. The kills are of real processes (SIGKILL; forked from one that has imported featstore:
    conftest's ForkedCLI); the uninterrupted and the final build, which are about the store and not the process, run
    in this one."""
    n_chunks = 12
    assert done_chunks(reference) == n_chunks

    store = tmp_path / "killed.zarr"
    kills = 0
    rng = random.Random(0)
    for attempt in range(2):
        killed: list[bool] = []

        def kill(pid: int, then: float = rng.uniform(0.0, 0.5) if attempt > 0 else 0.0,
                 killed: list[bool] = killed) -> None:
            # the first kill as soon as this run commits a chunk, later ones a random moment after
            killed.append(kill_after_next_chunk(Running(pid), lambda: done_chunks(store) if store.exists() else 0,
                                                then=then))

        status, _ = forked_cli.run(["build", "--data", big_image_dir, "--store", store, *BUILD], env=ENV, started=kill)
        if killed[0]:
            kills += 1
            assert done_chunks(store) < n_chunks or attempt > 0
        if status == 0:
            break
    if done_chunks(store) < n_chunks:
        run_cli("build", "--data", big_image_dir, "--store", store, *BUILD)
    assert kills >= 1, "the build finished before it could be killed; the test proved nothing"
    assert done_chunks(store) == n_chunks
    assert_identical(store, reference)


def test_two_ranks_equal_one(big_image_dir, tmp_path, reference):
    double = tmp_path / "two.zarr"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "-m", "featstore.cli.main", "build", "--data", str(big_image_dir), "--store", str(double)] + BUILD
    done = subprocess.run(torchrun, env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_identical(reference, double)
