"""Readouts of a run beside the decision timeline, as Polars DataFrames: overthinking (Kaya et al.), calibration
(Guo et al.) and the linear CKA of a model's anchors (Kornblith et al.). Each is one SQL macro (or the
`anchor_cka` table) called as `analytics.queries` calls the others, so Python and any DuckDB client agree."""

from __future__ import annotations

import polars as pl

from featstore.analytics.queries import Db, check_scope, query


def first_correct(db: Db, run_id: str, scope: str = "auto") -> pl.DataFrame:
    """Per image the first anchor whose probe is right (null where none is): the run's earliest possible exit."""
    return query(db, "SELECT * FROM first_correct(?, scope := ?)", [run_id, check_scope(scope)])


def overthinking(db: Db, run_id: str, scope: str = "auto") -> pl.DataFrame:
    """Per anchor the share right by then, and the run's wasteful and destructive shares against the head."""
    return query(db, "SELECT * FROM overthinking(?, scope := ?)", [run_id, check_scope(scope)])


def calibration(db: Db, run_id: str, bins: int = 15, scope: str = "auto") -> pl.DataFrame:
    """Per anchor the expected calibration error of its probe's confidences (equal-width bins; bins < 1 is refused
    by the macro, sql/calibration_bins.sql, for every caller alike)."""
    return query(db, "SELECT * FROM calibration(?, bins := ?, scope := ?)",
                 [run_id, bins, check_scope(scope)])


def calibration_bins(db: Db, run_id: str, bins: int = 15, scope: str = "auto") -> pl.DataFrame:
    """The reliability diagram's bins behind `calibration`: share, accuracy and mean confidence per bin."""
    return query(db, "SELECT * FROM calibration_bins(?, bins := ?, scope := ?)",
                 [run_id, bins, check_scope(scope)])


def anchor_cka(db: Db, model: str | None = None, view: str | None = None,
               estimator: str | None = None) -> pl.DataFrame:
    """The stored CKA of every pair of anchors (`featstore cka`), with the anchors' names where the database
    has them; empty where nothing was computed."""
    return query(db, "SELECT * FROM anchor_cka_named WHERE (? IS NULL OR model = ?) AND (? IS NULL OR view = ?) "
                     "AND (? IS NULL OR estimator = ?) ORDER BY model, view, estimator, anchor_a, anchor_b",
                 [model, model, view, view, estimator, estimator])
