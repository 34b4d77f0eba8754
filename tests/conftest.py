"""Shared fixtures: generated image folders (real JPEG files) and a helper to run the CLI in-process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download weights

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from s3server import s3_server
from synthetic import make_image_folder
from torchvision import transforms as T

from featstore.cli.main import cli

# The test files that keep a worker longest, longest first (seconds on one of two busy workers, 2026-12-03): run
# before the rest, so that no long file starts last while the other worker has nothing left (pytest-xdist hands
# out whole files in collection order: `--dist loadfile --no-loadscope-reorder` in pyproject.toml; by default it
# orders them by how many tests they hold). Only the order changes; a file missing here runs after these.
LONGEST_FIRST = ("test_object_store.py", "test_resume_first_writes.py", "test_cli_output.py",
                 "test_probe_convergence.py", "test_resume_ranks.py", "test_study.py", "test_probe.py",
                 "test_python_api.py", "test_probe_optimum.py",
                 "test_default_anchors.py", "test_cli_store.py", "test_weights.py", "test_one_experiment.py",
                 "test_translator_lens.py", "test_anchors_reference.py", "test_merge.py", "test_probe_checks.py",
                 "test_device_check.py", "test_leases.py", "test_demo.py", "test_taps.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order kept


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory) -> Path:
    """3 classes x 4 JPEGs of 80x60: small, but decoded, resized and cropped like ImageNet."""
    return make_image_folder(tmp_path_factory.mktemp("images"), n_classes=3, per_class=4, size=(80, 60))


def made_once(tmp_path_factory, name: str, make: Callable[[Path], str]) -> tuple[Path, str]:
    """A session fixture's folder made once for the whole run, however many pytest-xdist workers share it (the
    plugin's documented pattern: the first worker makes it under a file lock, the others wait and read it).
    `make(folder)` fills the folder and returns text kept beside it. Tests read the folder; one that writes copies
    it first."""
    from filelock import FileLock

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = tmp_path_factory.mktemp(name)
        return folder, make(folder)
    folder = tmp_path_factory.getbasetemp().parent / name  # the directory every worker's base temp sits in
    done = folder.with_suffix(".made")
    with FileLock(str(folder.with_suffix(".lock"))):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done.write_text(make(folder))
    return folder, done.read_text()


@pytest.fixture(scope="session")
def digits_store(tmp_path_factory) -> Path:
    """Real images (scikit-learn's digits) through a random-init resnet18: real stored features (one build for
    every module that probes them)."""
    from featstore.workflows.demo import digits_image_folder

    def make(root: Path) -> str:
        data = digits_image_folder(root / "images", size=32)
        return run_cli("build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--data", data,
                       "--store", root / "s.zarr", "--no-progress").output

    root, _ = made_once(tmp_path_factory, "digits", make)
    return root / "s.zarr"


@pytest.fixture(scope="session")
def digits_linear(digits_store, tmp_path_factory) -> tuple[Path, str]:
    """The digits store's default `linear` probe fitted once, at --threads 1: the database and what probe printed.
    Several modules read it; a test that writes to a database copies this one first."""
    folder, text = made_once(tmp_path_factory, "digits_linear", lambda folder: run_cli(
        "probe", "--store", digits_store, "--model", "resnet18", "--db", folder / "f.duckdb", "--no-progress",
        "--threads", "1").output)
    return folder / "f.duckdb", text


def copy_db(db: Path, to: Path) -> Path:
    """A writable copy of a shared database."""
    shutil.copyfile(db, to)
    return to


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> tuple[Path, str]:
    """README command 1, run once per test run (test_demo checks its numbers, test_report_browser its report):
    the output folder and what it printed. Read-only: a test that reruns the demo copies the folder first."""
    return made_once(tmp_path_factory, "demo", lambda out: run_cli("demo", "--out", out, "--no-progress").output)


@pytest.fixture(scope="session")
def big_image_dir(tmp_path_factory) -> Path:
    """Enough images for several chunks (resume and multi-rank tests)."""
    return make_image_folder(tmp_path_factory.mktemp("big"), n_classes=4, per_class=24, size=(48, 40), seed=1)


@pytest.fixture(scope="session")
def s3():
    """A real S3 server (moto, in its own process on a loopback port) for the whole session; featstore, the
    test's own subprocesses included, finds it through the standard AWS_* environment, set here."""
    with s3_server() as server:
        saved = {k: os.environ.get(k) for k in server.env}
        os.environ.update(server.env)
        server.create_bucket("featstore-test")
        try:
            yield server
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture
def s3_url(s3, request) -> str:
    """A fresh prefix of the session's bucket: s3://featstore-test/<test name>-<n>."""
    s3_url.count = getattr(s3_url, "count", 0) + 1
    return f"s3://featstore-test/{request.node.name.replace('[', '-').strip(']')}-{s3_url.count}"


