"""The analyses as Polars DataFrames: thin calls of the SQL macros in `sql/`, on a read-only connection.

Every function takes a database path (or an open connection) and returns exactly what the macro of the same
name returns, so Python, `featstore sql` and any DuckDB client see the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import duckdb
import polars as pl

from featstore.analytics import read_only
from featstore.analytics.bands import BandLimits, band_limits  # noqa: F401 (read from here by the report)
from featstore.analytics.comparison_text import Comparison
from featstore.analytics.db import connect
from featstore.analytics.exit_policies import DEFAULT_POLICIES, ExitPolicies
from featstore.analytics.read_only import (  # noqa: F401 (read from here by other modules)
    READ_WAIT_S,
    STREAM_ROWS,
    Db,
    _one_statement,
    _printable,
    _sql_error,
    check_band,
    check_min_conf,
    check_scope,
    known_runs,
    open_read_only,
    stability_windows,
    sweep_statement,
)
from featstore.errors import FeatstoreError, Name, Step
from featstore.schema import BAND, JOINT_MIN_CONF, MIN_CONF, PER_PAIR, SCOPE, K, check_field


def query(db: Db, sql: str, params: Sequence | dict | None = None) -> pl.DataFrame:
    """Run one SQL statement read-only and return its result as a Polars DataFrame (held whole: see `stream` for
    results of any size)."""
    con = db if isinstance(db, duckdb.DuckDBPyConnection) else open_read_only(db)
    try:
        _one_statement(con, sql)
        relation = con.sql(sql, params=params or None)
        return pl.DataFrame() if relation is None else _printable(relation).pl()
    except duckdb.Error as e:
        raise _sql_error(e) from e
    finally:
        if con is not db:
            con.close()


def stream(db: Db, sql: str, params: Sequence | dict | None = None,
           batch_rows: int = STREAM_ROWS) -> Iterator[pl.DataFrame]:
    """The result of one read-only SQL statement as Polars frames of at most `batch_rows` rows, in order (at least
    one frame, empty for an empty result): `read_only.stream`'s batches (closing this early, or Ctrl-C, cancels the
    query)."""
    batches = read_only.stream(db, sql, params, batch_rows)
    try:
        for batch in batches:
            yield pl.from_arrow(batch)
    finally:
        batches.close()


def _per_k(macro: str, db: Db, k: int, scope: str, min_conf: float) -> pl.DataFrame:
    """A macro of (k, scope, min_conf): every one that takes a stability window also takes the joint criterion."""
    return query(db, f"SELECT * FROM {macro}(?, scope := ?, min_conf := ?)",
                 [k, check_scope(scope), check_min_conf(min_conf)])


def decision_layers(db: Db, k: int, scope: str = SCOPE, min_conf: float = MIN_CONF, band: str = BAND) -> pl.DataFrame:
    """l*(k) per run and image with its band (macro decision_layers); `band`: 'paper' or 'window'."""
    return query(db, "SELECT * FROM decision_layers(?, scope := ?, min_conf := ?, band := ?)",
                 [k, check_scope(scope), check_min_conf(min_conf), check_band(band)])


def decision_summary(db: Db, k: int, scope: str = SCOPE, min_conf: float = MIN_CONF, band: str = BAND) -> pl.DataFrame:
    """decision_sweep's row of every run at k; `band`: 'paper' (thirds of T) or 'window' (thirds of T - k)."""
    return query(db, "SELECT * FROM decision_summary(?, scope := ?, min_conf := ?, band := ?)",
                 [k, check_scope(scope), check_min_conf(min_conf), check_band(band)])


def k_sweep(db: Db, ks: Sequence[int] | None = None, scope: str = SCOPE, min_conf: float = MIN_CONF,
            runs: Sequence[str] | None = None, band: str = BAND) -> pl.DataFrame:
    """decision_sweep at the windows ks, of every run or of the runs named (each must exist), in the paper's band
    or the window-aware one (`band`, docs/design.md §5)."""
    check_scope(scope)
    check_band(band)
    chosen = known_runs(db, runs) if runs else None
    return query(db, *sweep_statement(stability_windows(db, ks), scope, min_conf, chosen, band))


