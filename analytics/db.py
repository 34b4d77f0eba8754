"""The DuckDB side: opening the database (read-only for queries), its schema, and atomic writes of records.

Every table, view and macro is defined in `sql/`; this module loads them, and keeps only the statements that
write (inserts of `featstore.records` by column name, the deletes that replace a run) and a few plain lookups.
Each write runs inside `transaction`, so a killed job leaves either the old rows or the new ones.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import math
import os
import re
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from featstore.analytics.interrupts import interruptible
from featstore.errors import FeatstoreError, Name, Step
from featstore.schema import READ_MEMORY_FLOOR_MB, READ_MEMORY_PER_BYTE

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from featstore.records import CircuitRun, DatasetInfo, GateScores, ModelCost, ModelSource, RunRows, ZooRow

_DEFINITION = re.compile(r"CREATE OR REPLACE (MACRO|VIEW) (\w+)")


def sql_text(name: str) -> str:
    """The text of `sql/<name>.sql`."""
    return importlib.resources.files("featstore.sql").joinpath(f"{name}.sql").read_text()


def _without_comments(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


def macro_order() -> tuple[str, ...]:
    """Every view/macro file of sql/ (one whose statement defines the name of its file), ordered so that each
    comes after those it uses: derived from the files, so a new file needs no list to be kept."""
    texts = {}
    for entry in importlib.resources.files("featstore.sql").iterdir():
        if entry.name.endswith(".sql"):
            text = _without_comments(entry.read_text())
            found = _DEFINITION.search(text)
            if found and found.group(2) == entry.name.removesuffix(".sql"):
                texts[found.group(2)] = text[found.end():]
    uses = {name: set(re.findall(r"\w+", body)) & texts.keys() - {name} for name, body in texts.items()}
    order: list[str] = []
    while uses:
        ready = sorted(name for name, needs in uses.items() if needs <= set(order))
        if not ready:
            raise RuntimeError(f"sql/: circular definitions among {', '.join(sorted(uses))}")
        order += ready
        uses = {name: needs for name, needs in uses.items() if name not in ready}
    return tuple(order)


MACROS = macro_order()


def _definitions_digest(con: duckdb.DuckDBPyConnection) -> str:
    """A digest of the definitions of featstore's views and macros as the connection's own database holds them
    (TEMP ones left out), as DuckDB prints them back."""
    rows = con.execute(sql_text("defined_objects"), [list(MACROS)]).fetchall()
    return hashlib.sha256(repr(rows).encode()).hexdigest()


@functools.cache
def macro_set_digest() -> str:
    """The digest of this version's view and macro definitions, of their sql/ text (read once per process)."""
    return hashlib.sha256("\n".join(sql_text(name) for name in MACROS).encode()).hexdigest()


def _definition_statements(temporary: bool) -> list[str]:
    texts = [sql_text(name) for name in MACROS]
    if temporary:
        texts = [_DEFINITION.sub(lambda m: f"CREATE OR REPLACE TEMP {m.group(1)} {m.group(2)}", text, count=1)
                 for text in texts]
    return texts


def _recorded_macro_set(con: duckdb.DuckDBPyConnection) -> tuple[str, str] | None:
    """(source digest, printed digest) of the definitions a write connection last installed in the file (sql/
    macro_set.sql), or None for a file without the record (an older featstore's, or an in-memory database)."""
    try:
        found = con.execute("SELECT source_digest, printed_digest FROM main.macro_set").fetchall()
    except duckdb.CatalogException:
        return None
    return found[0] if len(found) == 1 else None


