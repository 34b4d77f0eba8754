"""The DuckDB side: opening the database (read-only for queries), its schema, and atomic run writes.

All SQL text lives in `sql/`; this module only loads and runs it. Writes of one run happen in a single
transaction, so a killed `featstore probe` leaves either the old rows of that run or the new ones.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from featstore.errors import FeatstoreError

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
    uses = {name: {other for other in texts if other != name and re.search(rf"\b{other}\b", body)}
            for name, body in texts.items()}
    order: list[str] = []
    while uses:
        ready = sorted(name for name, needs in uses.items() if needs <= set(order))
        if not ready:
            raise RuntimeError(f"sql/: circular definitions among {', '.join(sorted(uses))}")
        order += ready
        uses = {name: needs for name, needs in uses.items() if name not in ready}
    return tuple(order)


MACROS = macro_order()


def install_macros(con: duckdb.DuckDBPyConnection, temporary: bool = False) -> None:
    """Create every view and macro of this featstore version. Write connections persist them in the file (a
    plain DuckDB client can call them); read-only ones create them as TEMP objects, which shadow whatever an
    older featstore left in the file, so every client of one version runs the same definitions."""
    for name in MACROS:
        text = sql_text(name)
        if temporary:
            text = _DEFINITION.sub(lambda m: f"CREATE OR REPLACE TEMP {m.group(1)} {m.group(2)}", text, count=1)
        con.execute(text)


def _stand_in_for_newer_tables(con: duckdb.DuckDBPyConnection) -> None:
    """A featstore file opened read-only that predates a table (say css_graph) gets an empty TEMP one, so the
    macros that read it still bind; files without featstore's `meta` table are left as they are."""
    existing = {row[0] for row in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    if "meta" not in existing:
        return
    for statement in _without_comments(sql_text("schema")).split(";"):
        found = re.search(r"CREATE TABLE IF NOT EXISTS (\w+)", statement)
        if found and found.group(1) not in existing:
            con.execute(statement.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))


# A read-only connection must not be able to write anything anywhere: no other file (ATTACH, COPY, EXPORT,
# read_csv), no extension download or load, and no statement that switches these settings back on.
READ_ONLY_CONFIG = {"enable_external_access": False, "autoload_known_extensions": False,
                    "autoinstall_known_extensions": False, "lock_configuration": True}


def connect(path: str | Path, read_only: bool = False, wait_s: float = 0.0) -> duckdb.DuckDBPyConnection:
    """Open a featstore database; a lock held by another process becomes a one-line error, after retrying for
    `wait_s` seconds (readers such as `featstore sql` hold it only for one query).

    Read-only connections are sealed by DuckDB itself (see READ_ONLY_CONFIG), so that no SQL text a user types
    into `featstore sql` can change the database or the file system."""
    path = Path(path)
    if read_only and not path.exists():
        raise FeatstoreError(f"no database at {path}; fill one with `featstore probe --db {path}`")
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                con = duckdb.connect(str(path), read_only=read_only, config=READ_ONLY_CONFIG if read_only else {})
                break
            except duckdb.IOException as e:
                if "lock" not in str(e).lower() or time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
    except duckdb.IOException as e:
        msg = str(e)
        if "lock" in msg.lower():
            holder = msg.split("Conflicting lock is held in", 1)[-1].split("\n")[0].strip() if "held" in msg else ""
            raise FeatstoreError(f"database {path} is in use by another process ({holder or 'locked'}); "
                                 f"close it or pass another --db") from e
        raise FeatstoreError(f"cannot open database {path}: {msg.splitlines()[0]}") from e
    except duckdb.Error as e:
        raise FeatstoreError(f"{path} is not a DuckDB database ({str(e).splitlines()[0]}); "
                             f"pass another --db") from e
    if not read_only:
        con.execute(sql_text("schema"))
    else:
        _stand_in_for_newer_tables(con)
    try:
        install_macros(con, temporary=read_only)
    except duckdb.CatalogException as e:
        con.close()
        if not read_only:  # the schema was just created: a macro that does not bind is featstore's own bug
            raise
        raise FeatstoreError(f"{path} is not a featstore database ({str(e).splitlines()[0]}); pass the --db "
                             f"that featstore probe filled") from e
    return con


def _insert(con: duckdb.DuckDBPyConnection, table: str, data: pa.Table) -> None:
    """Bulk-insert an Arrow table (columns in the table's order) without a round trip through files."""
    con.register("_featstore_incoming", data)
    try:
        con.execute(f"INSERT INTO {table} SELECT * FROM _featstore_incoming")
    finally:
        con.unregister("_featstore_incoming")


@dataclass
class DatasetInfo:
    fingerprint: str
    source: str
    store: str
    split_seed: int
    val_frac: float = 0.1


