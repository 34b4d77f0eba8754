"""Where a sweep's early/mid/late bands begin and end (sql/band_limits.sql), for the figures and notes."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import NamedTuple


class BandLimits(NamedTuple):
    last_early: int | None  # the last anchor decision_band calls early (None: none is)
    first_late: int  # the first anchor it calls late


@functools.lru_cache(maxsize=256)
def band_limits(t: int) -> BandLimits:
    """Where the early and late bands of anchors 0..t begin and end (sql/band_limits.sql), for the figures and
    notes that show them: read from decision_band itself, so that no band bound is written a second time in
    Python. Needs no database (an in-memory DuckDB)."""
    from featstore.analytics.db import in_memory

    con = in_memory("decision_band", "band_limits")
    try:
        return BandLimits(*con.execute("SELECT last_early, first_late FROM band_limits(?)", [t]).fetchall()[0])
    finally:
        con.close()


def late_caveat(t: int, k: int) -> str:
    """Why 'late' can mean 'never stable': a stable l*(k) is at most T - k, and late starts at 0.7T; '' when some
    stable l* can be late."""
    late_start = band_limits(t).first_late
    if t - k >= late_start:
        return ""
    return (f"at k = {k} with {t + 1} anchors no stable l* can be late (a stable l* is at most T - k = {t - k}, late "
            f"starts at anchor {late_start}, the first at or past 0.7T): late = never stable")


def late_notes(ts: Iterable[int], ks: Iterable[int]) -> list[str]:
    """Every distinct `late_caveat` of these last anchors T and windows k, in order: the notes a sweep printed or
    shown in the paper's band carries (`timeline`, the demo, the report's tables)."""
    ks = list(ks)
    return [note for note in dict.fromkeys(late_caveat(t, k) for t in ts for k in ks) if note]
