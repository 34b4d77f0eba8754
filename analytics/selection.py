"""Which databases, runs, images and stability windows a command reads, and the rules every one-run or
one-window command shares, so that the CLI and the Python API choose alike. A Python caller's arguments are read
here too, each in one way wherever it is taken: numpy's integers and a single k are windows, one path is one
database, and anything else is one line naming the field."""

from __future__ import annotations

import numbers
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from featstore.analytics.read_only import Db, stability_windows
from featstore.errors import FeatstoreError, FeatstoreTypeError, Name, Step
from featstore.schema import K, shown

T = TypeVar("T")


def _integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _numpy(value: object, kind: str) -> bool:
    """Whether `value` is numpy's `kind` ('ndarray', 'generic'); read without importing numpy (a process that made
    a numpy value has imported it), so that reading a command's arguments costs no numpy import."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, getattr(np, kind))


def plain(value: T) -> T:
    """A numpy scalar as the Python number it holds (DuckDB binds no numpy scalar); anything else as it is."""
    return value.item() if _numpy(value, "generic") else value


def _items(given: object) -> list | None:
    """The items of a list, tuple, set or array a caller gave (an array's as Python's numbers); None for a
    single value, a string among them (a string is a value, never its letters)."""
    given = given.tolist() if _numpy(given, "ndarray") else given
    if isinstance(given, str | bytes | os.PathLike) or not isinstance(given, Iterable):
        return None
    return list(given)


def integers(given: object, field: str, what: str) -> list[int] | None:
    """Whole numbers as a caller gives them -> Python ints (None: the default): one integer, or a list, tuple or
    array of them, numpy's included (DuckDB binds no numpy scalar); anything else is one line naming `field`. Their
    range is the caller's to check."""
    if given is None:
        return None
    if _integer(given) or (_numpy(given, "ndarray") and given.ndim == 0 and _integer(given.tolist())):
        return [int(given)]
    items = _items(given)
    if items == []:
        raise FeatstoreError(f"{field}=[]: give at least one of the {what} (or leave `{field}` out for the "
                             f"default)")
    if items is None or not all(_integer(k) for k in items):
        raise FeatstoreTypeError(f"{field}={shown(given)}: give {what} as integers (one, or a list)")
    return [int(k) for k in items]


def windows(ks: object, field: str = "k") -> list[int] | None:
    """Stability windows as a caller gives them (`integers`): one k or a list; their range is the anchors'
    (`stability_windows`). A string ('3,4') is the CLI's spelling, refused here."""
    return integers(ks, field, "stability windows")


