"""Every probe check runs before training (and creates nothing); the database is free while probes train;
the analyses refuse k and scope values that would silently select nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import duckdb
import numpy as np
import pytest
from synthetic import class_clusters, run_rows, write_feature_store

from featstore.analytics import db as fsdb
from featstore.records import DatasetInfo

from conftest import fails, run_cli


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """60 images, 3 anchors, 3 classes; and a database holding one run over them (written directly)."""
    feats, labels = class_clusters(60, 3, [4, 8, 8], seed=1)
    root = tmp_path_factory.mktemp("checks")
    store = write_feature_store(root / "s.zarr", feats, labels, 3, chunk_rows=16)
    db = root / "f.duckdb"
    con = fsdb.connect(db)
    info = DatasetInfo("x", "synthetic", str(store), 0)
    ids = np.arange(60)
    fsdb.register_images(con, info, ids, np.array([f"{i}.png" for i in ids]), labels, np.array(["test"] * 60))
    run = {"run_id": "synthetic/clean/linear", "model": "synthetic", "view": "clean", "train_view": "clean",
           "probe": "linear", "params": {}, "cross_fit": 0, "seed": 0, "store": str(store)}
    pred = np.stack([np.roll(labels, 1), labels, labels], axis=1)
    fsdb.write_runs(con, [run_rows(run, ids, pred, np.full(pred.shape, 0.5))])
    con.close()
    return store, db


def test_missing_store_is_not_created(tmp_path):
    line = fails("probe", "--store", tmp_path / "nope.zarr", "--model", "synthetic", "--db", tmp_path / "f.duckdb")
    assert "no featstore store" in line
    assert sorted(tmp_path.iterdir()) == []


def test_cross_fit_with_more_folds_than_images(small, tmp_path):
    store, _ = small
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", tmp_path / "f.duckdb", "--cross-fit", "61")
    assert "--cross-fit 61" in line and "60 usable images" in line
    assert not (tmp_path / "f.duckdb").exists()


def test_a_read_only_store_fails_before_training(small, tmp_path):
    store = shutil.copytree(small[0], tmp_path / "ro.zarr")
    model = store / "synthetic"
    locked = subprocess.run(["chattr", "+i", str(model)], capture_output=True).returncode == 0
    if not locked:  # not root, or no chattr: plain permissions then bind
        model.chmod(0o555)
    try:
        line = fails("probe", "--store", store, "--model", "synthetic", "--db", tmp_path / "f.duckdb")
        assert "is read-only here" in line and str(model) in line
        assert not (tmp_path / "f.duckdb").exists()
    finally:
        if locked:
            subprocess.run(["chattr", "-i", str(model)], check=True)
        model.chmod(0o755)


def test_nan_features_of_rows_not_skipped(small, tmp_path):
    import zarr

    store = shutil.copytree(small[0], tmp_path / "nan.zarr")
    zarr.open_group(str(store), mode="a")["synthetic"]["clean"]["anchors"]["anchor01"][20] = np.nan
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", tmp_path / "f.duckdb")
    assert "synthetic/clean/anchors/anchor01 chunk 1: values differ from those its commit wrote" in line
    assert not (tmp_path / "f.duckdb").exists()
    shutil.rmtree(store / "synthetic" / "clean" / "checksums")  # as a store written before checksums
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", tmp_path / "f.duckdb")
    assert "synthetic/clean/anchors/anchor01 chunk 1: NaN or infinity in 1 row(s) not marked skipped (first: row " \
           "20)" in line
    assert not (tmp_path / "f.duckdb").exists()


@pytest.mark.parametrize("args, message", [(["--k", "3"], "at most 3 anchors"), (["--k", "12"], "must be from 1 to 2"),
                                           (["--scope", "bogus"], "'bogus' is not one of 'auto'")])
def test_timeline_and_report_refuse_what_selects_nothing(small, tmp_path, args, message):
    _, db = small
    assert message in fails("timeline", "--db", db, *args)
    assert message in fails("report", "--db", db, "--out", tmp_path / "rep", *args)
    assert not (tmp_path / "rep").exists()
    out = run_cli("timeline", "--db", db, "--k", "2", "--scope", "all", "--format", "csv").stdout.splitlines()
    with duckdb.connect(str(db), read_only=True) as con:
        labels = con.execute("SELECT label FROM images ORDER BY image_id").fetchnumpy()["label"]
    agree = float(np.mean(np.roll(labels, 1) == labels))  # stable from anchor 0, else never
    row = dict(zip(out[0].split(","), out[1].split(","), strict=True))
    assert len(out) == 2 and (row["k"], row["n"]) == ("2", "60")
    assert np.isclose(float(row["mean"]), 2 * (1 - agree)) and np.isclose(float(row["never_stable"]), 1 - agree)
    out = run_cli("timeline", "--db", db, "--format", "csv").stdout.splitlines()  # default k: 1,2 of 1..4
    assert [row.split(",")[:3] for row in out[1:]] == [["synthetic/clean/linear", "1", "60"],
                                                       ["synthetic/clean/linear", "2", "60"]]


def test_sql_reads_while_a_probe_trains(tmp_path):
    feats, labels = class_clusters(800, 10, [32, 32], seed=2)
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, 10, chunk_rows=200)
    db = tmp_path / "f.duckdb"
    fsdb.connect(db).close()  # a probe creates no database before its commit: here one exists (empty) already
    probe = subprocess.Popen([sys.executable, "-m", "featstore.cli.main", "probe", "--store", str(store), "--model",
                              "synthetic", "--db", str(db), "--no-progress"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reads_while_training, failures = 0, []
    try:
        while probe.poll() is None:
            if db.exists():
                out = run_cli("sql", "--db", db, "SELECT count(*) AS n FROM runs", "--format", "csv", ok=False)
                if probe.poll() is None:
                    if out.exit_code == 0 and out.output.splitlines() == ["n", "0"]:
                        reads_while_training += 1
                    elif out.exit_code != 0:
                        failures.append(out.output)
            time.sleep(0.2)
        _, err = probe.communicate()
    finally:
        probe.kill()
    assert probe.returncode == 0, err
    assert not [f for f in failures if "in use" in f], failures
    assert reads_while_training >= 1
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM predictions").fetchall() == [(800 * 2,)]
    con.close()


FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
from featstore.cli.main import main
sys.argv = ["featstore", *sys.argv[2:]]
main()
"""


