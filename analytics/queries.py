"""The analyses as Polars DataFrames: thin calls of the SQL macros in `sql/`, on a read-only connection.

Every function takes a database path (or an open connection) and returns exactly what the macro of the same
name returns, so Python, `featstore sql` and any DuckDB client see the same numbers.
"""

from __future__ import annotations

import difflib
import functools
import numbers
import queue
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import duckdb
import polars as pl
import pyarrow as pa

from featstore.analytics.bands import BANDS
from featstore.analytics.comparison_text import Comparison
from featstore.analytics.db import MACROS, connect, connect_several, in_memory, schema_tables
from featstore.analytics.exit_policies import DEFAULT_POLICIES, ExitPolicies
from featstore.analytics.scopes import SCOPES
from featstore.errors import FeatstoreError, Name, Step
from featstore.schema import JOINT_MIN_CONF, PER_PAIR

Db = str | Path | Sequence[str | Path] | duckdb.DuckDBPyConnection  # a database, several, or an open connection
READ_WAIT_S = 30.0  # a probe holds the write lock only for its final transaction: wait that out


def open_read_only(db: str | Path | Sequence[str | Path]) -> duckdb.DuckDBPyConnection:
    """A sealed read-only connection to one database, or to several as if they were one (`connect_several`)."""
    if isinstance(db, str | Path):
        return connect(db, read_only=True, wait_s=READ_WAIT_S)
    if len(db) == 1:
        return connect(db[0], read_only=True, wait_s=READ_WAIT_S)
    return connect_several(db)


def _one_statement(sql: str) -> None:
    """Exactly one statement: text such as `SELECT 1; DETACH ...` is refused before anything runs."""
    try:
        count = len(duckdb.extract_statements(sql))
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


def query(db: Db, sql: str, params: Sequence | dict | None = None) -> pl.DataFrame:
    """Run one SQL statement read-only and return its result as a Polars DataFrame (held whole: see `stream` for
    results of any size)."""
    _one_statement(sql)
    con = db if isinstance(db, duckdb.DuckDBPyConnection) else open_read_only(db)
    try:
        relation = con.sql(sql, params=params or None)
        return pl.DataFrame() if relation is None else _printable(relation).pl()
    except duckdb.Error as e:
        raise _sql_error(e) from e
    finally:
        if con is not db:
            con.close()


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


def stream(db: Db, sql: str, params: Sequence | dict | None = None,
           batch_rows: int = STREAM_ROWS) -> Iterator[pl.DataFrame]:
    """The result of one read-only SQL statement as Polars frames of at most `batch_rows` rows, in order (at least
    one frame, empty for an empty result), so that memory stays bounded at any row count.

    DuckDB runs the query in a worker thread and this generator waits for its batches in the calling thread:
    a KeyboardInterrupt (Ctrl-C) there, or closing the generator early, cancels the query at once
    (`interrupt`) instead of waiting for it to finish, and the interrupt propagates."""
    _one_statement(sql)
    con = db if isinstance(db, duckdb.DuckDBPyConnection) else open_read_only(db)
    batches: queue.Queue = queue.Queue(maxsize=2)  # the producer waits while the consumer prints
    stop = threading.Event()

    def produce() -> None:
        try:
            if stop.is_set():
                return
            relation = con.sql(sql, params=params or None)
            if relation is None:  # a statement without a result
                batches.put(pa.table({}))
                return
            reader = _printable(relation).to_arrow_reader(batch_rows)  # pulls the result batch by batch
            batches.put(reader.schema)
            for batch in reader:
                while not stop.is_set():
                    try:
                        batches.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            batches.put(None)
        except BaseException as e:  # handed to the caller's thread
            batches.put(e)

    worker = threading.Thread(target=produce, name="featstore-sql", daemon=True)
    worker.start()
    try:
        schema, sent = None, False
        while True:
            try:
                item = batches.get(timeout=0.1)  # a wait Ctrl-C can interrupt
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise _sql_error(item) if isinstance(item, duckdb.Error) else item
            if isinstance(item, pa.Table):
                yield pl.from_arrow(item)
                return
            if isinstance(item, pa.Schema):
                schema = item
                continue
            if item is None:
                if not sent:
                    yield pl.from_arrow(schema.empty_table())
                return
            sent = True
            yield pl.from_arrow(item)
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