def kill_after_next_chunk(proc: subprocess.Popen | Running, chunks: Callable[[], int], then: float = 0.0) -> bool:
    """SIGKILL a build process `then` seconds after it commits a chunk beyond those `chunks()` counts now, so the
    kill lands mid-build: its start-up (~5 s of imports) is over, where a fixed delay from Popen killed it during
    its imports. False if it ended first (or committed nothing in 90 s: then it is killed all the same)."""
    before = chunks()
    deadline = time.monotonic() + 90
    while proc.poll() is None and time.monotonic() < deadline and chunks() <= before:
        time.sleep(0.01)
    time.sleep(then)
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return True


# One process that imports featstore, torch and the modules named on its command line, then forks a `featstore`
# command per line of JSON it reads ({"argv", "env", "out", "err", "kill_after", "trace"}), answering the child's
# pid, then its wait status. The child writes its stdout to the file "out", its stderr to "err".
# With "trace" (a file) it appends the path of every file zarr writes through its local store (every file zarr
# writes goes through _put); with "kill_after" N it SIGKILLs itself right after the Nth such write.
FORK_SERVER = r"""
import json, os, signal, sys, threading
import torch, torchvision.models, zarr.storage._local as local
import featstore.cli.main
for name in sys.argv[1:]:
    __import__(name)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.environ.update(job["env"])
        sys.argv = job["argv"]
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, name in ((1, "out"), (2, "err")):
            os.dup2(os.open(job[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        put, lock, count = local._put, threading.Lock(), [0]
        def counted(path, *args, **kwargs):
            written = put(path, *args, **kwargs)
            with lock:
                count[0] += 1
                if job["trace"]:
                    with open(job["trace"], "a") as trace:
                        print(path, file=trace)
                if count[0] == job["kill_after"]:
                    os.kill(os.getpid(), signal.SIGKILL)
            return written
        local._put = counted
        code = 0
        try:
            featstore.cli.main.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback; traceback.print_exc(); code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    print(pid, flush=True)
    print(os.waitpid(pid, 0)[1], flush=True)
"""


class ForkedCLI:
    """`featstore` commands as real processes, one at a time, forked from one that has imported featstore, torch and
    `preload` once: a fresh interpreter spends seconds importing them, which tests that kill or interrupt many
    processes would pay for each."""

    def __init__(self, tmp: Path, *preload: str):
        self.tmp, self.n = tmp, 0
        self.zygote = subprocess.Popen([sys.executable, "-c", FORK_SERVER, *preload], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})

    def run(self, args: list, env: dict[str, str] | None = None, kill_after: int = 0, trace: Path | None = None,
            started: Callable[[int], None] | None = None) -> tuple[int, str]:
        """Run `featstore ARGS` to its end (or its kill), calling `started(pid)` once it runs: (wait status, what it
        printed on stdout, then on stderr)."""
        status, out, err = self.run_apart(args, env, kill_after, trace, started)
        return status, out + err

    def run_apart(self, args: list, env: dict[str, str] | None = None, kill_after: int = 0, trace: Path | None = None,
                  started: Callable[[int], None] | None = None) -> tuple[int, str, str]:
        """`run`, with stdout and stderr apart: (wait status, stdout, stderr). The child's environment is this
        process's, as a subprocess's would be, plus `env`."""
        self.n += 1
        out, err = self.tmp / f"run{self.n}.out", self.tmp / f"run{self.n}.err"
        job = {"argv": ["featstore", *map(str, args)], "env": {**os.environ, **(env or {})}, "out": str(out),
               "err": str(err),
               "kill_after": kill_after, "trace": str(trace or "")}
        self.zygote.stdin.write(json.dumps(job) + "\n")
        self.zygote.stdin.flush()
        pid = int(self.zygote.stdout.readline())
        if started is not None:
            started(pid)
        status = int(self.zygote.stdout.readline())
        return status, out.read_text(), err.read_text()

    def close(self) -> None:
        self.zygote.stdin.close()
        self.zygote.wait(timeout=60)