def in_memory(*names: str) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB holding the named views and macros of sql/ (in the order given): for a figure that reads
    a definition without any database."""
    con = interruptible(duckdb.connect(":memory:"))
    for name in names:
        con.execute(sql_text(name))
    return con


def file_state(path: Path) -> tuple:
    """What changes whenever a database file (or its write-ahead log) is written: identity, size and modification
    time of both. Checks of a file's catalog are kept per process under it (`_CHECKED`)."""
    state = []
    for p in (path, path.with_name(path.name + ".wal")):
        try:
            st = p.stat()
        except FileNotFoundError:
            state.append(None)
            continue
        state.append((str(p.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(state)


_CHECKED: dict[tuple[str, tuple], bool] = {}  # (check, file_state) -> passed: a process opening one file repeatedly


def install_macros(con: duckdb.DuckDBPyConnection, temporary: bool = False, path: Path | None = None) -> None:
    """Create every view and macro of this featstore version, once per database and version. A write connection
    persists them in the file (a plain DuckDB client can call them) beside a record of which set it put there
    (sql/macro_set.sql): binding them takes ~0.3 s, so a later open finds the record and, where the file's
    definitions are still those recorded (DuckDB prints them back, ~0.05 s: no other client replaced one), binds
    nothing; a process that opens the same unchanged file again (`path`, `file_state`) skips even that. A read-only
    connection to a file of another version (or without the record, or whose definitions another client changed)
    creates them as TEMP objects, which shadow whatever the file holds, so every client of one version runs the same
    definitions."""
    key = ("macros", file_state(path)) if path is not None and temporary else None
    if key is not None and _CHECKED.get(key):
        return
    recorded = _recorded_macro_set(con)
    if recorded is not None and recorded[0] == macro_set_digest() and recorded[1] == _definitions_digest(con):
        if key is not None:
            _CHECKED[key] = True
        return
    con.execute(";\n".join(_definition_statements(temporary)))
    if not temporary:
        con.execute(sql_text("macro_set"))
        con.execute("DELETE FROM macro_set")
        con.execute("INSERT INTO macro_set VALUES (?, ?)", [macro_set_digest(), _definitions_digest(con)])


def schema_tables() -> tuple[str, ...]:
    """The tables sql/schema.sql creates, in its order."""
    return tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", _without_comments(sql_text("schema"))))


WRITE_WAIT_S = 120.0  # how long a job's final writes wait for readers (`featstore sql`) to let go of the database


def _stand_in_for_newer_tables(con: duckdb.DuckDBPyConnection, database: str | None = None) -> list[str]:
    """A featstore file opened read-only that predates a table (say css_graph) gets an empty TEMP one, so the
    macros that read it still bind; files without featstore's `meta` table are left as they are. `database`: the
    attached database to look at (default: the connection's own). Returns the tables stood in for."""
    where = "WHERE database_name = current_database()" if database is None else "WHERE database_name = ?"
    existing = {row[0] for row in con.execute(f"SELECT table_name FROM duckdb_tables() {where} AND NOT temporary",
                                              [] if database is None else [database]).fetchall()}
    if "meta" not in existing:
        return []
    made = [table for table in schema_tables() if table not in existing]
    for table in made:
        _create_temp_table(con, table)
    return made


def _create_temp_table(con: duckdb.DuckDBPyConnection, table: str) -> None:
    """An empty TEMP table as sql/schema.sql creates `table`."""
    for statement in _without_comments(sql_text("schema")).split(";"):
        if re.search(rf"CREATE TABLE IF NOT EXISTS {table}\b", statement):
            con.execute(statement.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))
            return


# No connection featstore opens on a database reaches another file (ATTACH, COPY, EXPORT, read_text, read_csv),
# downloads or loads an extension, or lets a statement switch that back on: the SQL a user types into `featstore sql`
# runs there, and a database from someone else may hold views or macros that read files. Write connections too:
# featstore's jobs only insert rows it hands over (Arrow) and read the database itself.
NO_EXTENSIONS = {"autoload_known_extensions": False, "autoinstall_known_extensions": False}
SEALED = {"enable_external_access": False, **NO_EXTENSIONS, "lock_configuration": True}


def reader_config(paths: Sequence[Path]) -> dict[str, str]:
    """A reader's DuckDB memory limit (featstore/schema.py READ_MEMORY_FLOOR_MB, READ_MEMORY_PER_BYTE) for the
    database files `paths` (their write-ahead logs counted): DuckDB's default, 80% of the machine, let one report
    hold 1.4 GB of buffers on a 48,000-image database; bounded, the same queries spill to <database>.tmp instead."""
    stored = sum(p.stat().st_size for path in paths for p in (path, path.with_name(path.name + ".wal")) if p.exists())
    return {"memory_limit": f"{max(READ_MEMORY_FLOOR_MB, math.ceil(READ_MEMORY_PER_BYTE * stored / 1e6))}MB"}


def seal(con: duckdb.DuckDBPyConnection, reach: Sequence[Path] = ()) -> None:
    """Seal a connection opened with NO_EXTENSIONS as SEALED seals one at opening, except for the files and folders
    of `reach` (DuckDB's allowed_paths and allowed_directories: the databases `merge` attaches, the folder `export`
    writes); call it before anything reads a table or view."""
    folders = [str(p.resolve()) + "/" for p in reach if p.is_dir()]
    files = [str(p.resolve()) for p in reach if not p.is_dir()]
    if folders:
        con.execute("SET allowed_directories = ?", [folders])
    if files:
        con.execute("SET allowed_paths = ?", [files])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def database_files(paths: Sequence[Path]) -> list[Path]:
    """Each database (resolved, as it is attached) and its write-ahead log: what a connection attaching them
    reaches."""
    resolved = [Path(p).resolve() for p in paths]
    return [f for r in resolved for f in (r, r.with_name(r.name + ".wal"))]


NOT_FILES = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def not_a_file(path: Path) -> str | None:
    """What `path` is when it is there and no regular file (after its links): a folder, a FIFO (opening one waits
    for a writer forever), a socket or a device (/dev/null keeps nothing); None for a file or nothing there."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((what for test, what in NOT_FILES if test(mode)), None)


def check_database_path(path: Path) -> None:
    """A database is a regular file (or nothing yet, for a write): anything else is refused in one line before
    DuckDB opens it (it would wait forever on a FIFO)."""
    what = not_a_file(path)
    if what is not None:
        raise FeatstoreError(f"{path} is {what}, not a database file; pass the DuckDB file itself as ", Name("db"))


def connect(path: str | Path, read_only: bool = False, wait_s: float = 0.0,
            reach: Sequence[Path] = ()) -> duckdb.DuckDBPyConnection:
    """Open a featstore database; a lock held by another process becomes a one-line error, after retrying for
    `wait_s` seconds (readers such as `featstore sql` hold it only for one query).

    Every connection is sealed before anything reads a table (see SEALED: no SQL a user types, and no view or
    macro of the file, changes the database, reads or writes another file or loads an extension); `reach` names
    the only files and folders it may touch beside its own (`seal`). A file whose views or macros would run in place
    of featstore's tables or DuckDB's functions is refused (`_check_shadowing`)."""
    path = Path(path)
    check_database_path(path)
    if read_only and not path.exists():
        raise FeatstoreError("no database there; fill one with ", Step("fs.probe(db=db, ...)", "probe"),
                             field="db", value=path)
    creating = not read_only and not path.exists()
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                con = interruptible(duckdb.connect(str(path), read_only=read_only,
                                                   config=(NO_EXTENSIONS if reach else SEALED)
                                                   | (reader_config([path]) if read_only else {})))
                break
            except duckdb.IOException as e:
                if "lock" not in str(e).lower() or time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
    except duckdb.IOException as e:
        msg = str(e)
        if "lock" in msg.lower():  # another process holds the file (it may have just created it): left alone
            holder = msg.split("Conflicting lock is held in", 1)[-1].split("\n")[0].strip() if "held" in msg else ""
            raise FeatstoreError(f"database {path} is in use by another process ({holder or 'locked'}); "
                                 f"close it or pass another ", Name("db")) from e
        if creating:  # a file this call began but could not finish (a full disk): unreadable, so not left behind
            remove_database(path)
        raise FeatstoreError(f"cannot open database {path}: {msg.splitlines()[0]}") from e
    except duckdb.Error as e:
        raise FeatstoreError(f"{path} is not a DuckDB database ({str(e).splitlines()[0]}); "
                             f"pass another ", Name("db")) from e
    try:
        if reach:
            seal(con, reach)
        _check_shadowing(con, path)
        if not read_only:
            _check_not_foreign(con, path)
            con.execute(sql_text("schema"))
            con.execute(sql_text("migrate_runs"))
        else:
            _stand_in_for_newer_tables(con)
            _migrated_runs(con)
        install_macros(con, temporary=read_only, path=path)
    except BaseException as e:
        if creating:
            remove_empty(con, path)
        con.close()
        if isinstance(e, duckdb.CatalogException) and read_only:
            raise FeatstoreError(f"{path} is not a featstore database ({str(e).splitlines()[0]}); pass the ",
                                 Name("db"), " "
                                 "that ", Step("fs.probe(...)", "probe"), " filled") from e
        if isinstance(e, duckdb.IOException | duckdb.TransactionException):  # a full disk, a file size limit
            raise FeatstoreError(f"cannot write database {path}: {str(e).splitlines()[0]}") from e
        raise  # a macro that does not bind on a write connection is featstore's own bug
    return con


def _check_shadowing(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Refuse a file that defines a view where featstore keeps a table, or a macro named like a DuckDB built-in
    (sql/shadowing_objects.sql): either would run the file's own SQL wherever featstore reads that table or calls that
    function. Only the catalog is read, before any table."""
    key = ("shadowing", file_state(path))
    if _CHECKED.get(key):  # this process read this very file's catalog before
        return
    found = con.execute(sql_text("shadowing_objects"), [list(schema_tables())]).fetchone()
    if found:
        kind, name = found
        what = (f"{name} is a view where featstore keeps a table" if kind == "view"
                else f"it defines {name}, a function DuckDB already has, which it would replace in every query")
        raise FeatstoreError(f"{path}: {what}, so reading it would run the file's own SQL; pass a ", Name("db"),
                             " that "
                             "featstore wrote")
    _CHECKED[key] = True


# the columns migrate_runs.sql gives the tables of a file an older featstore wrote
MIGRATED_COLUMNS = {"runs": ("probe_id", "probe_name", "probe_version", "streamed", "c"), "probe_fits": ("c",)}
# the keys of a run's identity that an older featstore wrote into runs.params too (migrate_runs.sql takes them out)
IDENTITY_KEYS = ("probe_id", "probe_name", "probe_version", "streamed")


def _migrated_runs(con: duckdb.DuckDBPyConnection, database: str | None = None) -> list[str]:
    """A read-only file whose `runs` or `probe_fits` predates a typed column of this version (MIGRATED_COLUMNS), or
    whose runs' params still hold identity keys (IDENTITY_KEYS), gets TEMP copies of both, migrated as a write
    connection would migrate the file (sql/migrate_runs.sql), which the macros read in their place. `database`: the
    attached database (default: the connection's own). Returns the tables copied (none when the file's tables are
    this version's, or it has no runs table)."""
    database = database or con.execute("SELECT current_database()").fetchone()[0]
    held = {}
    for table in MIGRATED_COLUMNS:
        held[table] = {c.lower() for (c,) in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE database_name = ? AND schema_name = 'main' AND "
            "table_name = ?", [database, table]).fetchall()}
    if not held["runs"]:
        return []
    if all(set(MIGRATED_COLUMNS[t]) <= held[t] for t in MIGRATED_COLUMNS if held[t]) and not con.execute(
            f'SELECT 1 FROM "{database}".main.runs WHERE list_has_any(json_keys(params), ?) LIMIT 1',
            [list(IDENTITY_KEYS)]).fetchall():
        return []
    for table in MIGRATED_COLUMNS:
        if held[table]:
            con.execute(f'CREATE OR REPLACE TEMP TABLE {table} AS SELECT * FROM "{database}".main.{table}')
        elif not con.execute("SELECT 1 FROM duckdb_tables() WHERE temporary AND table_name = ?", [table]).fetchall():
            _create_temp_table(con, table)  # a file older than the table: an empty one, as a stand-in
    con.execute(sql_text("migrate_runs"))
    return list(MIGRATED_COLUMNS)


def _check_not_foreign(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """A write connection adds featstore's tables only to a database that is featstore's (its `meta` table) or holds
    no table yet: another program's DuckDB file is refused, not filled with featstore's tables."""
    tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = "
                                        "current_database() AND NOT temporary ORDER BY 1").fetchall()]
    if tables and "meta" not in tables:
        raise FeatstoreError(f"{path} is a DuckDB database featstore did not write (it holds table {tables[0]}"
                             f"{f' and {len(tables) - 1} more' if len(tables) > 1 else ''}); pass another ", Name("db"))


