"""`featstore export`: a database's results as Parquet files that any engine reads (DuckDB, Polars, Spark).

Per-image results are partitioned by run (hive layout `run_id=<url-encoded id>/`, which DuckDB and Polars decode
back into a column); the small tables are one file each. Every table is written, an empty one as one file of no
rows with its columns, so a `**/*.parquet` glob always finds its schema. The folder appears complete or not at
all: it is written beside its final name (`<to>.partial/`, locked while it is written, so that a second export to
the same target is refused at once) and renamed into place. A symlinked target is followed; a `<to>.partial` that
featstore did not begin is refused, never deleted. The database is read on a sealed connection that may write under
`<to>.partial/` and nowhere else (`fsdb.seal`): a view or macro of the file reaches no other file.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from featstore.analytics import db as fsdb
from featstore.errors import FeatstoreError, Name
from featstore.store.locks import locked

# per-image (per-edge) rows, one folder per run; every other table of the schema is one file
PARTITIONED = ("predictions", "decisions", "folds", "edges", "gate_scores")
MARKER = ".featstore-export"  # what says that a <to>.partial folder is an export featstore began


def export(db: str | Path, to: str | Path) -> list[Path]:
    """Write every table of `db` under `to` (which must not exist yet, or be an empty folder, or a symlink to
    one); returns what was written."""
    to = Path(os.path.realpath(to)) if Path(to).is_symlink() else Path(to)
    _check_target(to)
    fsdb.connect(db, read_only=True).close()  # a featstore database, before anything is created
    partial = to.with_name(to.name + ".partial")
    try:
        partial.mkdir(parents=True)
        ours = True
    except FileExistsError:
        ours = (partial / MARKER).is_file()
        if not partial.is_dir() or partial.is_symlink():
            raise FeatstoreError(f"{partial} exists and is not a folder featstore export began; move it away or "
                                 f"export to another ", Name("out")) from None
    try:
        _export_under_lock(db, to, partial, ours)
    except FileNotFoundError as e:  # the other export renamed its finished folder away meanwhile
        if partial.exists() or not to.exists():
            raise
        raise FeatstoreError(f"{to} was written by another export meanwhile; export into a new folder") from e
    return sorted(p for p in to.iterdir())


def _export_under_lock(db: str | Path, to: Path, partial: Path, ours: bool) -> None:
    with locked(partial, wait=False, what=f"export folder {partial}", instead=("or export to another ", Name("out"))):
        marker = partial / MARKER
        if not marker.is_file():
            if any(partial.iterdir()):
                raise FeatstoreError(f"{partial} exists and holds files featstore export did not write; move it "
                                     f"away or export to another ", Name("out"))
            marker.write_text(f"featstore export of {Path(db).resolve()}\n")
        for leftover in [p for p in partial.iterdir() if p.name != MARKER]:  # an interrupted export's own files
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        try:
            _check_target(to)  # another export may have finished it since
            _write_tables(db, partial)
            marker.unlink()
            if to.exists():
                to.rmdir()
            partial.rename(to)
        except BaseException:
            if ours:  # featstore's own folder, held under its lock
                shutil.rmtree(partial, ignore_errors=True)
            else:  # an empty folder someone made: left as it was found
                for p in partial.iterdir():
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            raise


def _check_target(to: Path) -> None:
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise FeatstoreError(f"{to} already exists and is not an empty folder; export into a new folder")


def _write_tables(db: str | Path, folder: Path) -> None:
    """COPY every table into `folder`, on a connection that reaches no other file (`fsdb.seal`)."""
    folder = folder.resolve()
    con = fsdb.connect(db, read_only=True, reach=[folder])
    try:
        for table in fsdb.schema_tables():
            if table not in PARTITIONED:
                con.execute(f"COPY {table} TO {_literal(folder / f'{table}.parquet')} (FORMAT parquet)")
            elif con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]:
                con.execute(f"COPY {table} TO {_literal(folder / table)} (FORMAT parquet, PARTITION_BY (run_id))")
            else:  # no run to partition by: one file of no rows, with the table's columns
                (folder / table).mkdir()
                con.execute(f"COPY {table} TO {_literal(folder / table / 'data_0.parquet')} (FORMAT parquet)")
    finally:
        con.close()


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"
