"""Reading a featstore database without Arrow or Polars: the read-only connection, one statement checked and its
errors said, results streamed in bounded batches (plain Python rows where every column is a number, text or a
boolean, so that `featstore sql` and `timeline` answer without importing Arrow or Polars), and the checks of a
sweep's windows, scope and band."""

from __future__ import annotations

import difflib
import numbers
import queue
import re
import threading
from collections.abc import Generator, Sequence
from dataclasses import replace
from pathlib import Path

import duckdb

from featstore.analytics.bands import late_notes
from featstore.analytics.db import MACROS, connect, connect_several, schema_tables
from featstore.analytics.plain_rows import PLAIN_TYPES, Rows
from featstore.errors import FeatstoreError, Step
from featstore.schema import BAND, KS, MIN_CONF, SCOPE, check_field

Db = str | Path | Sequence[str | Path] | duckdb.DuckDBPyConnection  # a database, several, or an open connection
READ_WAIT_S = 30.0  # a probe holds the write lock only for its final transaction: wait that out


def open_read_only(db: str | Path | Sequence[str | Path]) -> duckdb.DuckDBPyConnection:
    """A sealed read-only connection to one database, or to several as if they were one (`connect_several`)."""
    if isinstance(db, str | Path):
        return connect(db, read_only=True, wait_s=READ_WAIT_S)
    if len(db) == 1:
        return connect(db[0], read_only=True, wait_s=READ_WAIT_S)
    return connect_several(db)