def remove_database(path: str | Path) -> None:
    """Delete a database file and its write-ahead log: only for a database that the caller created or found empty
    and has held the write lock on since, so that everything in it is the caller's own failed work."""
    path = Path(path)
    for p in (path, path.with_name(path.name + ".wal")):
        p.unlink(missing_ok=True)


def is_empty(con: duckdb.DuckDBPyConnection) -> bool:
    """True when no featstore table of the database holds a row (one just created, or never filled)."""
    present = {row[0] for row in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary")
               .fetchall()}
    return all(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] == 0 for t in schema_tables() if t in present)


def remove_empty(con: duckdb.DuckDBPyConnection, path: str | Path) -> None:
    """After a failed first write into a database that held nothing: remove its files, so that no empty (or, on a
    full disk, unreadable) database is left for later runs to trip over. Call while `con` still holds the write
    lock, so that no other job can have written to it in between."""
    try:
        empty = is_empty(con)
    except duckdb.Error:  # a database this job created and could not even read back: nothing in it
        empty = True
    if empty:
        remove_database(Path(path))


# tables several databases hold the same copy of (one image set, one anchor list per model): read once
SHARED_TABLES = ("meta", "images")
DEDUPLICATED_TABLES = ("anchors", "model_outputs", "model_sources")


