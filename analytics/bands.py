"""Where a sweep's early/mid/late bands begin and end (sql/band_limits.sql), for the figures and notes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import duckdb


class BandLimits(NamedTuple):
    last_early: int | None  # the last anchor decision_band calls early (None: none is)
    first_late: int  # the first anchor it calls late


_LIMITS: dict[int, BandLimits] = {}  # t -> its limits: one version's decision_band, read once per process


def band_limits(t: int, con: duckdb.DuckDBPyConnection | None = None) -> BandLimits:
    """Where the early and late bands of anchors 0..t begin and end (sql/band_limits.sql), for the figures and
    notes that show them: read from decision_band itself, so that no band bound is written a second time in
    Python. On `con`, an open featstore connection (its macros this version's), or else an in-memory DuckDB
    (creating one costs about 0.1 s of a command's start)."""
    if t not in _LIMITS:
        from featstore.analytics.db import in_memory

        own = con is None
        con = in_memory("decision_band", "band_limits") if own else con
        try:
            _LIMITS[t] = BandLimits(*con.execute("SELECT last_early, first_late FROM band_limits(?)",
                                                 [t]).fetchall()[0])
        finally:
            if own:
                con.close()
    return _LIMITS[t]


def late_caveat(t: int, k: int, con: duckdb.DuckDBPyConnection | None = None) -> str:
    """Why 'late' can mean 'never stable': a stable l*(k) is at most T - k, and late starts at 0.7T; '' when some
    stable l* can be late (`con`: as `band_limits`)."""
    late_start = band_limits(t, con).first_late
    if t - k >= late_start:
        return ""
    return (f"at k = {k} with {t + 1} anchors no stable l* can be late (a stable l* is at most T - k = {t - k}, late "
            f"starts at anchor {late_start}, the first at or past 0.7T): late = never stable")


def late_notes(ts: Iterable[int], ks: Iterable[int], con: duckdb.DuckDBPyConnection | None = None) -> list[str]:
    """Every distinct `late_caveat` of these last anchors T and windows k, in order: the notes a sweep printed or
    shown in the paper's band carries (`timeline`, the demo, the report's tables; `con`: as `band_limits`)."""
    ks = list(ks)
    return [note for note in dict.fromkeys(late_caveat(t, k, con) for t in ts for k in ks) if note]
