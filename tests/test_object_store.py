"""Stores on object storage, against a real S3 server (moto, started by conftest's `s3` fixture): a build killed
with SIGKILL and resumed on s3:// equals a local-disk build bit for bit, `verify` finds a deleted and a garbled
chunk object, two builds racing on one model leave one refused, two torchrun ranks build one S3 store, and a
probe streams from S3 within a memory budget smaller than the features."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import obstore
import pytest
import zarr
from obstore.store import S3Store
from synthetic import class_clusters, write_feature_store
from test_probe import DIMS, assert_matches_sklearn, assert_predictions_recompute

from conftest import Running, fails, kill_after_next_chunk, run_cli

BUILD = ["--model", "resnet18", "--weights", "none", "--image-size", "32", "--chunk-rows", "8", "--batch-size", "4",
         "--workers", "0", "--no-progress",
         "--threads", "1"]  # other thread counts differ in the last bits (docs/build.md#reliability)
CLI = [sys.executable, "-m", "featstore.cli.main"]
N_CHUNKS = 12  # 96 images in chunks of 8


def objects(url: str) -> S3Store:
    """The test's own view of an s3:// prefix (obstore, configured from the same environment)."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return S3Store(bucket, prefix=prefix, endpoint=os.environ["AWS_ENDPOINT_URL"], client_options={"allow_http": True})


def arrays(store) -> dict[str, np.ndarray]:
    """Every array of a store, read with plain zarr (a folder, or an S3 prefix through zarr's ObjectStore)."""
    root = zarr.open_group(store if isinstance(store, Path) else zarr.storage.ObjectStore(objects(store)), mode="r")
    return {name: node[:] for name, node in root.members(max_depth=None) if isinstance(node, zarr.Array)}


def assert_identical(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].tobytes() == want[name].tobytes(), f"{name} differs"


def done_chunks(url: str) -> int:
    return sum(len(batch) for batch in obstore.list(objects(url), "resnet18/clean/done/c/"))


