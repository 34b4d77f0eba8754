"""A featstore database read from Python, read-only (`connect`): SQL, the runs, one image's timeline."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from featstore.errors import FeatstoreError

if TYPE_CHECKING:
    import polars as pl


class Results:
    """A featstore database, read-only through the sandbox `featstore sql` uses (each query opens and closes it, so
    a probe job can write between two queries)."""

    def __init__(self, db: str | Path | Sequence[str | Path]):
        from featstore.analytics.queries import open_read_only

        self.db = [Path(d).absolute() for d in db] if isinstance(db, list | tuple) else Path(db).absolute()
        open_read_only(self.db).close()  # a missing or foreign file is an error now

    def sql(self, query: str, params: Sequence | dict | None = None) -> pl.DataFrame:
        """One statement -> a Polars DataFrame (the macros of `sql/` are there: decision_layers(2), ...)."""
        from featstore.analytics.queries import query as run_query

        return run_query(self.db, query, params)

    @property
    def runs(self) -> pl.DataFrame:
        from featstore.analytics.queries import runs

        return runs(self.db)

    def timeline(self, run: str, image_id: int) -> pl.DataFrame:
        """One image's predictions and confidences under one run, one row per anchor."""
        frame = self.sql("SELECT anchor, pred, conf FROM predictions WHERE run_id = ? AND image_id = ? "
                         "ORDER BY anchor", [run, int(image_id)])
        if not len(frame):
            raise FeatstoreError(f"no predictions of image {image_id} under run {run!r} (see .runs)")
        return frame


def connect(db: str | Path | Sequence[str | Path]) -> Results:
    """A database (or several, as one) read-only: `.sql(query)`, `.runs`, `.timeline(run, image_id)`."""
    return Results(db)