DEFAULT_KS = (1, 2, 3, 4)


def check_scope(scope: str) -> str:
    """A scope the macros know; any other word would silently select no image at all."""
    if scope not in SCOPES:
        raise FeatstoreError(f"use one of {', '.join(SCOPES)}", field="scope", value=scope)
    return scope


def stability_windows(db: Db, ks: Sequence[int] | None = None, runs: Sequence[str] | None = None) -> list[int]:
    """The k values to show: as asked, or by default 1..4 as far as the runs have anchors. k counts anchors
    after the first, so a k below 1, or at or beyond every run's anchor count, selects nothing (blank layers) and
    is refused: the one rule of every command and macro call that takes k. `runs`: only these runs count."""
    most = query(db, "SELECT max(n_anchors) AS a FROM runs WHERE ?::VARCHAR[] IS NULL OR list_contains(?, run_id)",
                 [runs, runs])["a"][0]
    if isinstance(ks, str) or (ks is not None and not (len(ks) and all(
            isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in ks))):
        raise FeatstoreError("give stability windows as integers (one, or a list)", field="k", value=ks)
    if ks is None or list(ks) == list(DEFAULT_KS):  # the default: trimmed to what the runs have
        return [k for k in DEFAULT_KS if most is None or k < most] or [1]
    where = f"run {runs[0]!r} has" if runs and len(runs) == 1 else "the runs in the database have at most"
    if min(ks) < 1 or (most is not None and max(ks) >= most):
        bad = min(ks) if min(ks) < 1 else max(ks)
        raise FeatstoreError(f"{where} {most} anchors, so k (anchors after the first that must agree) "
                             f"must be from 1 to {(most or 2) - 1}", field="k", value=bad)
    return sorted(ks)


def check_band(band: str) -> str:
    """A band the sweep knows ('paper' or 'window'); any other word is refused in one line before the query."""
    if band not in BANDS:
        raise FeatstoreError(f"use one of {', '.join(BANDS)}", field="band", value=band)
    return band


def check_min_conf(min_conf: float) -> float:
    """The joint criterion's confidence threshold θ: 0 (stability alone) up to 1."""
    if not 0 <= min_conf <= 1:
        raise FeatstoreError("a confidence threshold lies in [0, 1] (0: stability alone)",
                             field="min_conf", value=min_conf)
    return float(min_conf)


def _per_k(macro: str, db: Db, k: int, scope: str, min_conf: float) -> pl.DataFrame:
    """A macro of (k, scope, min_conf): every one that takes a stability window also takes the joint criterion."""
    return query(db, f"SELECT * FROM {macro}(?, scope := ?, min_conf := ?)",
                 [k, check_scope(scope), check_min_conf(min_conf)])


def decision_layers(db: Db, k: int, scope: str = "auto", min_conf: float = 0.0, band: str = "paper") -> pl.DataFrame:
    """l*(k) per run and image with its band (macro decision_layers); `band`: 'paper' or 'window'."""
    return query(db, "SELECT * FROM decision_layers(?, scope := ?, min_conf := ?, band := ?)",
                 [k, check_scope(scope), check_min_conf(min_conf), check_band(band)])


def decision_summary(db: Db, k: int, scope: str = "auto", min_conf: float = 0.0, band: str = "paper") -> pl.DataFrame:
    """decision_sweep's row of every run at k; `band`: 'paper' (thirds of T) or 'window' (thirds of T - k)."""
    return query(db, "SELECT * FROM decision_summary(?, scope := ?, min_conf := ?, band := ?)",
                 [k, check_scope(scope), check_min_conf(min_conf), check_band(band)])


