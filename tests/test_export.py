"""`featstore export` writes every table (an empty one with its columns), one export at a time per
target, never deletes what it did not create, and follows a symlinked target."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

import duckdb
import polars as pl
import pytest
from synthetic import class_clusters, write_feature_store

from featstore.analytics import db as fsdb

from conftest import fails, run_cli


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    feats, labels = class_clusters(90, 3, [4, 6], seed=2)
    store = write_feature_store(root / "s.zarr", feats, labels, 3, chunk_rows=32)
    path = root / "f.duckdb"
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", path, "--variant", "linear:tol=0.02",
            "--threads", "1", "--no-progress")
    return path


def exported(folder) -> set[str]:
    return {p.name.removesuffix(".parquet") for p in folder.iterdir()}


def test_every_table_is_exported_empty_ones_with_their_columns(db, tmp_path):
    """`edges`, `folds`, `gate_scores` (no circuit, no cross-fit, no gate here) were skipped, so the documented
    `**/*.parquet` globs failed; now each is a file of no rows with the table's columns."""
    out = tmp_path / "out"
    assert f"wrote {len(fsdb.schema_tables())} table(s)" in run_cli("export", "--db", db, "--to", out).output
    assert exported(out) == set(fsdb.schema_tables())
    con = duckdb.connect(str(db), read_only=True)
    for table in ("folds", "edges", "gate_scores", "model_sources"):
        want = [c for (c,) in con.execute(f"SELECT column_name FROM information_schema.columns WHERE table_name = "
                                          f"'{table}' ORDER BY ordinal_position").fetchall()]
        pattern = out / table / "**" / "*.parquet" if (out / table).is_dir() else out / f"{table}.parquet"
        back = pl.read_parquet(pattern, hive_partitioning=True)
        assert back.columns == want, table
        assert back.height == con.execute(f"SELECT count(*) FROM {table}").fetchone()[0], table
    con.close()
    assert not (tmp_path / "out.partial").exists()


def test_a_partial_folder_it_did_not_begin_is_never_deleted(db, tmp_path):
    """Case 7: `export --to ex4` deleted an existing `ex4.partial/` and what it held."""
    partial = tmp_path / "ex4.partial"
    partial.mkdir()
    (partial / "mine.txt").write_text("keep me")
    line = fails("export", "--db", db, "--to", tmp_path / "ex4")
    assert f"{partial} exists and holds files featstore export did not write" in line
    assert (partial / "mine.txt").read_text() == "keep me" and not (tmp_path / "ex4").exists()
    (tmp_path / "ex5.partial").write_text("a file")
    assert "is not a folder featstore export began" in fails("export", "--db", db, "--to", tmp_path / "ex5")
    assert (tmp_path / "ex5.partial").read_text() == "a file"


def test_an_interrupted_export_of_its_own_is_redone(db, tmp_path):
    partial = tmp_path / "out.partial"
    (partial / "runs.parquet").parent.mkdir()
    (partial / ".featstore-export").write_text("featstore export of x\n")
    (partial / "runs.parquet").write_text("half written")
    run_cli("export", "--db", db, "--to", tmp_path / "out")
    assert pl.read_parquet(tmp_path / "out" / "runs.parquet").height == 1
    assert not partial.exists() and not (tmp_path / "out" / ".featstore-export").exists()


def test_a_second_export_to_the_same_target_is_refused(db, tmp_path):
    """Case 6: two exports at once: one said "wrote 9 table(s)" over an incomplete folder, the other a traceback.
    While one holds the target's lock a second is refused in one line; three started together leave one
    complete folder and two refusals, whichever wins."""
    partial = tmp_path / "out.partial"
    partial.mkdir()
    (partial / ".featstore-export").write_text("featstore export of x\n")
    fd = os.open(partial, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        line = fails("export", "--db", db, "--to", tmp_path / "out")
    finally:
        os.close(fd)
    assert f"export folder {partial} is being written by pid" in line and "export to another --out" in line
    assert (partial / ".featstore-export").is_file()
    os.remove(partial / ".featstore-export")
    partial.rmdir()
    jobs = [subprocess.Popen([sys.executable, "-m", "featstore.cli.main", "export", "--db", str(db), "--to",
                              str(tmp_path / "race")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(3)]
    results = [(job.wait(timeout=300), job.stdout.read(), job.stderr.read()) for job in jobs]
    assert sorted(code for code, _, _ in results) == [0, 2, 2], results
    for refused in [err for code, _, err in results if code == 2]:
        assert len(refused.strip().splitlines()) == 1 and refused.startswith("featstore: error: "), refused
    assert exported(tmp_path / "race") == set(fsdb.schema_tables())


def test_a_symlinked_target_is_followed(db, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    run_cli("export", "--db", db, "--to", link)
    assert link.is_symlink() and exported(real) == set(fsdb.schema_tables())
