"""Probe weights left behind: a probe SIGKILLed between saving its weights and committing its runs left a
version in the store forever, and `verify --db` never saw it. Now `verify` lists it and `featstore gc` removes it,
never a version a database in reach names, its probe's current one, one whose database cannot be read, or one
written less than --min-age seconds ago."""

from __future__ import annotations

import os
import subprocess
import sys

import duckdb
import pytest
from synthetic import class_clusters, write_feature_store

from featstore.store.reader import FeatureStore

from conftest import run_cli

# Runs `featstore probe` and SIGKILLs it right after the weights are saved, before the database commit.
KILLED_AFTER_SAVE = """
import os, signal, sys
import featstore.workflows.probe as probe
saved = probe.save_probes
def save_then_die(*args, **kwargs):
    saved(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
probe.save_probes = save_then_die
from featstore.cli.main import main
sys.argv = ["featstore", *sys.argv[1:]]
main()
"""


@pytest.fixture(params=["local", "s3"])
def probed(tmp_path, request):
    """A store (on disk, or on the test S3 server) with one committed linear probe and a second probe killed after
    saving its weights."""
    feats, labels = class_clusters(90, 3, [4, 8], seed=2)
    where = tmp_path / "s.zarr" if request.param == "local" else request.getfixturevalue("s3_url")
    store = write_feature_store(where, feats, labels, 3, chunk_rows=32)
    db = tmp_path / "f.duckdb"
    args = ["probe", "--store", str(store), "--model", "synthetic", "--db", str(db), "--no-progress"]
    run_cli(*args)
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_SAVE, *args], capture_output=True, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    return store, db


def _versions(store) -> dict[str, bool]:
    return {v.version: v.current for v in FeatureStore(store).probe_versions("synthetic")}


def test_a_killed_probes_weights_are_listed_by_verify_and_removed_by_gc(probed):
    store, db = probed
    versions = _versions(store)
    assert sorted(versions.values()) == [False, True]  # the committed run's (current) and the killed one's
    (left,) = [v for v, current in versions.items() if not current]
    named = duckdb.connect(str(db), read_only=True).execute("SELECT DISTINCT probe_version FROM runs").fetchall()
    assert [v for (v,) in named] != [left]  # the database's runs name the other one
    out = run_cli("verify", store).output
    assert f"probe weights synthetic/probes/linear@clean/{left}: no run of {db.resolve()} names it" in out
    # written just now: a probe may still be committing it
    kept = run_cli("gc", store).output
    assert f"kept probe weights synthetic/probes/linear@clean/{left}" in kept
    assert "0 probe weight version(s) removed" in kept
    assert run_cli("gc", store, "--min-age", "0", "--dry-run").output.startswith("would remove")
    assert left in _versions(store)
    out = run_cli("gc", store, "--min-age", "0").output
    assert f"removed probe weights synthetic/probes/linear@clean/{left}" in out
    assert list(_versions(store).values()) == [True]
    assert "probe weights" not in run_cli("verify", store).output
    # the committed run still loads its weights
    assert "every probe run of 1 database(s) finds its weights" in run_cli("verify", store, "--db", db).output


@pytest.mark.parametrize("probed", ["local"], indirect=True)
def test_gc_keeps_what_it_cannot_judge(probed, tmp_path):
    store, db = probed
    (left,) = [v for v, current in _versions(store).items() if not current]
    holder = duckdb.connect(str(db))  # a writer holds the database: its runs cannot be read now
    try:
        out = run_cli("gc", store, "--min-age", "0").output
    finally:
        holder.close()
    assert "cannot be read now" in out and left in _versions(store)
    moved = db.rename(tmp_path / "elsewhere.duckdb")
    out = run_cli("gc", store, "--min-age", "0").output
    assert f"its database {db.resolve()} is not here" in out and left in _versions(store)
    # the database passed with --db is read, but the one the version was saved for is still missing: kept
    out = run_cli("gc", store, "--min-age", "0", "--db", moved).output
    assert "not here" in out and left in _versions(store)