def attach_names(con: duckdb.DuckDBPyConnection, paths: Sequence[Path]) -> list[str]:
    """The name each database is attached under: its file stem as a plain lower-case identifier (`runs-2.duckdb`:
    `runs_2`), or `db_<n>` where that is not a name SQL can use unquoted (a keyword such as `select`, a leading
    digit, DuckDB's own `memory`/`temp`/`system`/`main`) or one an earlier database took (DuckDB's names ignore
    case, so `x` and `X` are one name)."""
    keywords = {k for (k,) in con.execute("SELECT keyword_name FROM duckdb_keywords()").fetchall()}
    taken = {"memory", "temp", "system", "main"}
    aliases: list[str] = []
    for p in paths:
        alias = re.sub(r"\W", "_", p.stem).lower()
        if not re.match(r"[a-z_]", alias) or alias in taken or alias in keywords:
            alias = next(f"db_{n}" for n in range(len(aliases) + 1, len(aliases) + len(taken) + 2)
                         if f"db_{n}" not in taken)
        taken.add(alias)
        aliases.append(alias)
    return aliases


def _check_one_experiment(con: duckdb.DuckDBPyConnection, aliases: Sequence[str], paths: Sequence[Path]) -> None:
    """Databases read as one must be one experiment (sql/database_identity.sql): the same image set and split, the
    same images table, and per model the same weights and anchors; the first difference is refused in one line."""
    first: dict[tuple[str, str], str] = {}
    for n, (alias, p) in enumerate(zip(aliases, paths, strict=True)):
        stand_ins = _stand_in_for_newer_tables(con, alias)  # an older featstore's file: empty, as it would be
        con.execute(f"SET search_path = '{alias}'")
        try:
            identity = {(what, key): value
                        for what, key, value in con.execute(sql_text("database_identity")).fetchall()}
        finally:
            con.execute("RESET search_path")
            for table in stand_ins:
                con.execute(f"DROP TABLE temp.{table}")
        if n == 0:
            first = identity
            continue
        for (what, key), value in identity.items():
            if (what, key) in first and first[(what, key)] != value:
                said = {"split": "its image set" if key == "dataset" else f"its {key}",
                        "images": "its images table (labels or train/val/test split)",
                        "weights": f"the weights model {key} was probed from",
                        "anchors": f"the anchors of model {key}"}[what]
                raise FeatstoreError(f"databases {paths[0]} and {p} are not one experiment: {said} differs "
                                     f"({first[(what, key)]} vs {value}); query them one at a time, or probe them "
                                     f"with one store and one ", Name("split_seed"))


def _distinct_files(paths: Sequence[Path]) -> list[Path]:
    """`paths` with a file given again (the same path, another spelling of it, a link to it) left out: read once,
    not refused as two databases holding the same runs."""
    seen: set = set()
    kept = []
    for p in paths:
        try:
            key = (p.stat().st_dev, p.stat().st_ino)
        except OSError:
            key = os.path.realpath(p)
        if key not in seen:
            seen.add(key)
            kept.append(p)
    return kept


