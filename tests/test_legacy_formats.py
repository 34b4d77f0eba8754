"""Stores and databases written by older featstore versions keep working: read, verified, resumed, probed again
and queried (tests/data/README.md says what wrote them)."""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from pathlib import Path

import duckdb
import pytest

from featstore.analytics import db as fsdb
from featstore.analytics.queries import query
from featstore.store.reader import FeatureStore

from conftest import run_cli

DATA = Path(__file__).parent / "data"


@pytest.fixture
def legacy(tmp_path) -> Path:
    with tarfile.open(DATA / "legacy-format1.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    return tmp_path


def test_a_format1_store_reads_verifies_and_resumes(legacy):
    store = legacy / "format1" / "store.zarr"
    info = run_cli("info", store).output
    assert "view clean: 3/3 chunks, 0 skipped, complete" in info and "probes linear:max_epochs=3@clean" in info
    assert "every done chunk is intact" in run_cli("verify", store).output
    fs = FeatureStore(store)
    assert [a.name for a in fs.anchors("resnet18")][-1] == "avgpool"
    before = fs.read("resnet18", "clean", "layer2.0")
    out = run_cli("build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--data",
                  legacy / "images", "--store", store, "--views", "clean,gaussian_noise-1", "--chunk-rows", "5",
                  "--workers", "0", "--no-progress").output
    assert "0 chunk(s) written, 3 already done" in out
    assert (FeatureStore(store).read("resnet18", "clean", "layer2.0") == before).all()


def test_a_format1_database_queries_and_takes_new_runs(legacy):
    db, store = legacy / "format1" / "featstore.duckdb", legacy / "format1" / "store.zarr"
    runs = query(db, "SELECT run_id FROM runs ORDER BY run_id")["run_id"].to_list()
    assert runs == ["resnet18/clean/linear:max_epochs=3", "resnet18/gaussian_noise-1/linear:max_epochs=3/train=clean"]
    sweep = run_cli("timeline", "--db", db, "--format", "csv").stdout.splitlines()
    assert sweep[0].startswith("run_id,k,") and len(sweep) == 1 + 2 * 4
    assert "Pareto front" in run_cli("exit-sim", "--db", db, "--run", runs[0]).output
    css = run_cli("css", "--db", db, "--id", "test_vit/clean/eap-ig1", "--ood", "test_vit/gaussian_noise-2/eap-ig1",
                  "--format", "csv").output.splitlines()
    assert css[0] == "id_run,ood_run,distance,css,n_edges" and len(css) == 2
    run_cli("probe", "--store", store, "--model", "resnet18", "--db", db, "--variant", "linear:max_epochs=2",
            "--no-progress")
    assert query(db, "SELECT count(*) AS n FROM runs")["n"][0] == 3
    shutil.rmtree(legacy / "report", ignore_errors=True)
    assert "wrote" in run_cli("report", "--db", db, "--out", legacy / "report").output


def test_a_database_from_before_the_identity_columns_reads_them_from_params(legacy):
    """A format1 file keeps the probes' identity only inside runs.params: read-only, the columns come from a
    migrated TEMP copy (the file's bytes unchanged); a write connection adds them to the file."""
    db = legacy / "format1" / "featstore.duckdb"
    expected = [(run_id, "linear:max_epochs=3", "linear:max_epochs=3@clean", "v20261201T122948-c7f10cc6")
                for run_id in ("resnet18/clean/linear:max_epochs=3",
                               "resnet18/gaussian_noise-1/linear:max_epochs=3/train=clean")]
    raw = duckdb.connect(str(db), read_only=True)
    assert "probe_id" not in {c for (c, *_) in raw.execute("DESCRIBE runs").fetchall()}
    raw.close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    sql = "SELECT run_id, probe_id, probe_name, probe_version FROM runs ORDER BY run_id"
    assert query(db, sql).rows() == expected
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    fsdb.connect(db).close()
    raw = duckdb.connect(str(db), read_only=True)
    assert raw.execute(sql).fetchall() == expected
    raw.close()