def _one_statement(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Exactly one statement: text such as `SELECT 1; DETACH ...` is refused before anything runs (parsed by the
    open connection: DuckDB's module-level parser would first create its default in-memory database)."""
    try:
        count = len(con.extract_statements(sql))
    except duckdb.Error as e:
        raise FeatstoreError(f"SQL error: {str(e).splitlines()[0]}") from e
    if count != 1:
        raise FeatstoreError(f"give exactly one SQL statement (got {count}); run several with one call each")


def _sql_error(e: duckdb.Error) -> FeatstoreError:
    first = str(e).splitlines()[0]
    if any(m in first.lower() for m in ("read-only", "disabled", "locked", "cannot attach")):
        return FeatstoreError(f"queries open the database read-only and reach no other file, extension or "
                              f"setting ({first}); ", Step("fs.probe(...)", "probe"), " is what writes")
    missing = re.match(r"Catalog Error: (.+?) with name (\w+) does not exist!", first)
    if missing:
        return FeatstoreError(f"SQL error: no {missing.group(1).lower()} named {missing.group(2)}"
                              f"{_nearest_name(missing.group(2), str(e))}")
    return FeatstoreError(f"SQL error: {first}")


def _nearest_name(name: str, said: str) -> str:
    """'; did you mean X?' of a misspelled name: the nearest of featstore's macros, views and tables and of what
    DuckDB itself suggests (a table's misspelling may be of a table macro); and where featstore's macros are
    listed."""
    suggested = re.findall(r'Did you mean "([^"]+)"', said)
    close = difflib.get_close_matches(name.lower(), [*MACROS, *schema_tables(), *suggested], n=1, cutoff=0.6)
    return (f"; did you mean {close[0]}?" if close else "") + " (featstore's macros: docs/analytics.md)"


def _as_text_type(kind: duckdb.sqltypes.DuckDBPyType) -> str | None:
    """The SQL type to cast a column of `kind` to so that every format can print it, or None when it prints as it
    is: INTERVAL (which Arrow's Polars cannot import) and BIT (whose Arrow bytes are DuckDB's internal padding and
    bits) become DuckDB's own text, '3 days', '101', at any depth of lists, arrays, structs and maps."""
    name = kind.id
    if name in ("interval", "bit"):
        return "VARCHAR"
    if name not in ("list", "array", "struct", "map", "union"):
        return None
    children = [(field, child, _as_text_type(child) if not isinstance(child, int) else None)
                for field, child in kind.children]
    if not any(new for _, _, new in children):
        return None
    given = {field: new or str(child) for field, child, new in children}
    if name == "list":
        return f"{given['child']}[]"
    if name == "array":
        return f"{given['child']}[{dict((f, c) for f, c, _ in children)['size']}]"
    if name == "map":
        return f"MAP({given['key']}, {given['value']})"
    if name == "struct":
        return "STRUCT(" + ", ".join(f"{_quoted(field)} {text}" for field, text in given.items()) + ")"
    return "VARCHAR"  # a union: its text


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _printable(relation: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
    """`relation` with the columns no output format can print (`_as_text_type`) cast to text, by position, under
    their own names; itself when there are none."""
    casts = [_as_text_type(kind) for kind in relation.types]
    if not any(casts):
        return relation
    return relation.project(", ".join(f"#{i + 1}{f'::{cast}' if cast else ''} AS {_quoted(name)}"
                                      for i, (name, cast) in enumerate(zip(relation.columns, casts, strict=True))))


STREAM_ROWS = 65_536  # rows per batch `stream` hands over: the memory it holds, whatever the result's size


def _plain(relation: duckdb.DuckDBPyRelation) -> Rows | None:
    """`relation`'s columns as an empty `Rows`, when each is of a plain type and named once; else None."""
    types = tuple(str(kind) for kind in relation.types)
    columns = tuple(relation.columns)
    if all(t in PLAIN_TYPES for t in types) and len(set(columns)) == len(columns):
        return Rows(columns, types, [])
    return None


def stream(db: Db, sql: str, params: Sequence | dict | None = None, batch_rows: int = STREAM_ROWS,
           plain: bool = False) -> Generator:
    """The result of one read-only SQL statement as batches of at most `batch_rows` rows, in order (at least one,
    empty for an empty result), so that memory stays bounded at any row count: Arrow record batches, or with
    `plain`, where every column is of a plain type (PLAIN_TYPES), `Rows` (neither Arrow nor Polars is imported).

    DuckDB runs the query in a worker thread and this generator waits for its batches in the calling thread:
    a KeyboardInterrupt (Ctrl-C) there, or closing the generator early, cancels the query at once
    (`interrupt`) instead of waiting for it to finish, and the interrupt propagates."""
    con = db if isinstance(db, duckdb.DuckDBPyConnection) else open_read_only(db)
    batches: queue.Queue = queue.Queue(maxsize=2)  # the producer waits while the consumer prints
    stop = threading.Event()

    def handed(item: tuple) -> bool:
        """Put `item` in the queue unless the consumer stopped; whether it went."""
        while not stop.is_set():
            try:
                batches.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            if stop.is_set():
                return
            _one_statement(con, sql)
            relation = con.sql(sql, params=params or None)
            if relation is None:  # a statement without a result
                import pyarrow as pa

                batches.put(("empty", pa.table({})))
                batches.put(("end", None))
                return
            printable = _printable(relation)
            # a result with a column cast to text streams through Arrow: the plain path reads the statement's own
            # result, which holds the uncast values
            empty = _plain(relation) if plain and printable is relation else None
            relation = printable
            if empty is not None:  # the relation gave the types; the connection's own result streams its rows
                batches.put(("empty", empty))
                result = con.execute(sql, params or None)
                while rows := result.fetchmany(batch_rows):
                    if not handed(("batch", replace(empty, rows=rows))):
                        return
            else:
                reader = relation.to_arrow_reader(batch_rows)  # pulls the result batch by batch
                batches.put(("empty", reader.schema.empty_table()))
                for batch in reader:
                    if not handed(("batch", batch)):
                        return
            batches.put(("end", None))
        except BaseException as e:  # handed to the caller's thread
            batches.put(("error", e))

    worker = threading.Thread(target=produce, name="featstore-sql", daemon=True)
    worker.start()
    try:
        empty, sent = None, False
        while True:
            try:
                kind, item = batches.get(timeout=0.1)  # a wait Ctrl-C can interrupt
            except queue.Empty:
                continue
            if kind == "error":
                raise _sql_error(item) if isinstance(item, duckdb.Error) else item
            if kind == "empty":
                empty = item
            elif kind == "end":
                if not sent:
                    yield empty
                return
            else:
                sent = True
                yield item
    finally:
        stop.set()
        while worker.is_alive():
            con.interrupt()  # cancels a running (or just starting) query: the worker ends with an InterruptException
            try:
                batches.get(timeout=0.1)  # a producer blocked on a full queue sees `stop`
            except queue.Empty:
                pass
        if con is not db:
            con.close()


def fetched(db: Db, sql: str, params: Sequence | dict | None = None) -> list[tuple]:
    """Every row of one read-only SQL statement, as Python tuples."""
    con = db if isinstance(db, duckdb.DuckDBPyConnection) else open_read_only(db)
    try:
        _one_statement(con, sql)
        return con.execute(sql, params or None).fetchall()
    except duckdb.Error as e:
        raise _sql_error(e) from e
    finally:
        if con is not db:
            con.close()


def check_scope(scope: str) -> str:
    """A scope the macros know (`FIELDS["scope"]`); any other word would silently select no image at all."""
    return check_field("scope", scope)


def stability_windows(db: Db, ks: Sequence[int] | None = None, runs: Sequence[str] | None = None) -> list[int]:
    """The k values to show: as asked, or by default 1..4 as far as the runs have anchors. k counts anchors
    after the first, so a k below 1, or at or beyond every run's anchor count, selects nothing (blank layers) and
    is refused: the one rule of every command and macro call that takes k. `runs`: only these runs count."""
    most = fetched(db, "SELECT max(n_anchors) AS a FROM runs WHERE ?::VARCHAR[] IS NULL OR list_contains(?, run_id)",
                   [runs, runs])[0][0]
    if isinstance(ks, str) or (ks is not None and not (len(ks) and all(
            isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in ks))):
        raise FeatstoreError("give stability windows as integers (one, or a list)", field="k", value=ks)
    if ks is None or list(ks) == list(KS):  # the default: trimmed to what the runs have
        return [k for k in KS if most is None or k < most] or [1]
    where = f"run {runs[0]!r} has" if runs and len(runs) == 1 else "the runs in the database have at most"
    if min(ks) < 1 or (most is not None and max(ks) >= most):
        bad = min(ks) if min(ks) < 1 else max(ks)
        raise FeatstoreError(f"{where} {most} anchors, so k (anchors after the first that must agree) "
                             f"must be from 1 to {(most or 2) - 1}", field="k", value=bad)
    return sorted(ks)


def check_band(band: str) -> str:
    """A band the sweep knows (`FIELDS["band"]`); any other word is refused in one line before the query."""
    return check_field("band", band)


def check_min_conf(min_conf: float) -> float:
    """The joint criterion's confidence threshold θ (`FIELDS["min_conf"]`): 0 (stability alone) up to 1."""
    return check_field("min_conf", min_conf)


def known_runs(db: Db, runs: Sequence[str]) -> list[str]:
    """The runs as given, once each, every one of them in the database (else the --run error naming it)."""
    known = [r for (r,) in fetched(db, "SELECT run_id FROM runs")]
    missing = [r for r in runs if r not in known]
    if missing:
        raise FeatstoreError(f"no run {missing[0]!r} in the database; list them with ",
                             Step("fs.connect(db).runs", "sql"), field="runs")
    return list(dict.fromkeys(runs))


def sweep_statement(ks: Sequence[int], scope: str, min_conf: float, runs: Sequence[str] | None, band: str,
                    columns: str = "*") -> tuple[str, list]:
    """The statement and parameters of decision_sweep at the windows ks (its rows at the largest, those of ks kept),
    of every run or of `runs`; `columns`: what of each row."""
    return (f"SELECT {columns} FROM decision_sweep(?, scope := ?, min_conf := ?, band := ?) "
            "WHERE list_contains(?, k) AND (?::VARCHAR[] IS NULL OR list_contains(?, run_id))",
            [max(ks), scope, check_min_conf(min_conf), band, list(ks), runs, runs])


def k_sweep_rows(db: Db, ks: Sequence[int] | None = None, scope: str = SCOPE, min_conf: float = MIN_CONF,
                 runs: Sequence[str] | None = None, band: str = BAND) -> tuple[Rows, list[str]]:
    """`featstore timeline`'s table on one connection, as plain rows: decision_sweep at the windows ks without the
    model, view and probe columns, of every run or of the runs named (each must exist); and, in the paper's band,
    the late caveats of the runs shown (`late_notes`)."""
    check_scope(scope)
    check_band(band)
    con = db if isinstance(db, duckdb.DuckDBPyConnection) else open_read_only(db)
    try:
        chosen = known_runs(con, runs) if runs else None
        statement, params = sweep_statement(stability_windows(con, ks), scope, min_conf, chosen, band,
                                            "* EXCLUDE (model, view, probe)")
        relation = con.sql(statement, params=params)
        table = Rows(tuple(relation.columns), tuple(str(t) for t in relation.types), relation.fetchall())
        shown = sorted({row[0] for row in table.rows})
        if band != "paper":
            return table, []
        lasts = fetched(con, "SELECT DISTINCT n_anchors - 1 FROM runs WHERE list_contains(?, run_id) ORDER BY 1",
                        [shown])
        k_at = table.columns.index("k")
        return table, late_notes([t for (t,) in lasts], ks or sorted({row[k_at] for row in table.rows}), con)
    except duckdb.Error as e:
        raise _sql_error(e) from e
    finally:
        if con is not db:
            con.close()