def build_process(data: Path, store: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([*CLI, "build", "--data", str(data), "--store", store, *BUILD, *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def local_build(big_image_dir, tmp_path_factory) -> dict[str, np.ndarray]:
    """The same build on local disk: what every S3 store here must equal bit for bit."""
    store = tmp_path_factory.mktemp("local") / "s.zarr"
    run_cli("build", "--data", big_image_dir, "--store", store, *BUILD)
    return arrays(store)


def test_a_killed_build_on_s3_resumes_bit_identical_to_a_local_one(big_image_dir, s3_url, local_build, forked_cli):
    """Two killed runs, one per moment class: the first right after it commits a chunk, the second, a resumed run, a
    random moment after its next commit (mid-chunk, some of its objects PUT); then a resume to the end. The killed
    builds are real processes, forked from one that has imported featstore (conftest's ForkedCLI)."""
    kills, rng = 0, random.Random(0)
    for attempt in range(2):
        killed: list[bool] = []

        def kill(pid: int, then: float = rng.uniform(0.0, 0.5) if attempt > 0 else 0.0,
                 killed: list[bool] = killed) -> None:
            # the first kill as soon as this run commits a chunk, later ones a random moment after
            killed.append(kill_after_next_chunk(Running(pid), lambda: done_chunks(s3_url), then=then))

        status, _ = forked_cli.run(["build", "--data", big_image_dir, "--store", s3_url, *BUILD],
                                   env={"OMP_NUM_THREADS": "1"}, started=kill)
        kills += killed[0]
        if status == 0:
            break
    assert kills >= 1, "the build finished before it could be killed; the test proved nothing"
    # the killed holder's lease is taken over at once (same machine, its process is gone), and the build resumes
    out = run_cli("build", "--data", big_image_dir, "--store", s3_url, *BUILD).output
    assert "already done" in out
    assert done_chunks(s3_url) == N_CHUNKS
    assert_identical(arrays(s3_url), local_build)
    assert "every done chunk is intact" in run_cli("verify", s3_url).output


def test_verify_finds_deleted_and_garbled_chunk_objects_and_build_redoes_them(big_image_dir, s3_url, local_build):
    run_cli("build", "--data", big_image_dir, "--store", s3_url, *BUILD)
    store = objects(s3_url)
    obstore.delete(store, "resnet18/clean/anchors/layer2.0/c/3/0")
    obstore.put(store, "resnet18/clean/logits/c/5/0", b"not a zstd frame")
    quick = run_cli("verify", s3_url, "--quick", ok=False)
    assert quick.exit_code == 1
    assert "resnet18/clean/anchors/layer2.0 chunk 3: file missing" in quick.output
    assert "logits chunk 5" not in quick.output  # --quick only lists what is missing
    deep = run_cli("verify", s3_url, ok=False)
    assert deep.exit_code == 1
    assert "resnet18/clean/anchors/layer2.0 chunk 3: file missing" in deep.output
    assert "resnet18/clean/logits chunk 5: cannot be decoded" in deep.output
    assert "DAMAGED" in run_cli("info", s3_url).output
    out = run_cli("build", "--data", big_image_dir, "--store", s3_url, *BUILD).output
    assert "2 chunk(s) written, 10 already done" in out
    assert_identical(arrays(s3_url), local_build)


def test_checksums_and_repairs_hold_on_s3(big_image_dir, s3_url, local_build, tmp_path):
    """A chunk object rewritten with other values (it decodes), a removed image-table object, a garbage array
    metadata object: verify names each, probe refuses, and build repairs them to the local build, bit for bit."""
    run_cli("build", "--data", big_image_dir, "--store", s3_url, *BUILD)
    store = objects(s3_url)
    root = zarr.open_group(zarr.storage.ObjectStore(store), mode="a")
    root["resnet18"]["clean"]["anchors"]["layer3.0"][17, 0] += 1  # decodes fine: only its checksum tells
    out = run_cli("verify", s3_url, ok=False).output
    assert "resnet18/clean/anchors/layer3.0 chunk 2: values differ from those its commit wrote (checksum)" in out
    assert "1 chunk(s) written" in run_cli("build", "--data", big_image_dir, "--store", s3_url, *BUILD).output
    assert_identical(arrays(s3_url), local_build)
    obstore.delete(store, "images/label/c/0")
    obstore.put(store, "resnet18/clean/anchors/avgpool/zarr.json", b"{ not json")
    out = run_cli("verify", s3_url, ok=False).output
    assert "images/label: values differ from those written (checksum)" in out
    assert "resnet18/clean/anchors/avgpool: its metadata cannot be read" in out
    db = tmp_path / "f.duckdb"
    assert "is damaged" in fails("probe", "--store", s3_url, "--model", "resnet18", "--db", db, "--no-progress")
    result = run_cli("build", "--data", big_image_dir, "--store", s3_url, *BUILD).output
    assert "repaired 2 damaged part(s)" in result and f"{N_CHUNKS} chunk(s) written" in result
    assert_identical(arrays(s3_url), local_build)


def test_two_builds_racing_on_one_model_leave_one_refused(big_image_dir, s3_url, local_build):
    procs = [build_process(big_image_dir, s3_url) for _ in range(2)]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes[0] == 0 and codes[1] in (0, 2), results
    refused = [err for code, _, err in results if code == 2]
    for err in refused:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and "is being written by pid" in lines[0], err
        assert f"model 'resnet18' of store {s3_url}" in lines[0]
    if not refused:  # the second one came after the first had finished: it found everything done
        assert any("12 already done" in out for _, out, _ in results), results
    assert_identical(arrays(s3_url), local_build)


def test_two_torchrun_ranks_build_one_s3_store(big_image_dir, s3_url, local_build):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "featstore.cli.main", "build", "--data", str(big_image_dir), "--store", s3_url, *BUILD],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert_identical(arrays(s3_url), local_build)


def test_unsupported_urls_are_refused_and_nothing_is_written(big_image_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for url in ("ftp://host/s.zarr", "s3:/bucket/s.zarr"):
        line = fails("build", "--data", big_image_dir, "--store", url, *BUILD)
        assert f"--store {url}" in line
        assert fails("info", url).startswith("featstore: error: --store")
    assert list(tmp_path.iterdir()) == []  # no folder named 'ftp:' or 's3:'


@pytest.fixture(scope="module")
def s3_clusters(s3):
    feats, labels = class_clusters(2400, 8, DIMS, seed=3)
    return write_feature_store("s3://featstore-test/clusters.zarr", feats, labels, 8, chunk_rows=256)


def test_probe_streams_from_s3_and_saves_its_weights_there(s3_clusters, tmp_path):
    db = tmp_path / "f.duckdb"
    out = run_cli("probe", "--store", s3_clusters, "--model", "synthetic", "--db", db, "--memory-budget",
                  "64KB").output  # the features take 2.2 MB as float32
    assert "streaming" in out  # the progress bar says so
    run = "synthetic/clean/linear/streamed"  # streamed chunks: other batches than in memory, so its own name
    assert_matches_sklearn(s3_clusters, "synthetic", db, run)
    assert_predictions_recompute(s3_clusters, "synthetic", "clean", db, run, "linear-streamed@clean")
    assert "probes linear-streamed@clean" in run_cli("info", s3_clusters).output


PEAK = r"""
import resource, sys
from pathlib import Path
from featstore.compute.specs import RunOptions
from featstore.workflows.probe import ProbeConfig, probe
def rss() -> int:
    return int(next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS")).split()[1])
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
before = rss()
probe(ProbeConfig(store=sys.argv[1], model="synthetic", db=sys.argv[2], memory_budget="8MB",
                  variant="linear:max_epochs=1", run=RunOptions(device="cpu", threads=1, progress=False)))
peak = int(next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM")).split()[1])
print((peak - before) * 1024)
"""


def test_probe_from_s3_holds_a_memory_budget_smaller_than_the_features(s3, tmp_path):
    """Streamed within an 8 MB budget, a probe's peak memory must not grow with the features: five times the rows
    (42 MB more float32 features than the small store's 8 MB) may add only what grows per row besides them
    (predictions, the validation rows): measured at 0.37 x the features' growth, refused from 0.6 x."""
    grown = {}
    procs = {}
    for rows in (2048, 12288):
        feats, labels = class_clusters(rows, 4, [1024], seed=5)
        url = write_feature_store(f"s3://featstore-test/wide{rows}.zarr", feats, labels, 4, chunk_rows=512)
        procs[rows] = subprocess.Popen([sys.executable, "-c", PEAK, url, str(tmp_path / f"{rows}.duckdb")],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    for rows, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        grown[rows] = int(out.split()[-1])
    more_features = (12288 - 2048) * 1024 * 4
    print(f"peak memory growth {grown[2048] / 1e6:.1f} MB (2,048 rows), {grown[12288] / 1e6:.1f} MB (12,288 rows); "
          f"features {more_features / 1e6:.0f} MB more")
    assert grown[12288] - grown[2048] < 0.6 * more_features  # holding them would add at least 1.0 x


def test_a_study_keeps_its_store_on_s3_and_resumes_from_it(tmp_path, s3_url):
    from synthetic import make_image_folder
    from test_study import TINY

    make_image_folder(tmp_path / "images", n_classes=3, per_class=10, size=(40, 32), seed=2)
    study = tmp_path / "tiny.toml"
    study.write_text(TINY.format(figures=Path(__file__).resolve().parents[1] / "docs" / "paper_figures.toml")
                     .replace("seeds = [0, 1]", "seeds = [0]").replace('"clean", "gaussian_noise-2"', '"clean"'))
    out = tmp_path / "out"
    first = run_cli("study", study, "--out", out, "--store", s3_url, "--no-progress").output
    assert "3 step(s) run, 0 already done" in first and f"store: {s3_url}" in first
    assert not (out / "store.zarr").exists()
    assert done_chunks(s3_url) == 1  # 30 images, chunks of 32
    assert "0 step(s) run, 3 already done" in run_cli("study", study, "--out", out, "--store", s3_url,
                                                      "--no-progress").output


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_foreign_folder_in_a_model_group_is_ignored_and_named(where, s3_url, tmp_path):
    """A stray folder in a model group (someone's notes/) made `info` a KeyError, `probe --view all` say
    "no view 'notes'", and verify count it as nothing. Now info names it, verify and probe leave it alone."""
    feats, labels = class_clusters(60, 3, [4, 6], seed=5)
    url = s3_url if where == "s3" else str(tmp_path / "s.zarr")
    write_feature_store(url, feats, labels, 3, chunk_rows=32, views={"noisy": [f + 1 for f in feats]})
    if where == "s3":
        obstore.put(objects(url), "synthetic/notes/a.txt", b"mine")
    else:
        (tmp_path / "s.zarr" / "synthetic" / "notes").mkdir()
        (tmp_path / "s.zarr" / "synthetic" / "notes" / "a.txt").write_text("mine")
    assert "not featstore's (ignored): notes" in run_cli("info", url).output
    assert "every done chunk is intact" in run_cli("verify", url).output
    db = tmp_path / "f.duckdb"
    run_cli("probe", "--store", url, "--model", "synthetic", "--view", "all", "--db", db, "--variant",
            "linear:tol=0.02", "--threads", "1", "--no-progress")
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    assert sorted(v for (v,) in con.execute("SELECT view FROM runs").fetchall()) == ["clean", "noisy"]
    con.close()


def test_a_server_that_goes_away_mid_build_is_one_line(big_image_dir, forked_cli):
    """The S3 server killed mid-build gave 174 lines of traceback. It is one line and exit status 2, and
    what was committed before stays marked done. The build is a real process, forked from one that has imported
    featstore (conftest's ForkedCLI)."""
    from s3server import s3_server

    with contextlib.ExitStack() as running:
        server = running.enter_context(s3_server())
        server.create_bucket("gone")
        url = "s3://gone/s.zarr"
        store = S3Store("gone", prefix="s.zarr", endpoint=server.endpoint, client_options={"allow_http": True},
                        **{k.removeprefix("AWS_").lower(): v for k, v in server.env.items()
                           if k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")})

        def stop_the_server_after_a_chunk(pid: int) -> None:
            deadline = time.monotonic() + 300  # a hang guard only
            while sum(len(b) for b in obstore.list(store, "resnet18/clean/done/c/")) < 1:
                assert Running(pid).poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            running.close()  # the server is gone (killed) while the build has chunks to go

        status, _, err = forked_cli.run_apart(["build", "--data", big_image_dir, "--store", url, *BUILD],
                                              env={**server.env, "OMP_NUM_THREADS": "1"},
                                              started=stop_the_server_after_a_chunk)
    assert os.waitstatus_to_exitcode(status) == 2, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("featstore: error: the object store stopped answering"), lines


def test_a_store_made_by_another_build_meanwhile_is_not_other_objects(s3_url, monkeypatch):
    """Three builds of different models started together into a new prefix: 1 in 8 was refused as
    "holds other objects" when another build wrote the root between the check for a store and the listing."""
    from featstore.store.location import StoreLocation

    feats, labels = class_clusters(20, 2, [4], seed=1)
    write_feature_store(s3_url, feats, labels, 2, chunk_rows=16)
    answers = iter([False])  # no store yet when it looks; the other build's root is there when it lists
    monkeypatch.setattr(StoreLocation, "has_store", lambda self: next(answers, True))
    StoreLocation.parse(s3_url).check_usable()