RUN_TABLES = ("runs", "predictions", "decisions", "folds", "probe_fits", "gates", "gate_scores")  # keyed by run_id


def connect_several(paths: Sequence[str | Path], runs: Sequence[str] | None = None) -> duckdb.DuckDBPyConnection:
    """One sealed read-only connection over several featstore databases of one image set, as if they were one:
    each is attached read-only (as `attach_names` names it), every featstore table is a TEMP view over all of them,
    and the macros read those views. Refused in one line: a file that is not a featstore database, databases that
    are not one experiment (other image sets, splits, or weights or anchors for a model) and a run id held by two
    of them. `runs`: only these probe runs are seen (every table keyed by run id holds their rows alone), so that
    a study reports exactly the runs it declares, not others an earlier version of it left in the database."""
    paths = _distinct_files([Path(p) for p in paths])
    for p in paths:
        connect(p, read_only=True).close()  # each one exists and is a featstore database
    con = interruptible(duckdb.connect(":memory:", config=NO_EXTENSIONS | reader_config(paths)))
    try:
        seal(con, database_files(paths))  # before anything is attached: they, and nothing else, can be read
        aliases = attach_names(con, paths)
        for alias, p in zip(aliases, paths, strict=True):
            con.execute(f"ATTACH ? AS {alias} (READ_ONLY)", [str(p.resolve())])
        _check_one_experiment(con, aliases, paths)
    except BaseException:
        con.close()
        raise
    present = {(d, t) for d, t in con.execute("SELECT database_name, table_name FROM duckdb_tables()").fetchall()}
    fingerprints = {}
    for alias, p in zip(aliases, paths, strict=True):
        found = con.execute(f"SELECT value FROM {alias}.meta WHERE key = 'dataset'").fetchone()
        if found:
            fingerprints[found[0]] = p
    images_from = next((a for a, p in zip(aliases, paths, strict=True) if p in fingerprints.values()), aliases[0])
    if runs is not None:
        con.execute("CREATE TEMP TABLE declared_runs AS SELECT unnest(?::VARCHAR[]) AS run_id", [list(runs)])
    sources = {(a, table): f"{a}.{table}" for a, table in present}
    for alias in aliases:  # an older featstore's runs: migrated TEMP copies stand in (see `_migrated_runs`)
        for table in _migrated_runs(con, alias):
            con.execute(f"ALTER TABLE temp.{table} RENAME TO {table}_{alias}")
            sources[(alias, table)] = f"temp.{table}_{alias}"
            present.add((alias, table))
    for table in schema_tables():
        parts = [f"SELECT * FROM {sources[(a, table)]}" for a in ([images_from] if table in SHARED_TABLES else aliases)
                 if (a, table) in present]
        body = " UNION ALL BY NAME ".join(parts) if parts else f"SELECT * FROM {aliases[0]}.{table} LIMIT 0"
        if table in DEDUPLICATED_TABLES:
            body = f"SELECT DISTINCT * FROM ({body})"
        if runs is not None and table in RUN_TABLES:
            body = f"SELECT * FROM ({body}) WHERE run_id IN (SELECT run_id FROM declared_runs)"
        con.execute(f"CREATE TEMP VIEW {table} AS {body}")
    install_macros(con, temporary=True)
    for kind, run_id, copies in con.execute("SELECT * FROM duplicate_runs()").fetchall():
        con.close()
        raise FeatstoreError(f"{kind} {run_id!r} is held by {copies} of the databases; query them one at a time "
                             f"or fold them with ",
                             Step("fs.merge(db, sources)", "merge"), " (which checks that both are the same)")
    return con


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """Everything inside commits together or not at all (the one place featstore begins a transaction)."""
    con.execute("BEGIN")
    try:
        yield con
    except BaseException as e:
        con.execute("ROLLBACK")
        if isinstance(e, duckdb.IOException):
            raise _unwritable(con, e) from e
        raise
    try:
        con.execute("COMMIT")
    except (duckdb.IOException, duckdb.TransactionException) as e:  # a full disk, a file size limit
        raise _unwritable(con, e) from e


def _unwritable(con: duckdb.DuckDBPyConnection, e: duckdb.Error) -> FeatstoreError:
    path = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    return FeatstoreError(f"cannot write database {path[0] if path else ''}: {str(e).splitlines()[0]}; nothing of "
                          f"this job was committed (free some space and rerun it)")


def _insert(con: duckdb.DuckDBPyConnection, table: str, data: pa.Table) -> None:
    """Bulk-insert an Arrow table by column name, without a round trip through files; columns the table has and
    `data` lacks get their default (NULL)."""
    con.register("_featstore_incoming", data)
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _featstore_incoming")
    finally:
        con.unregister("_featstore_incoming")


