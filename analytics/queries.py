"""The analyses as Polars DataFrames: thin calls of the SQL macros in `sql/`, on a read-only connection.

Every function takes a database path (or an open connection) and returns exactly what the macro of the same
name returns, so Python, `featstore sql` and any DuckDB client see the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from featstore.analytics.db import connect, connect_several
from featstore.analytics.exit_policies import DEFAULT_POLICIES, ExitPolicies
from featstore.analytics.scopes import SCOPES
from featstore.errors import FeatstoreError

Db = str | Path | Sequence[str | Path] | duckdb.DuckDBPyConnection  # a database, several, or an open connection
READ_WAIT_S = 30.0  # a probe holds the write lock only for its final transaction: wait that out


def open_read_only(db: str | Path | Sequence[str | Path]) -> duckdb.DuckDBPyConnection:
    """A sealed read-only connection to one database, or to several as if they were one (`connect_several`)."""
    if isinstance(db, str | Path):
        return connect(db, read_only=True, wait_s=READ_WAIT_S)
    if len(db) == 1:
        return connect(db[0], read_only=True, wait_s=READ_WAIT_S)
    return connect_several(db)


def query(db: Db, sql: str, params: Sequence | dict | None = None) -> pl.DataFrame:
    """Run one SQL statement read-only and return its result as a Polars DataFrame.

    Exactly one statement: text such as `SELECT 1; DETACH ...` is refused before anything runs."""
    try:
        count = len(duckdb.extract_statements(sql))
    except duckdb.Error as e:
        raise FeatstoreError(f"SQL error: {str(e).splitlines()[0]}") from e
    if count != 1:
        raise FeatstoreError(f"give exactly one SQL statement (got {count}); run several with one call each")
    con = db if isinstance(db, duckdb.DuckDBPyConnection) else open_read_only(db)
    try:
        relation = con.sql(sql, params=params or None)
        return pl.DataFrame() if relation is None else relation.pl()
    except duckdb.Error as e:
        first = str(e).splitlines()[0]
        if any(m in first.lower() for m in ("read-only", "disabled", "locked", "cannot attach")):
            raise FeatstoreError(f"queries open the database read-only and reach no other file, extension or "
                                 f"setting ({first}); featstore probe is what writes") from e
        raise FeatstoreError(f"SQL error: {first}") from e
    finally:
        if con is not db:
            con.close()


DEFAULT_KS = (1, 2, 3, 4)


def check_scope(scope: str) -> str:
    """A scope the macros know; any other word would silently select no image at all."""
    if scope not in SCOPES:
        raise FeatstoreError(f"--scope {scope!r}: use one of {', '.join(SCOPES)}")
    return scope


def stability_windows(db: Db, ks: Sequence[int] | None = None) -> list[int]:
    """The k values to show: as asked, or by default 1..4 as far as the runs have anchors. k counts anchors
    after the first, so a k at or beyond every run's anchor count selects nothing and is refused."""
    most = query(db, "SELECT max(n_anchors) AS a FROM runs")["a"][0]
    if ks is None or list(ks) == list(DEFAULT_KS):  # the default: trimmed to what the runs have
        return [k for k in DEFAULT_KS if most is None or k < most] or [1]
    if most is not None and max(ks) >= most:
        raise FeatstoreError(f"--k {max(ks)}: the runs in the database have at most {most} anchors, so k (anchors "
                             f"after the first that must agree) must be below {most}")
    return sorted(ks)