def probe_with_file_limit(limit: int, store, db, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", FULL_DISK, str(limit), "probe", "--store", str(store), "--model",
                           "synthetic", "--db", str(db), "--no-progress", *more], capture_output=True, text=True)


@pytest.mark.parametrize("limit, where", [(5_000, "cannot open database"), (60_000, "cannot write database")])
def test_a_probe_that_fails_before_its_commit_leaves_no_database(small, tmp_path, limit, where):
    """Out of space creating the file (a 0-byte .duckdb that later runs rejected) or committing the rows: one line,
    no database left behind, and the next run succeeds."""
    store = shutil.copytree(small[0], tmp_path / "s.zarr")
    db = tmp_path / "f.duckdb"
    failed = probe_with_file_limit(limit, store, db)
    assert failed.returncode == 2, failed.stderr
    lines = failed.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("featstore: error: ") and where in lines[0], failed.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM predictions").fetchone() == (60 * 3,)


def test_a_full_disk_keeps_a_database_that_held_runs(small, tmp_path):
    store = shutil.copytree(small[0], tmp_path / "s.zarr")
    db = tmp_path / "f.duckdb"
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--no-progress")
    failed = probe_with_file_limit(5_000, store, db, "--seed", "1")  # the database is larger: no write fits
    assert failed.returncode == 2 and "cannot write database" in failed.stderr, failed.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT run_id FROM runs").fetchall() == [("synthetic/clean/linear",)]


@pytest.mark.parametrize("extra", [(), ("--cross-fit", "2")])
def test_a_val_fraction_that_leaves_no_val_rows_is_refused(small, tmp_path, extra):
    """`--variant paper --val-frac 0.01` returned its untrained starting weights recorded as
    converged, val accuracy -1. 60 images: 42 train+val, round(0.01 * 42) = 0 val rows (cross-fit: of 30)."""
    store, _ = small
    db = tmp_path / "v.duckdb"
    before = probe_listing(store)
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", "paper", "--val-frac",
                 "0.01", "--no-progress", *extra)
    where = "fold 0 of --cross-fit 2" if extra else "the split"
    train = 30 if extra else 42
    assert f"--val-frac 0.01: {where} holds no val rows ({train} train rows of 60 usable images)" in line
    assert not db.exists()
    assert probe_listing(store) == before  # no weights were saved


def probe_listing(store) -> list[str]:
    from featstore.store.reader import FeatureStore

    fs = FeatureStore(store)
    return fs.listed("synthetic/probes/paper@clean") if "probes" in fs.listed("synthetic") else []