def _insert_records(con: duckdb.DuckDBPyConnection, table: str, records: Sequence[object],
                    **extra: object) -> None:
    """Insert dataclass records by column name: each field a column (dicts as JSON), or the columns a record
    spells itself (`ProbeRun.columns`: its identity's parts), plus constant `extra` columns (the key a record of a
    child table leaves to its parent)."""
    import pyarrow as pa

    from featstore.records import ProbeRun

    if not records:
        return
    rows = [r.columns() if isinstance(r, ProbeRun) else {f.name: getattr(r, f.name) for f in fields(r)}
            for r in records]
    columns = {name: [_column_value(row[name]) for row in rows] for name in rows[0]}
    columns.update({name: [value] * len(records) for name, value in extra.items()})
    _insert(con, table, pa.table(columns))


def _column_value(value: object) -> object:
    return json.dumps(value) if isinstance(value, dict) else value


def check_image_set(con: duckdb.DuckDBPyConnection, path: Path, fingerprint: str) -> dict[str, str]:
    """The DB's `meta` rows (empty: it holds no image set yet); one of another image set is refused: what every
    command that writes results of a store's images into a database checks (probe, cka)."""
    rows = dict(con.execute("SELECT key, value FROM meta").fetchall())
    if rows and rows.get("dataset") != fingerprint:
        raise FeatstoreError(f"database {path} holds another image set ({rows.get('source')}); "
                             f"one database per image set: pass a new ", Name("db"))
    return rows


def check_dataset(con: duckdb.DuckDBPyConnection, path: Path, info: DatasetInfo) -> bool:
    """True when the DB already holds this image set and split; a different one is refused. False when empty."""
    rows = check_image_set(con, path, info.fingerprint)
    if not rows:
        return False
    if int(rows.get("split_seed", 0)) != info.split_seed:
        raise FeatstoreError(f"database {path} splits its images with split seed {rows.get('split_seed')}; pass ",
                             Name("split_seed", rows.get("split_seed")), " (", Name("seed"),
                             " is the probe seed) or a new ", Name("db"))
    if float(rows.get("val_frac", 0.1)) != info.val_frac:
        raise FeatstoreError(f"database {path} records a val fraction of {rows.get('val_frac')} in its images "
                             f"table; probe with that value or use a new ", Name("db"))
    return True


def model_source(con: duckdb.DuckDBPyConnection, model: str) -> ModelSource | None:
    """The store a model's rows in this database come from (None: the database holds no rows of it). A database
    written before sources were recorded tells what its anchors table and its runs' weights say."""
    from featstore.records import ModelSource

    rows = con.execute("SELECT model, store, images, weights_id, anchors FROM model_sources WHERE model = ?",
                       [model]).fetchall()  # read to the end: a half-read result blocks the connection's next query
    if rows:
        return ModelSource(*rows[0])
    anchors = con.execute("SELECT string_agg(name || ':' || dim, ' ' ORDER BY anchor) FROM anchors WHERE model = ?",
                          [model]).fetchall()[0][0]
    weights = con.execute("SELECT min(params->>'weights_id') FROM runs WHERE model = ?", [model]).fetchall()[0][0]
    return ModelSource(model, "", "", weights or "", anchors) if anchors or weights else None


def check_source(con: duckdb.DuckDBPyConnection, path: Path, source: ModelSource) -> None:
    """Refuse, in one line naming what differs, a probe of `source.model` from a store whose image table, weights
    or anchors are not those whose rows the database already holds: one database, one store per model."""
    held = model_source(con, source.model)
    differs = held.differences(source) if held else []
    if differs:
        raise FeatstoreError(f"database {path} holds model {source.model!r} probed from another store "
                             f"({held.store or 'an older featstore'}): {source.store} has {'; '.join(differs)}; "
                             f"one database per store and model: pass a new ", Name("db"), " (or ", Name("name"),
                             " the other build)")


def register_source(con: duckdb.DuckDBPyConnection, source: ModelSource) -> None:
    with transaction(con):
        con.execute("DELETE FROM model_sources WHERE model = ?", [source.model])
        _insert_records(con, "model_sources", [source])


def probe_versions(con: duckdb.DuckDBPyConnection, model: str, probe_name: str) -> set[str]:
    """The stored-weights versions of one probe name that this database's runs of a model name."""
    return {v for (v,) in con.execute("SELECT DISTINCT probe_version FROM runs WHERE model = ? AND probe_name = ?",
                                      [model, probe_name]).fetchall() if v}


def run_weights(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, str, str]]:
    """Every probe run's (run_id, model, probe name, stored-weights version), for `featstore verify --db`."""
    return con.execute("SELECT run_id, model, probe_name, probe_version FROM runs WHERE probe_version IS NOT NULL "
                       "ORDER BY run_id").fetchall()


def run_params(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> dict[str, tuple[str, str, str]]:
    """Run id -> (params JSON, probe name, stored-weights version) of those of `run_ids` the database holds."""
    rows = con.execute("SELECT run_id, params, probe_name, probe_version FROM runs WHERE list_contains(?, run_id)",
                       [run_ids]).fetchall()
    return {run_id: (params, name, version) for run_id, params, name, version in rows}


def _set_meta(con: duckdb.DuckDBPyConnection, items: dict[str, str]) -> None:
    con.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(items.items()))