def fraction(value: object, field: str) -> float:
    """A confidence or share as a caller gives it (numpy's floats too) -> a float; a string or anything but a
    real number is one line naming `field` (the range is the caller's to check)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise FeatstoreTypeError(f"{field}={shown(value)}: give a number from 0 to 1")
    return float(value)


def fractions(given: object, field: str) -> list[float] | None:
    """Confidence thresholds as a caller gives them: one number, or a list, tuple or array of them -> floats
    (None: the default)."""
    if given is None:
        return None
    items = _items(given)
    return [fraction(v, field) for v in ([given] if items is None else items)]


def image_id(value: object) -> int:
    """An image id as a caller gives it (numpy's integers too, as `model.image_ids` holds them) -> an int."""
    if _numpy(value, "ndarray") and value.ndim == 0:
        value = value.tolist()
    if not _integer(value):
        raise FeatstoreTypeError("give an image id, an integer (the `images` table "
                                 "lists them)", field="image_id", value=value)
    return int(value)


def databases(given: object, field: str = "db", empty: bool = False) -> list[Path]:
    """Database paths as a caller gives them -> absolute paths (where they are now, whatever the working folder
    later): one path (a string or a Path, never read letter by letter) or a list of them; `empty`: no database
    at all is a choice."""
    items = _items(given)
    paths = [given] if items is None else items
    if not all(isinstance(p, str | os.PathLike) for p in paths):
        raise FeatstoreTypeError(f"{field}={shown(given)}: give a database's path, or a list of them")
    if not paths and not empty:
        raise FeatstoreError(f"{field}=[]: give a database's path, or a list of them")
    if any(not str(p) for p in paths):
        raise FeatstoreError(f"{field}={shown(given)}: an empty path names no database")
    return [Path(p).absolute() for p in paths]


def database(given: object, field: str = "db") -> Path:
    """One database's path as a caller gives it -> an absolute path; anything but a path is one line naming
    `field`."""
    if not isinstance(given, str | os.PathLike):
        raise FeatstoreTypeError(f"{field}={shown(given)}: give a database's path")
    return databases(given, field)[0]


def run_ids(given: str | Sequence[str] | None) -> list[str] | None:
    """Run ids from a comma list ('a,b'; None or empty: the command's default runs). A piece continues the id
    before it, whose variant spells several parameters (`…/knn:metric=euclidean,ties=lowest/train=clean`), unless
    it starts like a run id: a model key (never with '=') and a '/'. A sequence is taken as the ids themselves."""
    if given is None:
        return None
    if not isinstance(given, str):
        items = _items(given)
        if items is None or not all(isinstance(r, str) for r in items):
            raise FeatstoreTypeError("give run ids, a list of them or a comma list", field="runs", value=given)
        return items or None
    from featstore.records import RunIdentity  # with numpy: only a comma list of runs needs it

    chosen: list[str] = []
    for piece in (r.strip() for r in given.split(",")):
        if chosen and piece and not RunIdentity.begins_run_id(piece):
            chosen[-1] += "," + piece
        elif piece:
            chosen.append(piece)
    return chosen or None


def only_run(db: Db, given: str | None) -> str:
    """The run a one-run command works on: the one given, else the database's only run; several is one line
    naming them."""
    if given is not None:
        if not isinstance(given, str):
            raise FeatstoreTypeError("give a run id (.runs lists them)", field="run", value=given)
        return given
    from featstore.analytics.queries import runs

    have = runs(db)["run_id"].to_list()
    if not have:
        raise FeatstoreError(f"{db} holds no probe run; run ", Step("fs.probe(...)", "probe"), " first", field="run")
    if len(have) > 1:
        named = ", ".join(have[:8]) + (f" … ({len(have)} in all)" if len(have) > 8 else "")
        raise FeatstoreError(f"{db} holds {len(have)} runs ({named}); name one with ", Name("run", "RUN_ID"),
                             field="run")
    return have[0]


def one_window(db: Db, ks: Sequence[int] | None = None, chosen: Sequence[str] | None = None) -> int:
    """The one stability window of a part that shows one (compare, one image's timeline, the report's one-window
    sections): the one k asked for; of several (the default 1..4 trimmed to the runs' anchors among them), 2; a
    list without 2 is refused rather than one of it taken quietly. Each k is checked against the runs' anchors."""
    windows = stability_windows(db, ks, chosen)
    if len(windows) == 1:
        return windows[0]
    if K in windows:
        return K
    raise FeatstoreError(f"this command shows one stability window, the one k given, or {K} of a list holding it "
                         "(as the default 1,2,3,4 does); give one, e.g. ", Name("k", windows[0]), field="k",
                         value=list(windows))


def runs_written(db: str | Path) -> dict[str, str]:
    """Run id -> when it was written ('YYYY-MM-DD HH:MM'), of the runs already in `db` (none when it does not exist
    yet). Read without waiting for a lock: a database another process writes is refused at once (a probe job would
    refuse it too), not after `featstore sql`'s wait for a probe's final transaction."""
    from featstore.analytics.db import connect
    from featstore.analytics.queries import runs

    if not Path(db).is_file():
        return {}
    con = connect(db, read_only=True)
    try:
        return {r["run_id"]: f"{r['created_at']:%Y-%m-%d %H:%M}" if r["created_at"] else "earlier"
                for r in runs(con).iter_rows(named=True)}
    finally:
        con.close()


def probe_summary(db: Db, run_id: str):
    """Per anchor of a run: accuracy on its scored images (the test split) and whether the fit converged; a run
    the database does not hold is one line naming it, not an empty table."""
    if not isinstance(run_id, str):
        raise FeatstoreTypeError("give a run id (.runs lists them)", field="run", value=run_id)
    from featstore.analytics.queries import query, runs

    summary = query(db, "SELECT * FROM probe_summary(?)", [run_id])
    if summary.is_empty() and run_id not in runs(db)["run_id"].to_list():
        raise FeatstoreError(f"run {run_id!r}: no such run in the database (.runs lists them)")
    return summary
