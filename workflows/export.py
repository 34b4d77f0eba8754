"""`featstore export`: a database's results as Parquet files that any engine reads (DuckDB, Polars, Spark).

Per-image results are partitioned by run (hive layout `run_id=<url-encoded id>/`, which DuckDB and Polars decode
back into a column); the small tables are one file each. The folder appears complete or not at all: it is
written beside its final name and renamed into place.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from featstore.analytics import db as fsdb
from featstore.errors import FeatstoreError

# per-image (per-edge) rows, one folder per run
PARTITIONED = ("predictions", "decisions", "folds", "edges", "gate_scores")
WHOLE = ("runs", "images", "anchors", "model_outputs", "probe_fits", "anchor_costs", "model_costs", "circuit_runs",
         "css_graph", "zoo_runs", "gates", "meta")


def export(db: str | Path, to: str | Path) -> list[Path]:
    """Write every table of `db` under `to` (which must not exist yet, or be empty); returns what was written."""
    to = Path(to)
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise FeatstoreError(f"{to} already exists and is not an empty folder; export into a new folder")
    partial = to.with_name(to.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    con = fsdb.connect(db, read_only=True, sealed=False)
    try:
        for table in PARTITIONED:
            if con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]:
                con.execute(f"COPY {table} TO {_literal(partial / table)} (FORMAT parquet, PARTITION_BY (run_id))")
        for table in WHOLE:
            con.execute(f"COPY {table} TO {_literal(partial / f'{table}.parquet')} (FORMAT parquet)")
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        con.close()
    if to.exists():
        to.rmdir()
    partial.rename(to)
    return sorted(p for p in to.iterdir())


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"