def register_images(con: duckdb.DuckDBPyConnection, info: DatasetInfo, image_id: np.ndarray, path: np.ndarray,
                    label: np.ndarray, split: np.ndarray, class_names: list[str] | None = None) -> None:
    import numpy as np
    import pyarrow as pa

    names = [class_names[y] if class_names and 0 <= y < len(class_names) else None for y in label.tolist()]
    table = pa.table({"dataset": pa.array([info.fingerprint] * len(image_id)), "image_id": image_id,
                      "path": pa.array(path.tolist(), pa.string()), "label": label.astype(np.int32),
                      "split": pa.array(split.tolist(), pa.string()), "class_name": pa.array(names, pa.string())})
    with transaction(con):
        con.execute("DELETE FROM images")
        _insert(con, "images", table)
        _set_meta(con, {"dataset": info.fingerprint, "source": info.source, "store": info.store,
                        "split_seed": str(info.split_seed), "val_frac": str(info.val_frac)})


def record_image_source(db: str | Path, root: str | Path, class_names: list[str]) -> None:
    """Note where the image files live and what the labels are called, so a report can show thumbnails
    and class names from the database alone."""
    con = connect(db)
    try:
        _set_meta(con, {"image_root": str(Path(root).resolve()), "class_names": json.dumps(list(class_names))})
    finally:
        con.close()


def register_anchors(con: duckdb.DuckDBPyConnection, model: str, anchors: Sequence) -> None:
    """The anchors of a model (featstore.nets.anchors.Anchor records), replacing an earlier list."""
    import pyarrow as pa

    table = pa.table({"model": [model] * len(anchors), "anchor": [a.index for a in anchors],
                      "name": [a.name for a in anchors], "module": [a.module for a in anchors],
                      "dim": [a.dim for a in anchors], "depth_frac": [a.depth_frac for a in anchors],
                      "block": pa.array([getattr(a, "block", None) for a in anchors], pa.int32()),
                      "tap": pa.array([getattr(a, "tap", None) for a in anchors], pa.string())})
    with transaction(con):
        con.execute("DELETE FROM anchors WHERE model = ?", [model])
        _insert(con, "anchors", table)


def replace_model_outputs(con: duckdb.DuckDBPyConnection, model: str, view: str, image_id: np.ndarray,
                          pred: np.ndarray, conf: np.ndarray) -> None:
    import numpy as np
    import pyarrow as pa

    table = pa.table({"model": pa.array([model] * len(image_id)), "view": pa.array([view] * len(image_id)),
                      "image_id": image_id, "pred": pred.astype(np.int32), "conf": conf.astype(np.float32)})
    with transaction(con):
        con.execute("DELETE FROM model_outputs WHERE model = ? AND view = ?", [model, view])
        _insert(con, "model_outputs", table)


def replace_costs(con: duckdb.DuckDBPyConnection, model: str, cost: ModelCost) -> None:
    """Store one measurement, replacing an earlier one of the same model, device and batch size."""
    import pyarrow as pa

    key = {"model": model, "device": cost.device, "batch_size": cost.batch_size}
    measured_at = datetime.now()
    with transaction(con):
        for table in ("anchor_costs", "model_costs"):
            con.execute(f"DELETE FROM {table} WHERE model = ? AND device = ? AND batch_size = ?", list(key.values()))
        _insert_records(con, "anchor_costs", cost.anchors, **key, measured_at=measured_at)
        _insert(con, "model_costs", pa.table({**{k: [v] for k, v in key.items()}, "ms": [cost.ms],
                                              "flops": [cost.flops], "measured_at": [measured_at]}))


def write_circuit(con: duckdb.DuckDBPyConnection, run: CircuitRun, edges: list[tuple[str, str, int, int]],
                  scores: np.ndarray) -> None:
    """Replace one circuit run and its edge scores (fixed edge order) in a single transaction."""
    import numpy as np
    import pyarrow as pa

    n = len(edges)
    table = pa.table({"run_id": pa.array([run.run_id] * n), "edge": np.arange(n, dtype=np.int32),
                      "src": pa.array([e[0] for e in edges]), "dst": pa.array([e[1] for e in edges]),
                      "src_layer": np.array([e[2] for e in edges], dtype=np.int16),
                      "dst_layer": np.array([e[3] for e in edges], dtype=np.int16),
                      "score": np.asarray(scores, dtype=np.float64)})
    with transaction(con):
        con.execute("DELETE FROM edges WHERE run_id = ?", [run.run_id])
        con.execute("DELETE FROM circuit_runs WHERE run_id = ?", [run.run_id])
        _insert_records(con, "circuit_runs", [run])
        _insert(con, "edges", table)