def decision_layers(db: Db, k: int, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM decision_layers(?, scope := ?)", [k, check_scope(scope)])


def decision_summary(db: Db, k: int, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM decision_summary(?, scope := ?)", [k, check_scope(scope)])


def k_sweep(db: Db, ks: Sequence[int] | None = None, scope: str = "auto") -> pl.DataFrame:
    check_scope(scope)
    ks = stability_windows(db, ks)
    frame = query(db, "SELECT * FROM decision_sweep(?, scope := ?)", [max(ks), scope])
    return frame.filter(pl.col("k").is_in(list(ks)))


def decision_mass(db: Db, k: int, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM decision_mass(?, scope := ?)", [k, check_scope(scope)])


def cumulative_curve(db: Db, k: int, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM cumulative_curve(?, scope := ?)", [k, check_scope(scope)])


def probe_accuracy(db: Db, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM probe_accuracy(scope := ?)", [check_scope(scope)])


def corruption_shift(db: Db, k: int = 2, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM corruption_shift(?, scope := ?)", [k, check_scope(scope)])


def paper_table(db: Db, k: int = 2, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM paper_table(?, scope := ?)", [k, check_scope(scope)])


def paper_table_spread(db: Db, k: int = 2, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM paper_table_spread(?, scope := ?)", [k, check_scope(scope)])


def population(db: Db, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM population(scope := ?)", [check_scope(scope)])


def decision_examples(db: Db, k: int = 2, per_side: int = 4, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM decision_examples(?, per_side := ?, scope := ?)", [k, per_side, scope])


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
        raise FeatstoreError(f"no run {run_id!r} in {db}; list them with featstore sql --db {db} "
                             f"\"SELECT run_id FROM runs\"")
    model = run["model"][0]
    devices = cost_devices(db, model, batch_size)
    if device is None:
        if not devices:
            raise FeatstoreError(f"no costs of {model!r} at batch size {batch_size} in {db}; run featstore cost "
                                 f"--model {model} --db {db}")
        if len(devices) > 1:
            raise FeatstoreError(f"costs of {model!r} exist for several devices ({'; '.join(devices)}): pick one "
                                 f"with --device")
        return devices[0]
    if device not in devices:
        raise FeatstoreError(f"no costs of {model!r} measured on {device!r} at batch size {batch_size} "
                             f"(have: {'; '.join(devices) or 'none'})")
    return device


@dataclass
class EarlyExit:
    device: str
    simulation: pl.DataFrame
    pareto: pl.DataFrame


def early_exit(db: Db, run_id: str, device: str | None = None, batch_size: int = 1,
               policies: ExitPolicies = DEFAULT_POLICIES, scope: str = "auto") -> EarlyExit:
    """Every exit policy's accuracy and cost, and the Pareto front, priced on `device` (default: the only one)."""
    device = exit_device(db, run_id, batch_size, device)
    return EarlyExit(device, exit_simulation(db, run_id, device, batch_size, policies, scope),
                     exit_pareto(db, run_id, device, batch_size, policies, scope))


def _exit_table(macro: str, db: Db, run_id: str, device: str, batch_size: int, policies: ExitPolicies,
                scope: str) -> pl.DataFrame:
    return query(db, f"SELECT * FROM {macro}(?, ?, sim_batch := ?, ks := ?, thresholds := ?, "
                     "combined_thresholds := ?, scope := ?)",
                 [run_id, device, batch_size, *policies.args(), check_scope(scope)])


def exit_simulation(db: Db, run_id: str, device: str, batch_size: int = 1, policies: ExitPolicies = DEFAULT_POLICIES,
                    scope: str = "auto") -> pl.DataFrame:
    """Accuracy and mean cost per image of every exit policy (see sql/exit_simulation.sql)."""
    return _exit_table("exit_simulation", db, run_id, device, batch_size, policies, scope)


def exit_pareto(db: Db, run_id: str, device: str, batch_size: int = 1, policies: ExitPolicies = DEFAULT_POLICIES,
                scope: str = "auto") -> pl.DataFrame:
    """The policies of exit_simulation that no other beats on both accuracy and cost."""
    return _exit_table("exit_pareto", db, run_id, device, batch_size, policies, scope)


def exit_shares(db: Db, run_id: str, policies: ExitPolicies = DEFAULT_POLICIES, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM exit_shares(?, ks := ?, thresholds := ?, combined_thresholds := ?, scope := ?)",
                 [run_id, *policies.args(), check_scope(scope)])


def tap_grid(db: Db, run_id: str, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM tap_grid(?, scope := ?)", [run_id, check_scope(scope)])


def tap_gains(db: Db, run_id: str, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM tap_gains(?, scope := ?)", [run_id, check_scope(scope)])


def tap_decision_layers(db: Db, run_id: str, tap: str, k: int, scope: str = "auto") -> pl.DataFrame:
    return query(db, "SELECT * FROM tap_decision_layers(?, ?, ?, scope := ?)", [run_id, tap, k, check_scope(scope)])
