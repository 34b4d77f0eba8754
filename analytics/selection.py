"""Which runs and which stability window a command reads: the rules every one-run or one-window command shares,
so that the CLI and the Python API choose alike."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from featstore.analytics.queries import Db, query, runs, stability_windows
from featstore.errors import FeatstoreError

ONE_WINDOW = 2  # the window a one-window part shows when several are asked for (the default list among them)


def run_ids(given: str | Sequence[str] | None) -> list[str] | None:
    """Run ids from a comma list ('a,b'; None or empty: the command's default runs). A piece continues the id
    before it, whose variant spells several parameters (`…/knn:metric=euclidean,ties=lowest/train=clean`), unless
    it starts like a run id: a model key (never with '=') and a '/'. A sequence is taken as the ids themselves."""
    if given is None:
        return None
    if not isinstance(given, str):
        return list(given) or None
    chosen: list[str] = []
    for piece in (r.strip() for r in given.split(",")):
        if chosen and piece and ("/" not in piece or "=" in piece.partition("/")[0]):
            chosen[-1] += "," + piece
        elif piece:
            chosen.append(piece)
    return chosen or None


def only_run(db: Db, given: str | None) -> str:
    """The run a one-run command works on: the one given, else the database's only run; several is one line
    naming them."""
    if given is not None:
        return given
    have = runs(db)["run_id"].to_list()
    if not have:
        raise FeatstoreError(f"`run`: {db} holds no probe run; run featstore probe first")
    if len(have) > 1:
        named = ", ".join(have[:8]) + (f" … ({len(have)} in all)" if len(have) > 8 else "")
        raise FeatstoreError(f"`run`: {db} holds {len(have)} runs ({named}); name one with run=RUN_ID")
    return have[0]


def one_window(db: Db, ks: Sequence[int] | None = None, chosen: Sequence[str] | None = None) -> int:
    """The one stability window of a part that shows one (compare, one image's timeline, the report's one-window
    sections): the one k asked for; of several (the default 1..4 trimmed to the runs' anchors among them), 2; a
    list without 2 is refused rather than one of it taken quietly. Each k is checked against the runs' anchors."""
    windows = stability_windows(db, ks, chosen)
    if len(windows) == 1:
        return windows[0]
    if ONE_WINDOW in windows:
        return ONE_WINDOW
    raise FeatstoreError(f"k={','.join(map(str, windows))}: this command shows one stability window, the one k "
                         f"given, or 2 of a list holding it (as the default 1,2,3,4 does); give one, e.g. "
                         f"k={windows[0]}")


def runs_written(db: str | Path) -> dict[str, str]:
    """Run id -> when it was written ('YYYY-MM-DD HH:MM'), of the runs already in `db` (none when it does not exist
    yet). Read without waiting for a lock: a database another process writes is refused at once (a probe job would
    refuse it too), not after `featstore sql`'s wait for a probe's final transaction."""
    from featstore.analytics.db import connect

    if not Path(db).is_file():
        return {}
    con = connect(db, read_only=True)
    try:
        return {r["run_id"]: f"{r['created_at']:%Y-%m-%d %H:%M}" if r["created_at"] else "earlier"
                for r in runs(con).iter_rows(named=True)}
    finally:
        con.close()


def probe_summary(db: Db, run_id: str):
    """Per anchor of a run: accuracy on its scored images (the test split) and whether the fit converged."""
    return query(db, "SELECT * FROM probe_summary(?)", [run_id])