def read_edges(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[list[str], list[str], np.ndarray]:
    """One circuit run's edges (src, dst names) and scores in the fixed edge order."""
    import numpy as np

    rows = con.execute("SELECT src, dst, score FROM edges WHERE run_id = ? ORDER BY edge", [run_id]).fetchall()
    return [r[0] for r in rows], [r[1] for r in rows], np.array([r[2] for r in rows], dtype=float)


def replace_graph_css(con: duckdb.DuckDBPyConnection, pairs: list[tuple[str, str]], top_n: int,
                      rows: list[tuple]) -> None:
    """Replace the stored graph distances of these (ID, OOD) pairs at this top_n; rows are (id_run, ood_run,
    distance, top_n, value, n_edges)."""
    import pyarrow as pa

    columns = ("id_run", "ood_run", "distance", "top_n", "value", "n_edges")
    with transaction(con):
        con.executemany("DELETE FROM css_graph WHERE id_run = ? AND ood_run = ? AND top_n = ?",
                        [(a, b, top_n) for a, b in pairs])
        if rows:
            _insert(con, "css_graph", pa.table({**{c: [r[i] for r in rows] for i, c in enumerate(columns)},
                                                "created_at": [datetime.now()] * len(rows)}))


def replace_zoo_runs(con: duckdb.DuckDBPyConnection, rows: Sequence[ZooRow]) -> None:
    """Replace the zoo rows of these (study, model, image set)s."""
    with transaction(con):
        con.executemany("DELETE FROM zoo_runs WHERE study = ? AND model = ? AND dataset = ?",
                        [(r.study, r.model, r.dataset) for r in rows])
        _insert_records(con, "zoo_runs", rows)


def write_runs(con: duckdb.DuckDBPyConnection, runs: Sequence[RunRows]) -> None:
    """Replace the rows of several runs (the views one set of probes predicts) in a single transaction."""
    with transaction(con):
        for rows in runs:
            _replace_run(con, rows)


def _replace_run(con: duckdb.DuckDBPyConnection, rows: RunRows) -> None:
    import numpy as np
    import pyarrow as pa

    n, a = rows.pred.shape
    run_id = rows.run.run_id
    predictions = pa.table({
        "run_id": pa.DictionaryArray.from_arrays(np.zeros(n * a, dtype=np.int32), pa.array([run_id])),
        "image_id": np.repeat(rows.image_id.astype(np.int64), a),
        "anchor": np.tile(np.arange(a, dtype=np.int16), n),
        "pred": rows.pred.astype(np.int32).ravel(),
        "conf": rows.conf.astype(np.float32).ravel(),
    })
    for table in ("predictions", "decisions", "folds", "probe_fits", "gate_scores", "gates", "runs"):
        con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])  # a gate learnt the old predictions
    _insert_records(con, "runs", [rows.run])  # its identity and C in their columns, as the record has them
    _insert(con, "predictions", predictions)
    if rows.fold is not None:
        _insert(con, "folds", pa.table({"run_id": pa.array([run_id] * n),
                                        "image_id": rows.image_id.astype(np.int64),
                                        "fold": rows.fold.astype(np.int16)}))
    con.execute(sql_text("derive_decisions"), {"run_id": run_id})
    if rows.fits:
        fit = [r for _, _, r in rows.fits]
        _insert(con, "probe_fits", pa.table({
            "run_id": [run_id] * len(fit), "fold": pa.array([f for f, _, _ in rows.fits], pa.int16()),
            "anchor": pa.array([anchor for _, anchor, _ in rows.fits], pa.int16()),
            **{c: [r.get(c) for r in fit] for c in ("val_accuracy", "epochs", "converged", "train_loss", "val_loss")},
            "C": pa.array([r.get("C") for r in fit], pa.float64()), "info": [json.dumps(r) for r in fit]}))


def write_gate(con: duckdb.DuckDBPyConnection, scores: GateScores) -> None:
    """Replace one run's learned exit gate and its scores in a single transaction."""
    import numpy as np
    import pyarrow as pa

    n, a = scores.score.shape
    run_id = scores.gate.run_id
    table = pa.table({"run_id": pa.array([run_id] * (n * a)),
                      "image_id": np.repeat(scores.image_id.astype(np.int64), a),
                      "anchor": np.tile(np.arange(a, dtype=np.int16), n),
                      "score": scores.score.astype(np.float32).ravel(),
                      "learnt": np.repeat(scores.learnt.astype(bool), a)})
    with transaction(con):
        for name in ("gate_scores", "gates"):
            con.execute(f"DELETE FROM {name} WHERE run_id = ?", [run_id])
        _insert_records(con, "gates", [scores.gate])
        _insert(con, "gate_scores", table)


def replace_anchor_cka(con: duckdb.DuckDBPyConnection, model: str, view: str, estimator: str, matrix: np.ndarray,
                       n_images: int) -> None:
    """Keep one CKA matrix of a model's anchors (`featstore cka`), every ordered pair (a, b) so that a query
    filters by either side (NaN, an anchor without variance, as NULL), replacing the same model, view and
    estimator's."""
    import numpy as np
    import pyarrow as pa

    size = len(matrix)
    a, b = np.divmod(np.arange(size * size), size)
    values = np.asarray(matrix, dtype=np.float64).ravel()
    rows = len(values)
    table = pa.table({"model": [model] * rows, "view": [view] * rows, "estimator": [estimator] * rows,
                      "anchor_a": a.astype(np.int16), "anchor_b": b.astype(np.int16),
                      "cka": pa.array(values, pa.float64(), mask=np.isnan(values)),
                      "n_images": pa.array([n_images] * rows, pa.int32()), "created_at": [datetime.now()] * rows})
    with transaction(con):
        con.execute("DELETE FROM anchor_cka WHERE model = ? AND view = ? AND estimator = ?", [model, view, estimator])
        _insert(con, "anchor_cka", table)