def k_sweep(db: Db, ks: Sequence[int] | None = None, scope: str = "auto", min_conf: float = 0.0,
            runs: Sequence[str] | None = None, band: str = "paper") -> pl.DataFrame:
    """decision_sweep at the windows ks, of every run or of the runs named (each must exist), in the paper's band
    or the window-aware one (`band`, docs/design.md §5)."""
    check_scope(scope)
    check_band(band)
    chosen = known_runs(db, runs) if runs else None
    ks = stability_windows(db, ks)
    frame = query(db, "SELECT * FROM decision_sweep(?, scope := ?, min_conf := ?, band := ?)",
                  [max(ks), scope, check_min_conf(min_conf), band])
    frame = frame.filter(pl.col("k").is_in(list(ks)))
    return frame if chosen is None else frame.filter(pl.col("run_id").is_in(chosen))


def decision_mass(db: Db, k: int, scope: str = "auto", min_conf: float = 0.0) -> pl.DataFrame:
    return _per_k("decision_mass", db, k, scope, min_conf)


def cumulative_curve(db: Db, k: int, scope: str = "auto", min_conf: float = 0.0) -> pl.DataFrame:
    return _per_k("cumulative_curve", db, k, scope, min_conf)


def prediction_depth(db: Db, run_id: str, scope: str = "auto") -> pl.DataFrame:
    """Baldock et al.'s prediction depth of every image of one run, against the model's own prediction, with what it
    reads: layer 0 (`input` where the store has the input anchor) and the rows its probes learnt from."""
    return query(db, "SELECT * FROM prediction_depth(?, scope := ?)", [run_id, check_scope(scope)])


