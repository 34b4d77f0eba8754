"""A read-only connection's DuckDB memory is bounded (featstore/schema.py READ_MEMORY_LIMIT), where DuckDB's own
default is 80% of the machine: a reader's joins and sorts past it spill to disk and still answer; a writer keeps
DuckDB's default."""

from __future__ import annotations

import duckdb
import numpy as np

from featstore.analytics import db as fsdb
from featstore.analytics.read_only import open_read_only
from featstore.schema import READ_MEMORY_LIMIT


def limit_of(con: duckdb.DuckDBPyConnection) -> str:
    return con.execute("SELECT current_setting('memory_limit')").fetchone()[0]


def test_readers_are_bounded_and_writers_are_not(tmp_path):
    one, two = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    for path in (one, two):
        fsdb.connect(path).close()
    bounded = limit_of(duckdb.connect(config={"memory_limit": READ_MEMORY_LIMIT}))
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
    monkeypatch.setitem(fsdb.READER, "memory_limit", "48MB")  # the sort fails in 48 MB without spilling to disk
    con = open_read_only(db)
    assert limit_of(con) == limit_of(duckdb.connect(config={"memory_limit": "48MB"}))
    got = con.execute("SELECT sum(rank * image_id) FROM (SELECT image_id, row_number() OVER (ORDER BY conf, image_id) "
                      "AS rank FROM predictions)").fetchone()[0]
    con.close()
    ids = np.arange(rows)
    order = np.lexsort((ids, (ids * 7919) % 1000003))  # conf ordered as its numerator: the same order
    assert got == int(((np.arange(rows) + 1) * ids[order]).sum())