class Running:
    """A ForkedCLI child seen through its pid, as `kill_after_next_chunk` reads a Popen: running until its fork
    server has reaped it (its exit status is what ForkedCLI.run returns)."""

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self) -> int | None:
        """None while it runs, else 0 (ended)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return 0
        return None

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # it ended first
            os.kill(self.pid, sig)

    def wait(self) -> None:
        while self.poll() is None:
            time.sleep(0.01)


@pytest.fixture(scope="session")
def forked_cli(tmp_path_factory) -> Iterator[ForkedCLI]:
    """One fork server per worker, for every test that needs real featstore processes (builds and probes)."""
    forked = ForkedCLI(tmp_path_factory.mktemp("forked"), "featstore.workflows.build", "featstore.workflows.probe")
    yield forked
    forked.close()


def run_cli(*args: str, ok: bool = True):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def fails(*args) -> str:
    """Run the CLI expecting a user error: exit status 2 and exactly one line, which is returned."""
    result = run_cli(*args, ok=False)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("featstore: error: "), result.output
    return lines[0]


def db_rows(db, sql: str, params=()) -> list[tuple]:
    """The rows of one query, read through a read-only DuckDB connection of its own (independent of featstore's)."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def digest(db) -> dict[str, list]:
    """Every row of every table, timestamps included: what 'changes nothing' compares."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        names = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
        return {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall())) for t in names}
    finally:
        con.close()


def fail_after_inserting(monkeypatch, table: str, message: str) -> None:
    """Make featstore's DuckDB writer raise OSError(message) right after it has inserted rows into `table`:
    a crash in the middle of a run's transaction."""
    from featstore.analytics import db as fsdb

    real_insert = fsdb._insert

    def dying_insert(con, into, data):
        real_insert(con, into, data)
        if into == table:
            raise OSError(message)

    monkeypatch.setattr(fsdb, "_insert", dying_insert)


def reference_batch(paths: list[Path], prep: dict) -> torch.Tensor:
    """The eval transform written with torchvision's own transform classes, independent of featstore's."""
    tf = T.Compose([
        T.Resize(prep["resize"], interpolation=T.InterpolationMode(prep["interpolation"]), antialias=True),
        T.CenterCrop(prep["crop"]),
        T.PILToTensor(),
        T.ConvertImageDtype(torch.float),
        T.Normalize(prep["mean"], prep["std"]),
    ])
    return torch.stack([tf(Image.open(p).convert("RGB")) for p in paths])


def assert_fp16_close(stored: np.ndarray, reference: np.ndarray, what: str) -> None:
    """Stored float16 must equal the float32 reference to float16 precision.

    The scale is the element itself plus its row's RMS: a pooled mean or a logit near zero is a sum of large
    terms, and float32 summation order (memory layout, batch size) moves it by ~1e-7 of those terms, which a
    random-init deep network amplifies. A wrong tap, view or image order is off by far more than that.
    """
    ref = np.asarray(reference, dtype=np.float32)
    assert stored.shape == ref.shape, f"{what}: shape {stored.shape} vs {ref.shape}"
    row_rms = np.sqrt(np.mean(ref.astype(np.float64) ** 2, axis=-1, keepdims=True))
    err = np.abs(stored.astype(np.float32) - ref)
    ratio = err / ((np.abs(ref) + row_rms) * 2.0**-10 + 1e-6)
    print(f"{what}: worst error / fp16 tolerance = {ratio.max():.3f}")
    assert (ratio <= 1).all(), f"{what}: error {err.max():.3g}, {ratio.max():.2f}x beyond fp16 precision"