def check_dataset(con: duckdb.DuckDBPyConnection, path: Path, info: DatasetInfo) -> bool:
    """True when the DB already holds this image set; a different one is refused. False when empty."""
    rows = dict(con.execute("SELECT key, value FROM meta").fetchall())
    if not rows:
        return False
    if rows.get("dataset") != info.fingerprint:
        raise FeatstoreError(f"database {path} holds another image set ({rows.get('source')}); "
                             f"one database per image set: pass a new --db")
    if int(rows.get("split_seed", 0)) != info.split_seed:
        raise FeatstoreError(f"database {path} splits its images with split seed {rows.get('split_seed')}; pass "
                             f"--split-seed {rows.get('split_seed')} (--seed is the probe seed) or a new --db")
    if float(rows.get("val_frac", 0.1)) != info.val_frac:
        raise FeatstoreError(f"database {path} records a val fraction of {rows.get('val_frac')} in its images "
                             f"table; probe with that value or use a new --db")
    return True


def register_images(con: duckdb.DuckDBPyConnection, info: DatasetInfo, image_id: np.ndarray, path: np.ndarray,
                    label: np.ndarray, split: np.ndarray, class_names: list[str] | None = None) -> None:
    names = [class_names[y] if class_names and 0 <= y < len(class_names) else None for y in label.tolist()]
    table = pa.table({"dataset": pa.array([info.fingerprint] * len(image_id)), "image_id": image_id,
                      "path": pa.array(path.tolist(), pa.string()), "label": label.astype(np.int32),
                      "split": pa.array(split.tolist(), pa.string()), "class_name": pa.array(names, pa.string())})
    con.execute("BEGIN")
    con.execute("DELETE FROM images")
    _insert(con, "images", table)
    con.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                    [("dataset", info.fingerprint), ("source", info.source), ("store", info.store),
                     ("split_seed", str(info.split_seed)), ("val_frac", str(info.val_frac))])
    con.execute("COMMIT")


def record_image_source(db: str | Path, root: str | Path, class_names: list[str]) -> None:
    """Note where the image files live and what the labels are called, so a report can show thumbnails
    and class names from the database alone."""
    con = connect(db)
    try:
        con.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                        [("image_root", str(Path(root).resolve())), ("class_names", json.dumps(list(class_names)))])
    finally:
        con.close()