def decision_mass(db: Db, k: int, scope: str = SCOPE, min_conf: float = MIN_CONF) -> pl.DataFrame:
    return _per_k("decision_mass", db, k, scope, min_conf)


def cumulative_curve(db: Db, k: int, scope: str = SCOPE, min_conf: float = MIN_CONF) -> pl.DataFrame:
    return _per_k("cumulative_curve", db, k, scope, min_conf)


def prediction_depth(db: Db, run_id: str, scope: str = SCOPE) -> pl.DataFrame:
    """Baldock et al.'s prediction depth of every image of one run, against the model's own prediction, with what it
    reads: layer 0 (`input` where the store has the input anchor) and the rows its probes learnt from."""
    return query(db, "SELECT * FROM prediction_depth(?, scope := ?)", [run_id, check_scope(scope)])


def head_agreement(db: Db, scope: str = SCOPE) -> pl.DataFrame:
    return query(db, "SELECT * FROM head_agreement(scope := ?)", [check_scope(scope)])


def probe_accuracy(db: Db, scope: str = SCOPE) -> pl.DataFrame:
    return query(db, "SELECT * FROM probe_accuracy(scope := ?)", [check_scope(scope)])


def corruption_shift(db: Db, k: int = K, scope: str = SCOPE, min_conf: float = MIN_CONF) -> pl.DataFrame:
    return _per_k("corruption_shift", db, k, scope, min_conf)


def paper_table(db: Db, k: int = K, scope: str = SCOPE, min_conf: float = MIN_CONF) -> pl.DataFrame:
    return _per_k("paper_table", db, k, scope, min_conf)


def paper_table_spread(db: Db, k: int = K, scope: str = SCOPE) -> pl.DataFrame:
    return query(db, "SELECT * FROM paper_table_spread(?, scope := ?)", [k, check_scope(scope)])


def population(db: Db, scope: str = SCOPE) -> pl.DataFrame:
    return query(db, "SELECT * FROM population(scope := ?)", [check_scope(scope)])


def run_agreement(db: Db, run_a: str, run_b: str, k: int = K, scope: str = SCOPE) -> pl.DataFrame:
    """How far two runs of one view agree: per anchor the share of identical predictions, then (anchor null) the
    share of identical l*(k) and early/mid/late band, on the images both predicted that the scope counts for both
    (by default what every summary and the report count: the test split; sql/run_agreement.sql)."""
    return query(db, "SELECT * FROM run_agreement(?, ?, k := ?, scope := ?)", [run_a, run_b, k, check_scope(scope)])


def decision_examples(db: Db, k: int = K, per_side: int = 4, scope: str = SCOPE,
                      min_conf: float = MIN_CONF) -> pl.DataFrame:
    return query(db, "SELECT * FROM decision_examples(?, per_side := ?, scope := ?, min_conf := ?)",
                 [k, per_side, scope, check_min_conf(min_conf)])


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
               policies: ExitPolicies = DEFAULT_POLICIES, scope: str = SCOPE) -> EarlyExit:
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
    return EarlyExit(device, population, *exit_frontier(db, run_id, device, batch_size, policies, scope))


def exit_population(db: Db, run_id: str, policies: ExitPolicies = DEFAULT_POLICIES,
                    scope: str = SCOPE) -> pl.DataFrame:
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
                    scope: str = SCOPE) -> pl.DataFrame:
    """Accuracy and mean cost per image of every exit policy (see sql/exit_simulation.sql)."""
    return _exit_table("exit_simulation", db, run_id, device, batch_size, policies, scope)


def exit_pareto(db: Db, run_id: str, device: str, batch_size: int = 1, policies: ExitPolicies = DEFAULT_POLICIES,
                scope: str = SCOPE) -> pl.DataFrame:
    """The policies of exit_simulation that no other beats on both accuracy and cost."""
    return _exit_table("exit_pareto", db, run_id, device, batch_size, policies, scope)