def head_agreement(db: Db, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM head_agreement(scope := ?)", [check_scope(scope)])


def probe_accuracy(db: Db, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM probe_accuracy(scope := ?)", [check_scope(scope)])


def corruption_shift(db: Db, k: int = 2, scope: str = "auto", min_conf: float = 0.0) -> pl.DataFrame:
    return _per_k("corruption_shift", db, k, scope, min_conf)


def paper_table(db: Db, k: int = 2, scope: str = "auto", min_conf: float = 0.0) -> pl.DataFrame:
    return _per_k("paper_table", db, k, scope, min_conf)


def paper_table_spread(db: Db, k: int = 2, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM paper_table_spread(?, scope := ?)", [k, check_scope(scope)])


def population(db: Db, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM population(scope := ?)", [check_scope(scope)])


def run_agreement(db: Db, run_a: str, run_b: str, k: int = 2, scope: str = "auto") -> pl.DataFrame:
    """How far two runs of one view agree: per anchor the share of identical predictions, then (anchor null) the
    share of identical l*(k) and early/mid/late band, on the images both predicted that the scope counts for both
    (by default what every summary and the report count: the test split; sql/run_agreement.sql)."""
    return query(db, "SELECT * FROM run_agreement(?, ?, k := ?, scope := ?)", [run_a, run_b, k, check_scope(scope)])


def decision_examples(db: Db, k: int = 2, per_side: int = 4, scope: str = "auto",
                      min_conf: float = 0.0) -> pl.DataFrame:
    return query(db, "SELECT * FROM decision_examples(?, per_side := ?, scope := ?, min_conf := ?)",
                 [k, per_side, scope, check_min_conf(min_conf)])


class BandLimits(NamedTuple):
    last_early: int | None  # the last anchor decision_band calls early (None: none is)
    first_late: int  # the first anchor it calls late


@functools.lru_cache(maxsize=256)
def band_limits(t: int) -> BandLimits:
    """Where the early and late bands of anchors 0..t begin and end (sql/band_limits.sql), for the figures and
    notes that show them: read from decision_band itself, so that no band bound is written a second time in
    Python. Needs no database (an in-memory DuckDB)."""
    con = in_memory("decision_band", "band_limits")
    try:
        return BandLimits(*con.execute("SELECT last_early, first_late FROM band_limits(?)", [t]).fetchall()[0])
    finally:
        con.close()


def anchor_names(db: Db, model: str) -> list[str]:
    """Anchor names of a model in depth order (index = anchor)."""
    return query(db, "SELECT name FROM anchors WHERE model = ? ORDER BY anchor", [model])["name"].to_list()


def meta(db: Db) -> dict[str, str]:
    return dict(query(db, "SELECT key, value FROM meta").rows())


def timelines(db: Db, run_id: str | None = None) -> pl.DataFrame:
    if run_id is None:
        return query(db, "SELECT * FROM timelines ORDER BY run_id, image_id")
    return query(db, "SELECT * FROM timelines WHERE run_id = ? ORDER BY image_id", [run_id])


def runs(db: Db) -> pl.DataFrame:
    return query(db, "SELECT * FROM runs ORDER BY run_id")


def circuit_runs(db: Db) -> pl.DataFrame:
    return query(db, "SELECT * FROM circuit_runs ORDER BY run_id")


def run_ids_among(db: Db, run_ids: Sequence[str]) -> set[str]:
    """Which of `run_ids` the database holds."""
    return set(query(db, "SELECT run_id FROM runs WHERE list_contains(?, run_id)", [list(run_ids)])["run_id"])


def models_of_runs(db: Db, run_ids: Sequence[str]) -> list[str]:
    """The models the runs `run_ids` probe, in name order."""
    return query(db, "SELECT DISTINCT model FROM runs WHERE list_contains(?, run_id) ORDER BY model",
                 [list(run_ids)])["model"].to_list()


def label_count(db: Db) -> int | None:
    """1 + the largest label of the database's images (None: no image yet)."""
    return query(db, "SELECT max(label) + 1 AS n FROM images")["n"][0]


def cost_settings(db: Db, model: str) -> pl.DataFrame:
    """The (batch_size, device) pairs a model's anchor costs were measured at, in order."""
    return query(db, "SELECT DISTINCT batch_size, device FROM anchor_costs WHERE model = ? ORDER BY 1, 2", [model])


def unconverged_probes(db: Db) -> pl.DataFrame:
    """Probes stopped by their epoch cap before converging (none for databases written before this was recorded)."""
    return query(db, "SELECT * FROM unconverged_probes")


def cost_devices(db: Db, model: str, batch_size: int) -> list[str]:
    frame = query(db, "SELECT DISTINCT device FROM anchor_costs WHERE model = ? AND batch_size = ? ORDER BY 1",
                  [model, batch_size])
    return frame["device"].to_list() if not frame.is_empty() else []


def exit_device(db: Db, run_id: str, batch_size: int = 1, device: str | None = None) -> str:
    """The device whose measured costs price the exits of `run_id`: `device` if its costs exist, else the only
    device measured at that batch size."""
    run = query(db, "SELECT model FROM runs WHERE run_id = ?", [run_id])
    if run.is_empty():
        raise FeatstoreError(f"no run {run_id!r} in {db}; list them with ", Step("fs.connect(db).runs", "sql"))
    model = run["model"][0]
    devices = cost_devices(db, model, batch_size)
    if device is None:
        if not devices:
            raise FeatstoreError(f"no costs of {model!r} at batch size {batch_size} in {db}; measure them with ",
                                 Step(f"fs.cost({model!r}, db)", "cost"))
        if len(devices) > 1:
            raise FeatstoreError(f"costs of {model!r} exist for several devices ({'; '.join(devices)}): pick one "
                                 f"with ", Name("device"))
        return devices[0]
    if device not in devices:
        raise FeatstoreError(f"no costs of {model!r} measured on {device!r} at batch size {batch_size} "
                             f"(have: {'; '.join(devices) or 'none'})")
    return device


@dataclass
class EarlyExit:
    device: str
    population: pl.DataFrame  # one row (exit_population): the images every policy below is counted on
    simulation: pl.DataFrame
    pareto: pl.DataFrame


def early_exit(db: Db, run_id: str, device: str | None = None, batch_size: int = 1,
               policies: ExitPolicies = DEFAULT_POLICIES, scope: str = "auto") -> EarlyExit:
    """Every exit policy's accuracy and cost, and the Pareto front, priced on `device` (default: the only one),
    all counted on one population of images (refused when it is empty rather than printing empty tables)."""
    policies = replace(policies, ks=tuple(stability_windows(db, policies.ks, [run_id])))
    device = exit_device(db, run_id, batch_size, device)
    population = exit_population(db, run_id, policies, scope)
    row = population.row(0, named=True)
    if row["n"] == 0:
        if row["gate_learnt_on"] and row["scoped"]:
            raise FeatstoreError(f"no image to simulate early exit on: the learned gate of {run_id!r} learnt from "
                                 f"every image this scope counts (its {row['gate_learnt_on']} split); pass another ",
                                 Name("scope"), ", or ", Name("no_gate"), field="scope", value=scope)
        raise FeatstoreError(f"no image to simulate early exit on: this scope counts no image of {run_id!r}; pass "
                             f"another ", Name("scope"), field="scope", value=scope)
    return EarlyExit(device, population, exit_simulation(db, run_id, device, batch_size, policies, scope),
                     exit_pareto(db, run_id, device, batch_size, policies, scope))


def exit_population(db: Db, run_id: str, policies: ExitPolicies = DEFAULT_POLICIES,
                    scope: str = "auto") -> pl.DataFrame:
    """The one population every exit policy of a simulation is counted on (see sql/exit_population.sql)."""
    return query(db, "SELECT * FROM exit_population(?, scope := ?, gate_thresholds := ?)",
                 [run_id, check_scope(scope), policies.gate_args()])


def describe_population(row: dict) -> str:
    """One line saying which images an exit simulation counts, printed with its table by exit-sim and the
    report, so that no figure is read as counting images it does not."""
    what = {"auto": "the test split" if not row["cross_fit"] else "every image of this cross-fit run",
            "all": "every image"}.get(row["scope"], f"the {row['scope']} split")
    line = f"population: {row['n']} images ({row['splits'] or 'none'}): {what} (--scope {row['scope']})"
    if row["gate_learnt_on"] and row["left_out"]:
        line += (f", less the {row['left_out']} the learned gate learnt from ({row['gate_learnt_on']} split) or "
                 "the run did not predict")
    elif row["gate_learnt_on"]:
        line += f"; the learned gate learnt from none of them ({row['gate_learnt_on']} split)"
    elif row["left_out"]:
        line += f", less the {row['left_out']} the run did not predict"
    return line + "; every policy, the Pareto front and the oracle count these same images"


def _exit_table(macro: str, db: Db, run_id: str, device: str, batch_size: int, policies: ExitPolicies,
                scope: str) -> pl.DataFrame:
    return query(db, f"SELECT * FROM {macro}(?, ?, sim_batch := ?, ks := ?, thresholds := ?, "
                     "combined_thresholds := ?, scope := ?, gate_thresholds := ?)",
                 [run_id, device, batch_size, *policies.args(), check_scope(scope), policies.gate_args()])


def exit_simulation(db: Db, run_id: str, device: str, batch_size: int = 1, policies: ExitPolicies = DEFAULT_POLICIES,
                    scope: str = "auto") -> pl.DataFrame:
    """Accuracy and mean cost per image of every exit policy (see sql/exit_simulation.sql)."""
    return _exit_table("exit_simulation", db, run_id, device, batch_size, policies, scope)


def exit_pareto(db: Db, run_id: str, device: str, batch_size: int = 1, policies: ExitPolicies = DEFAULT_POLICIES,
                scope: str = "auto") -> pl.DataFrame:
    """The policies of exit_simulation that no other beats on both accuracy and cost."""
    return _exit_table("exit_pareto", db, run_id, device, batch_size, policies, scope)


def exit_shares(db: Db, run_id: str, policies: ExitPolicies = DEFAULT_POLICIES, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM exit_shares(?, ks := ?, thresholds := ?, combined_thresholds := ?, scope := ?, "
                     "gate_thresholds := ?)", [run_id, *policies.args(), check_scope(scope), policies.gate_args()])


def tap_grid(db: Db, run_id: str, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM tap_grid(?, scope := ?)", [run_id, check_scope(scope)])


def tap_gains(db: Db, run_id: str, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM tap_gains(?, scope := ?)", [run_id, check_scope(scope)])


def tap_decision_layers(db: Db, run_id: str, tap: str, k: int, scope: str = "auto",
                        min_conf: float = 0.0) -> pl.DataFrame:
    return query(db, "SELECT * FROM tap_decision_layers(?, ?, ?, scope := ?, min_conf := ?)",
                 [run_id, tap, k, check_scope(scope), check_min_conf(min_conf)])


def known_runs(db: Db, runs: Sequence[str]) -> list[str]:
    """The runs as given, once each, every one of them in the database (else the --run error naming it)."""
    known = query(db, "SELECT run_id FROM runs")["run_id"].to_list()
    missing = [r for r in runs if r not in known]
    if missing:
        raise FeatstoreError(f"no run {missing[0]!r} in the database; list them with ",
                             Step("fs.connect(db).runs", "sql"), field="runs")
    return list(dict.fromkeys(runs))


def comparison_runs(db: Db, runs: Sequence[str] | None = None) -> list[str]:
    """The runs to compare: as given (each must exist), or every clean run in the database."""
    if runs:
        return known_runs(db, runs)
    known = query(db, "SELECT run_id, view FROM runs ORDER BY run_id")
    clean = known.filter(pl.col("view") == "clean")["run_id"].to_list()
    if not clean:
        raise FeatstoreError("the database has no clean runs to compare; pass ", Name("runs"))
    return clean


def compare(db: Db, runs: Sequence[str] | None = None, k: int = 2, min_conf: float = JOINT_MIN_CONF,
            scope: str = "auto", per_pair: int = PER_PAIR) -> Comparison:
    """l*(k), prediction depth and the joint criterion of each run, compared image by image."""
    if isinstance(per_pair, bool) or not isinstance(per_pair, numbers.Integral) or per_pair < 0:
        raise FeatstoreError("give how many disagreeing images to list per pair, >= 0",
                             field="per_pair", value=per_pair)
    con = db if isinstance(db, duckdb.DuckDBPyConnection) else connect(db, read_only=True, wait_s=READ_WAIT_S)
    try:
        runs = comparison_runs(con, runs)
        args = [runs, k, check_min_conf(min_conf), check_scope(scope)]
        tail = "(?, k := ?, min_conf := ?, scope := ?)"
        picked = "(?, k := ?, min_conf := ?, per_pair := ?, scope := ?)"
        return Comparison(runs, query(con, f"SELECT * FROM definition_summary{tail}", args),
                          query(con, f"SELECT * FROM definition_agreement{tail}", args),
                          query(con, f"SELECT * FROM definition_crosstab{tail}", args),
                          query(con, f"SELECT * FROM definition_disagreements{picked}", [*args[:3], per_pair, args[3]]),
                          query(con, f"SELECT * FROM definition_decided_disagreements{picked}",
                                [*args[:3], per_pair, args[3]]),
                          query(con, f"SELECT * FROM definition_ranking{tail}", args),
                          query(con, "SELECT * FROM prediction_depth_summary(?, scope := ?)", [runs, args[3]]))
    finally:
        if con is not db:
            con.close()