def register_anchors(con: duckdb.DuckDBPyConnection, model: str, anchors: list) -> None:
    rows = [(model, a.index, a.name, a.module, a.dim, a.depth_frac, getattr(a, "block", None), getattr(a, "tap", None))
            for a in anchors]
    con.execute("BEGIN")
    con.execute("DELETE FROM anchors WHERE model = ?", [model])
    con.executemany("INSERT INTO anchors VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    con.execute("COMMIT")


def replace_model_outputs(con: duckdb.DuckDBPyConnection, model: str, view: str, image_id: np.ndarray,
                          pred: np.ndarray, conf: np.ndarray) -> None:
    table = pa.table({"model": pa.array([model] * len(image_id)), "view": pa.array([view] * len(image_id)),
                      "image_id": image_id, "pred": pred.astype(np.int32), "conf": conf.astype(np.float32)})
    con.execute("BEGIN")
    con.execute("DELETE FROM model_outputs WHERE model = ? AND view = ?", [model, view])
    _insert(con, "model_outputs", table)
    con.execute("COMMIT")


def replace_costs(con: duckdb.DuckDBPyConnection, model: str, cost) -> None:
    """Store one `featstore.cost.ModelCost`, replacing an earlier measurement of the same model, device, batch."""
    key = [model, cost.device, cost.batch_size]
    con.execute("BEGIN")
    for table in ("anchor_costs", "model_costs"):
        con.execute(f"DELETE FROM {table} WHERE model = ? AND device = ? AND batch_size = ?", key)
    con.executemany("INSERT INTO anchor_costs VALUES (?, ?, ?, ?, ?, ?, ?, ?, now())",
                    [key + [a.anchor, a.ms, a.flops, a.probe_ms, a.probe_flops] for a in cost.anchors])
    con.execute("INSERT INTO model_costs VALUES (?, ?, ?, ?, ?, now())", key + [cost.ms, cost.flops])
    con.execute("COMMIT")


def write_circuit(con: duckdb.DuckDBPyConnection, run: dict, edges: list[tuple[str, str, int, int]],
                  scores: np.ndarray) -> None:
    """Replace one circuit run and its edge scores (fixed edge order) in a single transaction."""
    n = len(edges)
    table = pa.table({"run_id": pa.array([run["run_id"]] * n), "edge": np.arange(n, dtype=np.int32),
                      "src": pa.array([e[0] for e in edges]), "dst": pa.array([e[1] for e in edges]),
                      "src_layer": np.array([e[2] for e in edges], dtype=np.int16),
                      "dst_layer": np.array([e[3] for e in edges], dtype=np.int16),
                      "score": np.asarray(scores, dtype=np.float64)})
    try:
        con.execute("BEGIN")
        con.execute("DELETE FROM edges WHERE run_id = ?", [run["run_id"]])
        con.execute("DELETE FROM circuit_runs WHERE run_id = ?", [run["run_id"]])
        con.execute("INSERT INTO circuit_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now())",
                    [run["run_id"], run["model"], run["view"], run["layers"], run["heads"], run["ig_steps"],
                     run["n_images"], n, json.dumps(run.get("params", {}))])
        _insert(con, "edges", table)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def read_edges(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[list[str], list[str], np.ndarray]:
    """One circuit run's edges (src, dst names) and scores in the fixed edge order."""
    rows = con.execute("SELECT src, dst, score FROM edges WHERE run_id = ? ORDER BY edge", [run_id]).fetchall()
    return [r[0] for r in rows], [r[1] for r in rows], np.array([r[2] for r in rows], dtype=float)


def replace_graph_css(con: duckdb.DuckDBPyConnection, pairs: list[tuple[str, str]], top_n: int,
                      rows: list[tuple]) -> None:
    """Replace the stored graph distances of these (ID, OOD) pairs at this top_n."""
    con.execute("BEGIN")
    con.executemany("DELETE FROM css_graph WHERE id_run = ? AND ood_run = ? AND top_n = ?",
                    [(a, b, top_n) for a, b in pairs])
    con.executemany("INSERT INTO css_graph VALUES (?, ?, ?, ?, ?, ?, now())", rows)
    con.execute("COMMIT")


def replace_zoo_runs(con: duckdb.DuckDBPyConnection, study: str, rows: list[tuple]) -> None:
    """Replace the zoo rows (model, dataset, role, accuracy, n_images, circuit_run) of these models in `study`."""
    con.execute("BEGIN")
    con.executemany("DELETE FROM zoo_runs WHERE study = ? AND model = ? AND dataset = ?",
                    [(study, r[0], r[1]) for r in rows])
    con.executemany("INSERT INTO zoo_runs VALUES (?, ?, ?, ?, ?, ?, ?, now())", [(study, *r) for r in rows])
    con.execute("COMMIT")


@dataclass
class RunRows:
    """Everything one run writes: its `runs` row, predictions [n, anchors], folds and per-anchor fits."""

    run: dict
    image_id: np.ndarray  # [n]
    pred: np.ndarray  # [n, A] int
    conf: np.ndarray  # [n, A] float
    fold: np.ndarray | None  # [n] for cross-fit runs
    fits: list[tuple[int, int, dict]]  # (fold, anchor, fit record: epochs, converged, losses, ... as JSON)


def write_run(con: duckdb.DuckDBPyConnection, rows: RunRows) -> None:
    """Replace one run's rows in a single transaction."""
    write_runs(con, [rows])


def write_runs(con: duckdb.DuckDBPyConnection, runs: list[RunRows]) -> None:
    """Replace the rows of several runs (the views one set of probes predicts) in a single transaction."""
    try:
        con.execute("BEGIN")
        for rows in runs:
            _replace_run(con, rows)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _replace_run(con: duckdb.DuckDBPyConnection, rows: RunRows) -> None:
    n, a = rows.pred.shape
    run_id = rows.run["run_id"]
    predictions = pa.table({
        "run_id": pa.DictionaryArray.from_arrays(np.zeros(n * a, dtype=np.int32), pa.array([run_id])),
        "image_id": np.repeat(rows.image_id.astype(np.int64), a),
        "anchor": np.tile(np.arange(a, dtype=np.int16), n),
        "pred": rows.pred.astype(np.int32).ravel(),
        "conf": rows.conf.astype(np.float32).ravel(),
    })
    run = rows.run
    for table in ("predictions", "decisions", "folds", "probe_fits", "runs"):
        con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
    con.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now())",
                [run_id, run["model"], run["view"], run["train_view"], run["probe"], json.dumps(run["params"]),
                 run["cross_fit"], run["seed"], n, a, run["store"]])
    _insert(con, "predictions", predictions)
    if rows.fold is not None:
        _insert(con, "folds", pa.table({"run_id": pa.array([run_id] * n),
                                        "image_id": rows.image_id.astype(np.int64),
                                        "fold": rows.fold.astype(np.int16)}))
    con.execute(sql_text("derive_decisions"), {"run_id": run_id})
    if rows.fits:
        con.executemany("INSERT INTO probe_fits (run_id, fold, anchor, val_accuracy, epochs, converged, "
                        "train_loss, val_loss, info) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [(run_id, f, anchor, r.get("val_accuracy"), r.get("epochs"), r.get("converged"),
                          r.get("train_loss"), r.get("val_loss"), json.dumps(r)) for f, anchor, r in rows.fits])
