"""A read-only connection's DuckDB memory is bounded in proportion to the database files it reads
(featstore/schema.py READ_MEMORY_FLOOR_MB, READ_MEMORY_PER_BYTE), where DuckDB's own default is 80% of the machine:
a reader's joins and sorts past it spill to disk and still answer; a writer keeps DuckDB's default."""

from __future__ import annotations

import duckdb
import numpy as np

from featstore.analytics import db as fsdb
from featstore.analytics.read_only import open_read_only
from featstore.schema import READ_MEMORY_FLOOR_MB, READ_MEMORY_PER_BYTE


def limit_of(con: duckdb.DuckDBPyConnection) -> str:
    return con.execute("SELECT current_setting('memory_limit')").fetchone()[0]


def test_readers_are_bounded_and_writers_are_not(tmp_path):
    one, two = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    for path in (one, two):
        fsdb.connect(path).close()
    bounded = limit_of(duckdb.connect(config={"memory_limit": f"{READ_MEMORY_FLOOR_MB}MB"}))  # small files: the floor
    default = limit_of(duckdb.connect())
    assert bounded != default
    for con in (open_read_only(one), fsdb.connect_several([one, two])):
        assert limit_of(con) == bounded
        con.close()
    writer = fsdb.connect(one)
    assert limit_of(writer) == default
    writer.close()


def test_a_query_past_the_limit_spills_and_answers(tmp_path, monkeypatch):
    db = tmp_path / "f.duckdb"
    con = fsdb.connect(db)
    rows = 1_500_000
    con.execute("INSERT INTO predictions SELECT 'r', i, 0, i % 7, ((i * 7919) % 1000003) / 1000003 FROM range(?) t(i)",
                [rows])
    con.close()
    monkeypatch.setattr(fsdb, "READ_MEMORY_FLOOR_MB", 48)  # the sort fails in 48 MB without spilling to disk
    monkeypatch.setattr(fsdb, "READ_MEMORY_PER_BYTE", 0.0)
    con = open_read_only(db)
    assert limit_of(con) == limit_of(duckdb.connect(config={"memory_limit": "48MB"}))
    got = con.execute("SELECT sum(rank * image_id) FROM (SELECT image_id, row_number() OVER (ORDER BY conf, image_id) "
                      "AS rank FROM predictions)").fetchone()[0]
    con.close()
    ids = np.arange(rows)
    order = np.lexsort((ids, (ids * 7919) % 1000003))  # conf ordered as its numerator: the same order
    assert got == int(((np.arange(rows) + 1) * ids[order]).sum())


def test_the_bound_grows_with_the_files_read(tmp_path, monkeypatch):
    """Past the floor (lowered here to 1 MB, so that small files pass it), the limit is READ_MEMORY_PER_BYTE times
    the bytes of the files read, their write-ahead logs counted, so that what DuckDB cannot spill still fits on a
    larger database; several databases: their sum."""
    monkeypatch.setattr(fsdb, "READ_MEMORY_FLOOR_MB", 1)
    one, two = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    for path, rows in ((one, 3_000_000), (two, 2_500_000)):
        con = fsdb.connect(path)
        con.execute("INSERT INTO predictions SELECT 'r', i, 0, hash(i) % 1000, (hash(i) % 997) / 997 "
                    "FROM range(?) t(i)", [rows])
        con.close()
    sizes = [sum(p.stat().st_size for p in (f, f.with_name(f.name + ".wal")) if p.exists()) for f in (one, two)]
    assert READ_MEMORY_PER_BYTE * min(sizes) > 2e6  # past the lowered floor: the files count (~15 MB each)
    for con, total in ((open_read_only(one), sizes[0]), (fsdb.connect_several([one, two]), sum(sizes))):
        mb = int(np.ceil(READ_MEMORY_PER_BYTE * total / 1e6))
        assert limit_of(con) == limit_of(duckdb.connect(config={"memory_limit": f"{mb}MB"}))
        con.close()