def exit_frontier(db: Db, run_id: str, device: str, batch_size: int = 1, policies: ExitPolicies = DEFAULT_POLICIES,
                  scope: str = SCOPE) -> tuple[pl.DataFrame, pl.DataFrame]:
    """exit_simulation's table and exit_pareto's, from one simulation (sql/exit_frontier.sql marks the front): the
    two macros would each simulate every policy over every image."""
    both = _exit_table("exit_frontier", db, run_id, device, batch_size, policies, scope)
    simulation = both.drop("on_front").sort("policy", "k", "theta", maintain_order=True)  # exit_simulation's order
    return simulation, both.filter(pl.col("on_front")).drop("on_front").sort("mean_ms", maintain_order=True)


def exit_shares(db: Db, run_id: str, policies: ExitPolicies = DEFAULT_POLICIES, scope: str = SCOPE) -> pl.DataFrame:
    return query(db, "SELECT * FROM exit_shares(?, ks := ?, thresholds := ?, combined_thresholds := ?, scope := ?, "
                     "gate_thresholds := ?)", [run_id, *policies.args(), check_scope(scope), policies.gate_args()])


def tap_grid(db: Db, run_id: str, scope: str = SCOPE) -> pl.DataFrame:
    return query(db, "SELECT * FROM tap_grid(?, scope := ?)", [run_id, check_scope(scope)])


def tap_gains(db: Db, run_id: str, scope: str = SCOPE) -> pl.DataFrame:
    return query(db, "SELECT * FROM tap_gains(?, scope := ?)", [run_id, check_scope(scope)])


def tap_decision_layers(db: Db, run_id: str, tap: str, k: int, scope: str = SCOPE,
                        min_conf: float = MIN_CONF) -> pl.DataFrame:
    return query(db, "SELECT * FROM tap_decision_layers(?, ?, ?, scope := ?, min_conf := ?)",
                 [run_id, tap, k, check_scope(scope), check_min_conf(min_conf)])


def comparison_runs(db: Db, runs: Sequence[str] | None = None) -> list[str]:
    """The runs to compare: as given (each must exist), or every clean run in the database."""
    if runs:
        return known_runs(db, runs)
    known = query(db, "SELECT run_id, view FROM runs ORDER BY run_id")
    clean = known.filter(pl.col("view") == "clean")["run_id"].to_list()
    if not clean:
        raise FeatstoreError("the database has no clean runs to compare; pass ", Name("runs"))
    return clean


def _rows_of(packed: pl.DataFrame, column: str) -> pl.DataFrame:
    """The rows a one-row result holds in a list column (a macro returning several tables from one computation), in
    the list's order; no rows, with the columns, for an empty (NULL) list."""
    return packed.select(pl.col(column).explode()).filter(pl.col(column).is_not_null()).unnest(column)


def compare(db: Db, runs: Sequence[str] | None = None, k: int = K, min_conf: float = JOINT_MIN_CONF,
            scope: str = SCOPE, per_pair: int = PER_PAIR) -> Comparison:
    """l*(k), prediction depth and the joint criterion of each run, compared image by image: every table from one
    query (definition_comparison computes the definitions and their pairs once)."""
    per_pair = check_field("per_pair", per_pair)
    con = db if isinstance(db, duckdb.DuckDBPyConnection) else connect(db, read_only=True, wait_s=READ_WAIT_S)
    try:
        runs = comparison_runs(con, runs)
        scope = check_scope(scope)
        packed = query(con, "SELECT * FROM definition_comparison(?, k := ?, min_conf := ?, per_pair := ?, scope := ?)",
                       [runs, k, check_min_conf(min_conf), per_pair, scope])
        ranking = _rows_of(packed, "ranking")  # definition_agreement's rows too
        return Comparison(runs, _rows_of(packed, "summary"),
                          ranking.drop("early_late_decided").sort("a", "b", maintain_order=True),
                          _rows_of(packed, "crosstab"), _rows_of(packed, "disagreements"), _rows_of(packed, "decided"),
                          ranking, query(con, "SELECT * FROM prediction_depth_summary(?, scope := ?)", [runs, scope]))
    finally:
        if con is not db:
            con.close()
