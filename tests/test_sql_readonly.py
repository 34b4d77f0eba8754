"""`featstore sql` is read-only for real: no statement changes the database or any file beside it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pytest

from featstore.analytics import db as fsdb

from conftest import fails, run_cli


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (recursively) with the hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def dbs(tmp_path):
    """A featstore database with 3 predictions, and another DuckDB file beside it."""
    db = tmp_path / "f.duckdb"
    con = fsdb.connect(db)
    con.execute("INSERT INTO predictions VALUES ('r', 1, 0, 2, 0.5), ('r', 2, 0, 1, 0.25), ('r', 3, 0, 0, 0.75)")
    con.close()
    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE t AS SELECT 42 AS x")
    con.close()
    return db, other


ATTACKS = {
    "reattach read-write after USE/DETACH": "ATTACH '{other}' AS x; USE x; DETACH f; ATTACH '{db}' AS w (READ_WRITE); "
                                            "DELETE FROM w.predictions",
    "attach the same file read-write": "ATTACH '{db}' AS w (READ_WRITE)",
    "attach another DuckDB file": "ATTACH '{other}' AS o",
    "copy over another DuckDB file": "COPY (SELECT 1) TO '{other}'",
    "copy to a new file": "COPY predictions TO '{folder}/leak.csv'",
    "export the database": "EXPORT DATABASE '{folder}/export'",
    "install an extension": "INSTALL httpfs",
    "load an extension": "LOAD httpfs",
    "switch external access back on": "SET enable_external_access = true",
    "read another file": "SELECT * FROM read_csv('{folder}/outside.csv')",
    "two statements": "SELECT 1; SELECT 2",
}


@pytest.mark.parametrize("name", ATTACKS)
def test_sql_attack_changes_nothing(dbs, tmp_path, name):
    db, other = dbs
    (tmp_path / "outside.csv").write_text("a,b\n1,2\n")
    before = snapshot(tmp_path)
    statement = ATTACKS[name].format(db=db, other=other, folder=tmp_path)
    line = fails("sql", "--db", db, statement)
    assert "read-only" in line or "exactly one SQL statement" in line, line
    assert snapshot(tmp_path) == before
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT sum(image_id) FROM predictions").fetchone() == (6,)
    con.close()


def test_sql_still_reads_the_macros(dbs):
    db, _ = dbs
    out = run_cli("sql", "--db", db, "SELECT count(*) AS n, sum(conf) AS s FROM predictions;", "--format", "csv")
    assert out.output.splitlines() == ["n,s", "3,1.5"]


def test_a_duckdb_file_that_is_not_featstores(dbs, tmp_path):
    _, other = dbs
    before = snapshot(tmp_path)
    for args in (["sql", "--db", other, "SELECT 1"], ["report", "--db", other, "--out", tmp_path / "rep"],
                 ["timeline", "--db", other]):
        line = fails(*args)
        assert "is not a featstore database" in line and str(other) in line
    assert snapshot(tmp_path) == before


def test_definitions_are_bound_once_per_version_and_other_ones_are_shadowed(tmp_path):
    """A file holding exactly this version's views and macros is read through them, with no TEMP copy bound again;
    a file holding another definition (an older featstore's, or one another client wrote: here a view of other
    columns) is read through this version's as TEMP objects that shadow the file's, and a write connection puts
    this version's back into the file."""
    db = tmp_path / "f.duckdb"
    fsdb.connect(db).close()
    con = fsdb.connect(db, read_only=True)
    temporary = ("SELECT (SELECT count(*) FROM duckdb_functions() WHERE database_name = 'temp') + "
                 "(SELECT count(*) FROM duckdb_views() WHERE temporary AND NOT internal)")
    assert con.execute(temporary).fetchall() == [(0,)]
    columns = [c for (c, *_) in con.execute("DESCRIBE SELECT * FROM timelines").fetchall()]
    con.close()
    raw = duckdb.connect(str(db))
    raw.execute("CREATE OR REPLACE VIEW timelines AS SELECT 1 AS old_column")
    raw.close()
    con = fsdb.connect(db, read_only=True)
    assert [c for (c, *_) in con.execute("DESCRIBE SELECT * FROM timelines").fetchall()] == columns
    assert con.execute(temporary).fetchall()[0][0] == len(fsdb.MACROS)
    con.close()
    fsdb.connect(db).close()
    raw = duckdb.connect(str(db), read_only=True)
    assert [c for (c, *_) in raw.execute("DESCRIBE SELECT * FROM timelines").fetchall()] == columns
    raw.close()
    con = fsdb.connect(db, read_only=True)
    assert con.execute(temporary).fetchall() == [(0,)]
    con.close()
