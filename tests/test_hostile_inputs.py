"""Stores and databases from someone else (issue 47): nothing in them runs, nothing they name leaks, nothing waits.

Each case is an attack a careful but hostile sender can make with a crafted store or database, played for real:

1. a `meta` table replaced by a VIEW over `read_text('secret.txt')`: `featstore sql --db a --db crafted` refuses it
   in one line and never prints the file;
2. the same database given to `featstore export`: refused, nothing written;
3. a macro named like a DuckDB built-in (`count_star`, what `count(*)` calls) that reads a file, in a database a
   write job opens (`featstore merge --db crafted`): refused before it runs;
4. every connection featstore opens (write, read-only, several databases as one) is sealed: no file access, no
   extension install or load, configuration locked.

Future surfaces that read a store or a database extend this module with their own attacks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest
from synthetic import register_toy_images, run_rows

from featstore.analytics import db as fsdb

from conftest import fails

LINEAR_RUN, LINEAR_NAME = "synthetic/clean/linear:tol=0.02", "linear:tol=0.02@clean"
LDA_RUN, LDA_NAME = "synthetic/clean/lda", "lda@clean"
ANCHORS = ("anchor00", "anchor01")


# -- crafted databases ------------------------------------------------------------------------------------------


@pytest.fixture
def toy(tmp_path) -> Path:
    """A featstore database of 8 images with one run: what the crafted databases are copies of."""
    db = tmp_path / "a.duckdb"
    con = fsdb.connect(db)
    register_toy_images(con, np.arange(8) % 2, np.array(["test"] * 8), ("m",), 3)
    fsdb.write_runs(con, [run_rows({"run_id": "m/clean/linear", "model": "m", "view": "clean"}, np.arange(8),
                                   np.zeros((8, 3), int), np.ones((8, 3)))])
    con.close()
    return db


def crafted(db: Path, to: Path, *statements: str) -> Path:
    """A copy of `db` changed by `statements` (run by a plain DuckDB client, as a sender would)."""
    shutil.copyfile(db, to)
    con = duckdb.connect(str(to))
    for statement in statements:
        con.execute(statement)
    con.close()
    return to


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_text("TOPSECRET-4f1c9a")
    return path


def meta_view(secret: Path) -> tuple[str, str]:
    return ("DROP TABLE meta", f"CREATE VIEW meta AS SELECT 'dataset' AS key, content AS value "
                               f"FROM read_text('{secret}')")


def test_sql_over_several_databases_never_reads_a_crafted_view(toy, secret, tmp_path):
    """Case 1: the identity check of `sql --db a --db b` ran before sealing and printed the file in its error."""
    bad = crafted(toy, tmp_path / "crafted.duckdb", *meta_view(secret))
    for dbs in (["--db", toy, "--db", bad], ["--db", bad]):
        line = fails("sql", *dbs, "SELECT 1")
        assert "meta is a view where featstore keeps a table" in line
        assert "TOPSECRET" not in line


def test_export_of_a_crafted_database_writes_nothing(toy, secret, tmp_path):
    """Case 2: export opened the database unsealed and wrote the file into meta.parquet."""
    bad = crafted(toy, tmp_path / "crafted.duckdb", *meta_view(secret))
    line = fails("export", "--db", bad, "--to", tmp_path / "out")
    assert "meta is a view where featstore keeps a table" in line and "TOPSECRET" not in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_macro_named_like_a_builtin_is_refused_before_it_runs(toy, secret, tmp_path):
    """Case 3: a persisted `count_star` replaces count(*) in every query of the database; merge's write connection
    ran it with file access, and the file came out in the error (a cast of its text to a number)."""
    bad = crafted(toy, tmp_path / "crafted.duckdb",
                  f"CREATE MACRO count_star() AS (SELECT content::INTEGER FROM read_text('{secret}'))")
    source = crafted(toy, tmp_path / "b.duckdb")
    for args in (("merge", "--db", bad, source), ("sql", "--db", bad, "SELECT count(*) FROM runs")):
        line = fails(*args)
        assert "defines count_star, a function DuckDB already has" in line and "TOPSECRET" not in line


def test_every_connection_featstore_opens_is_sealed(toy, tmp_path):
    """Case 4: write connections (probe, merge, gate, cost, ...) kept file access and extension autoload on."""
    sealed = (False, False, False, True)
    settings = ("SELECT current_setting('enable_external_access'), current_setting('autoinstall_known_extensions'), "
                "current_setting('autoload_known_extensions'), current_setting('lock_configuration')")
    other = crafted(toy, tmp_path / "b.duckdb", *[f"DELETE FROM {table}" for table in fsdb.RUN_TABLES])
    for open_ in (lambda: fsdb.connect(tmp_path / "new.duckdb"), lambda: fsdb.connect(toy),
                  lambda: fsdb.connect(toy, read_only=True), lambda: fsdb.connect_several([toy, other])):
        con = open_()
        try:
            assert con.execute(settings).fetchone() == sealed
        finally:
            con.close()
