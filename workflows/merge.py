"""`featstore merge`: fold the databases of jobs that ran at the same time (each its own --db) into one.

Jobs on a cluster cannot share one DuckDB file (one writer at a time), so each writes a database of its own and
`merge` folds them in afterwards. All sources go in one transaction of the target: all or nothing. A source is
refused (one line, nothing written, no new target left behind) when it is another experiment — other images,
another split, other anchors or weights for a model — or when it holds a result under a key the target already
holds with other content (a run id, a circuit run, a cost measurement, a learned gate, a model's anchor CKA
matrix, ...), unless `replace` lets the source's result win; a run's learned gate goes with the run it learnt
from. Merging the same source twice changes nothing: equal results replace each other. A target that is another
program's DuckDB file is refused.
The SQL is in sql/merge_*.sql.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

from featstore.analytics import db as fsdb
from featstore.errors import FeatstoreError, Name, Step

SPLIT_KEYS = ("dataset", "split_seed", "val_frac")  # meta rows that make two databases one experiment


@dataclass(frozen=True)
class MergeResult:
    target: Path
    sources: list[Path]
    runs: int  # probe runs in the target afterwards
    circuit_runs: int
    replaced: list[str]  # "what key" of results the sources replaced with other content (replace only)


def merge(target: str | Path, sources: Sequence[str | Path], replace: bool = False) -> MergeResult:
    """Fold every source into `target` (created if missing) in one transaction; see the module docstring."""
    target, paths = Path(target), [Path(s) for s in sources]
    if not paths:
        raise FeatstoreError("name at least one source database to fold into ", Name("db"))
    for p in paths:
        if not p.is_file():
            raise FeatstoreError(f"source database {p} does not exist")
        if target.exists() and p.resolve() == target.resolve():
            raise FeatstoreError(f"source {p} is the target database itself; name other sources")
    for p in paths:  # each source is a featstore database (checked with its own sealed read-only connection)
        fsdb.connect(p, read_only=True).close()
    creating = not target.exists()
    con = fsdb.connect(target, wait_s=fsdb.WRITE_WAIT_S, reach=fsdb.database_files(paths))  # the sources only
    replaced: list[str] = []
    try:
        with fsdb.transaction(con):
            for p in paths:
                con.execute("ATTACH ? AS src (READ_ONLY)", [str(p.resolve())])
                try:
                    replaced += _fold(con, p, replace)
                finally:
                    con.execute("DETACH src")
        runs = con.execute("SELECT count(*) FROM runs").fetchone()[0]
        circuits = con.execute("SELECT count(*) FROM circuit_runs").fetchone()[0]
    except BaseException:
        if creating:  # a target this merge created and could not fill: not left behind, empty
            fsdb.remove_empty(con, target)
        raise
    finally:
        con.close()
    return MergeResult(target, paths, runs, circuits, replaced)


def _fold(con: duckdb.DuckDBPyConnection, source: Path, replace: bool) -> list[str]:
    """One attached source into the target, or a FeatstoreError naming the source and what differs."""
    tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'src'")
              .fetchall()}
    missing = sorted(set(fsdb.schema_tables()) - tables)
    if missing:
        raise FeatstoreError(f"source {source} predates table {missing[0]} (an older featstore wrote it); open it "
                             f"once with this version's ", Step("fs.probe(...)", "probe"), " or pass another source")
    mine = dict(con.execute("SELECT key, value FROM meta").fetchall())
    theirs = dict(con.execute("SELECT key, value FROM src.meta").fetchall())
    if mine.get("dataset") and theirs.get("dataset"):
        for key in SPLIT_KEYS:
            if mine.get(key) != theirs.get(key):
                raise FeatstoreError(f"source {source} holds another experiment: its {key} is {theirs.get(key)} "
                                     f"where the target's is {mine.get(key)}; merge databases of one image set "
                                     f"and split only")
    for what, detail in con.execute(fsdb.sql_text("merge_disagreements")).fetchall():
        raise FeatstoreError(f"source {source} disagrees with the target on its {what}: {detail}; merge databases "
                             f"of one image set and one anchor list per model")
    conflicts = [f"{what} {key}" for what, key in con.execute(fsdb.sql_text("merge_conflicts")).fetchall()]
    if conflicts and not replace:
        more = f" (and {len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        raise FeatstoreError(f"source {source} holds {conflicts[0]}{more} with other content than the target; "
                             f"pass ", Name("replace"), " to keep the source's, or leave that source out")
    con.execute(fsdb.sql_text("merge_rows"))
    con.execute(fsdb.sql_text("migrate_runs"))  # a source older than the identity columns brought runs without them
    return conflicts
