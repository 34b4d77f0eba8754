"""Readouts of a run beside the decision timeline, as Polars DataFrames: overthinking (Kaya et al.), calibration
(Guo et al.) and the linear CKA of a model's anchors (Kornblith et al.). Each point figure is one SQL macro (or the
`anchor_cka` table) called as `analytics.queries` calls the others, so Python and any DuckDB client agree; what
needs resampling (overthinking's permutation null, calibration's bootstrap intervals) is numpy's, here, over the
per-image rows a macro returns (docs/design.md §7)."""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl

from featstore.analytics.queries import Db, check_scope, open_read_only, query
from featstore.analytics.robustness import bootstrap_counts
from featstore.errors import FeatstoreError
from featstore.schema import (
    CALIBRATION_BINNINGS,
    CALIBRATION_BINS,
    CALIBRATION_MIN_N,
    CALIBRATION_REPLICATES,
    CALIBRATION_SEED,
    INTERVAL_LEVEL,
    NULL_DRAWS,
    NULL_SEED,
    SCOPE,
)

BY_SHARES = ("correct_by", "wasteful_by", "destructive_by")  # per anchor: each gets _null, _null_lo, _null_hi, _p
RUN_SHARES = ("wasteful", "destructive")  # over the run (the by-shares at anchor T - 1): the same four columns
_BLOCK = 64  # permutations compared against the prediction matrix at once
_TABLE_CELLS = 1 << 24  # images x classes of overthinking's lookup table (int32) past which draws compare instead


def first_correct(db: Db, run_id: str, scope: str = SCOPE) -> pl.DataFrame:
    """Per image the first anchor whose probe is right (null where none is): the run's earliest possible exit."""
    return query(db, "SELECT * FROM first_correct(?, scope := ?)", [run_id, check_scope(scope)])


def overthinking(db: Db, run_id: str, scope: str = SCOPE, draws: int = NULL_DRAWS,
                 seed: int = NULL_SEED) -> pl.DataFrame:
    """Per anchor the share right by then, and the run's wasteful and destructive shares against the head, each
    beside its label-blind permutation null (`overthinking_null`): the null's mean (<share>_null), its 95% interval
    (<share>_null_lo, <share>_null_hi) and the permutation p-value (<share>_p); `draws` and `seed` say how."""
    if isinstance(draws, bool) or not isinstance(draws, int | np.integer) or draws < 1:
        raise FeatstoreError(f"draws {draws!r}: give a whole number of permutations >= 1 (e.g. draws={NULL_DRAWS})")
    con = _connection(db)
    try:
        shares = query(con, "SELECT * FROM overthinking(?, scope := ?)", [run_id, check_scope(scope)])
        rows = query(con, "SELECT image_id, label, head_right, anchor, pred, t FROM overthinking_timelines(?, "
                          "scope := ?)", [run_id, scope])
    finally:
        if con is not db:
            con.close()
    if shares.is_empty() or rows.is_empty():
        return shares
    nulls = overthinking_null(rows, int(draws), seed)
    return shares.join(nulls, on="anchor", how="left", maintain_order="left")


def _connection(db: Db) -> duckdb.DuckDBPyConnection:
    """One connection for a readout's two queries: the caller's, or one opened read-only here."""
    return db if isinstance(db, duckdb.DuckDBPyConnection) else open_read_only(db)


def overthinking_null(rows: pl.DataFrame, draws: int = NULL_DRAWS, seed: int = NULL_SEED,
                      level: float = INTERVAL_LEVEL) -> pl.DataFrame:
    """The label-blind null of overthinking's shares from `overthinking_timelines` rows (image_id, label,
    head_right, anchor, pred, t): within the images the head gets right, and within those it gets wrong, the labels
    are shuffled among the images, each image keeping its timeline of predictions; the share right at some anchor
    <= l is counted again. Per anchor and share: the null's mean (exact: the expectation over every permutation),
    the percentile interval of `draws` permutations at `level`, and p = (1 + #{draws >= observed}) / (draws + 1)
    (one-sided: more right than the labels' shuffle gives). The permutations: `numpy.random.default_rng(seed)`;
    for the head-right group, then the head-wrong group (each's images ordered by image_id), `draws` calls of
    `rng.permutation(n_group)`, in order; the label of image i in draw d is the group's label at
    permutation[i]. Counts are compared as integers, so the figures do not depend on blocks or threads."""
    ids, image = np.unique(rows["image_id"].to_numpy(), return_inverse=True)
    anchor = rows["anchor"].to_numpy().astype(np.int64)
    n, width = len(ids), int(rows["t"].max()) + 1
    labels = np.empty(n, dtype=np.int64)
    labels[image] = rows["label"].to_numpy()
    head_right = np.zeros(n, dtype=bool)
    head_right[image] = rows["head_right"].to_numpy()
    absent = int(labels.min()) - 1  # no label: a missing anchor is never right
    preds = np.full((n, width), absent, dtype=np.int64)
    preds[image, anchor] = rows["pred"].to_numpy()
    firsts = _first_occurrences(preds, absent)
    observed, expected, drawn = {}, {}, {}
    rng = np.random.default_rng(seed)
    for group, share in ((True, "wasteful_by"), (False, "destructive_by")):
        members = np.flatnonzero(head_right == group)
        observed[share], expected[share], drawn[share] = _group_null(firsts[members], labels[members], draws, rng)
    for parts in (observed, expected, drawn):
        parts["correct_by"] = parts["wasteful_by"] + parts["destructive_by"]
    columns: dict[str, np.ndarray] = {"anchor": np.arange(width)}
    for share in BY_SHARES:
        null = drawn[share] / n
        low, high = np.quantile(null, [(1 - level) / 2, (1 + level) / 2], axis=0)
        p = (1 + (drawn[share] >= observed[share]).sum(axis=0)) / (draws + 1)
        columns |= {f"{share}_null": expected[share] / n, f"{share}_null_lo": low, f"{share}_null_hi": high,
                    f"{share}_p": p}
    internal = width - 2  # anchor T - 1: the run-wide shares, one figure on every row
    for share in RUN_SHARES:
        for part in ("null", "null_lo", "null_hi", "p"):
            value = columns[f"{share}_by_{part}"][internal] if internal >= 0 else float(part == "p")
            columns[f"{share}_{part}"] = np.full(width, value)  # no internal anchor (T = 0): 0, and p = 1
    columns |= {"draws": np.full(width, draws), "seed": np.full(width, seed)}
    return pl.DataFrame(columns).with_columns(pl.col("anchor").cast(pl.Int64))


def _first_occurrences(preds: np.ndarray, absent: int) -> np.ndarray:
    """The prediction matrix with every repeat of a class in an image's timeline blanked (`absent`): an image
    matches a label at most once, at the first anchor that predicts it."""
    firsts = preds.copy()
    for j in range(1, preds.shape[1]):
        seen = (preds[:, :j] == preds[:, j:j + 1]).any(axis=1)
        firsts[seen, j] = absent
    return firsts


def _group_null(firsts: np.ndarray, labels: np.ndarray, draws: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One group's observed count right by each anchor, its exact expectation under the labels' shuffle and
    `draws` shuffled counts (draws x anchors), the permutations drawn from `rng` one per draw."""
    size, width = firsts.shape
    drawn = np.zeros((draws, width), dtype=np.int64)
    if size == 0:
        return np.zeros(width, dtype=np.int64), np.zeros(width), drawn
    observed = np.cumsum((firsts == labels[:, None]).sum(axis=0))
    classes, counts = np.unique(labels, return_counts=True)
    where = np.clip(np.searchsorted(classes, firsts), 0, len(classes) - 1)
    matched = classes[where] == firsts
    weight = np.where(matched, counts[where], 0)  # how many of the group's labels each cell matches
    expected = np.cumsum(weight.sum(axis=0)) / size
    at = _match_anchors(where, matched, len(classes)) if size * len(classes) <= _TABLE_CELLS else None
    label_class = np.searchsorted(classes, labels)
    for start in range(0, draws, _BLOCK):
        stop = min(draws, start + _BLOCK)
        orders = np.stack([rng.permutation(size) for _ in range(start, stop)])
        if at is None:
            hits = (firsts[None, :, :] == labels[orders][:, :, None]).sum(axis=1)
        else:  # the anchor each image matches its drawn label at (width: none), counted per draw
            cells = at[np.arange(size), label_class[orders]].astype(np.int64)
            cells += (np.arange(stop - start) * (width + 1))[:, None]
            hits = np.bincount(cells.ravel(), minlength=(stop - start) * (width + 1)).reshape(-1, width + 1)[:, :width]
        drawn[start:stop] = np.cumsum(hits, axis=1)
    return observed, expected, drawn


def _match_anchors(where: np.ndarray, matched: np.ndarray, classes: int) -> np.ndarray:
    """Images x the group's classes: the anchor at which each image's timeline first predicts the class (the
    width of the timeline where it never does), from each cell's class index `where` where `matched`; a draw's
    hits are then one lookup per image."""
    size, width = where.shape
    at = np.full((size, classes), width, dtype=np.int32)
    rows, anchors = np.nonzero(matched)
    at[rows, where[rows, anchors]] = anchors
    return at


def calibration(db: Db, run_id: str, bins: int = CALIBRATION_BINS, scope: str = SCOPE,
                binning: str = CALIBRATION_BINNINGS[0], min_n: int = CALIBRATION_MIN_N,
                replicates: int = CALIBRATION_REPLICATES, seed: int = CALIBRATION_SEED) -> pl.DataFrame:
    """Per anchor the expected and maximum calibration error of its probe's confidences (sql/calibration.sql:
    equal-width or, binning='mass', equal-mass bins; only bins of at least `min_n` images set MCE; bins < 1 is
    refused by the macro, for every caller alike), with bootstrap intervals (`calibration_intervals`: ece_lo,
    ece_hi, mce_lo, mce_hi; `replicates` and `seed` say how)."""
    if isinstance(replicates, bool) or not isinstance(replicates, int | np.integer) or replicates < 1:
        raise FeatstoreError(f"replicates {replicates!r}: give a whole number of bootstrap resamples >= 1 "
                             f"(e.g. replicates={CALIBRATION_REPLICATES})")
    con = _connection(db)
    try:
        per_anchor = query(con, "SELECT * FROM calibration(?, bins := ?, scope := ?, binning := ?, min_n := ?)",
                           [run_id, bins, check_scope(scope), binning, min_n])
        if per_anchor.is_empty():
            return per_anchor
        images = query(con, "SELECT anchor, image_id, hit, conf, bin FROM calibration_images(?, bins := ?, "
                            "scope := ?, binning := ?)", [run_id, bins, scope, binning])
    finally:
        if con is not db:
            con.close()
    intervals = calibration_intervals(images, int(bins), binning, int(min_n), int(replicates), seed)
    return per_anchor.join(intervals, on="anchor", how="left", maintain_order="left")


def calibration_intervals(images: pl.DataFrame, bins: int, binning: str = CALIBRATION_BINNINGS[0],
                          min_n: int = CALIBRATION_MIN_N, replicates: int = CALIBRATION_REPLICATES,
                          seed: int = CALIBRATION_SEED, level: float = INTERVAL_LEVEL) -> pl.DataFrame:
    """Percentile bootstrap intervals of ECE and MCE per anchor from `calibration_images` rows (anchor, image_id,
    hit, conf, bin): the images resampled with replacement, each carrying all its anchors, and the bins formed
    again on the resample (binning 'width': each image keeps its bin; 'mass': the resample ordered by (conf,
    image_id), copies of an image together, cut into `bins` runs of equal count as the macro cuts them). MCE of a
    resample is the largest gap of its bins of at least `min_n` images (none: left out of its interval). The
    resamples: the images ordered by id (n), `numpy.random.default_rng(seed)`, replicate b draws
    `rng.integers(0, n, n)` (one call per replicate, in order); the interval is numpy's linear (nan)quantile of the
    replicates at (1 - level) / 2 and (1 + level) / 2."""
    frame = images.sort("anchor", "image_id")
    anchors = frame["anchor"].unique(maintain_order=True).to_numpy()
    n = frame["image_id"].n_unique()
    if len(frame) != n * len(anchors):
        raise FeatstoreError("calibration's bootstrap needs every anchor's prediction for every image; this run's "
                             "anchors hold different images")
    width = len(anchors)
    hit = frame["hit"].to_numpy().astype(np.float64).reshape(width, n)
    conf = frame["conf"].to_numpy().astype(np.float64).reshape(width, n)
    ece = np.empty((replicates, width))
    mce = np.empty((replicates, width))
    if binning == "mass":  # bins are runs of the sorted resample: sums over them are differences of prefix sums
        ids = frame["image_id"].to_numpy().reshape(width, n)
        order = np.stack([np.lexsort((ids[a], conf[a])) for a in range(width)])
        hit, conf = np.take_along_axis(hit, order, axis=1), np.take_along_axis(conf, order, axis=1)
        edges = np.concatenate([[0], np.cumsum([len(part) for part in np.array_split(np.arange(n), bins)])])
        size = np.broadcast_to(np.diff(edges).astype(np.float64), (width, bins))
    else:
        keys = (np.arange(width)[:, None] * bins + frame["bin"].to_numpy().reshape(width, n) - 1).ravel()
        by_hit = keys * 2 + hit.ravel().astype(np.int64)  # (anchor, bin, hit): sizes and hits from one count
        conf_flat = conf.ravel()
    rows = (row for block in bootstrap_counts(seed, n, replicates) for row in block)
    for b in range(replicates):
        counts = next(rows).astype(np.int64)
        if binning == "mass":
            copies = counts[order]
            cum = np.cumsum(copies, axis=1)
            hits = np.diff(_prefix_sums(cum, hit, copies, edges), axis=1)
            confs = np.diff(_prefix_sums(cum, conf, copies, edges), axis=1)
        else:
            weights = np.tile(counts, width).astype(np.float64)
            split = np.bincount(by_hit, weights=weights, minlength=width * bins * 2).reshape(width, bins, 2)
            size, hits = split.sum(axis=2), split[:, :, 1]  # whole numbers: exact
            confs = np.bincount(keys, weights=conf_flat * weights, minlength=width * bins).reshape(width, bins)
        gap = np.abs(hits - confs)
        ece[b] = gap.sum(axis=1) / n
        bin_gap = np.divide(gap, size, out=np.zeros_like(gap), where=size > 0)
        mce[b] = np.where(size >= min_n, bin_gap, -np.inf).max(axis=1)
    mce[~np.isfinite(mce)] = np.nan
    quantiles = [(1 - level) / 2, (1 + level) / 2]
    ece_lo, ece_hi = np.quantile(ece, quantiles, axis=0)
    with np.errstate(all="ignore"):
        mce_lo, mce_hi = _nanquantile(mce, quantiles)
    return pl.DataFrame({"anchor": anchors, "ece_lo": ece_lo, "ece_hi": ece_hi, "mce_lo": mce_lo, "mce_hi": mce_hi,
                         "replicates": np.full(width, replicates), "seed": np.full(width, seed)}
                        ).with_columns(pl.col("mce_lo", "mce_hi").fill_nan(None))


def _prefix_sums(cum: np.ndarray, values: np.ndarray, copies: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per row, the sum of `values` over the first p copies of the sorted resample at each p of `edges` (row r
    holds copies[r, j] copies of values[r, j], cum their running count): anchors x edges."""
    totals = np.cumsum(values * copies, axis=1)
    out = np.empty((len(cum), len(edges)))
    for r in range(len(cum)):
        j = np.searchsorted(cum[r], edges, side="left")  # the image the p-th copy falls on
        inside = np.minimum(j, cum.shape[1] - 1)
        before, prior = np.where(j > 0, cum[r, j - 1], 0), np.where(j > 0, totals[r, j - 1], 0.0)
        out[r] = prior + (edges - before) * values[r, inside]
    return out


def _nanquantile(values: np.ndarray, quantiles: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """numpy's nanquantile per column, NaN (no warning) where a column has no number."""
    out = np.full((2, values.shape[1]), np.nan)
    for j in range(values.shape[1]):
        column = values[:, j][~np.isnan(values[:, j])]
        if len(column):
            out[:, j] = np.quantile(column, quantiles)
    return out[0], out[1]


def calibration_bins(db: Db, run_id: str, bins: int = CALIBRATION_BINS, scope: str = SCOPE,
                     binning: str = CALIBRATION_BINNINGS[0], min_n: int = CALIBRATION_MIN_N) -> pl.DataFrame:
    """The reliability diagram's bins behind `calibration`: n, share, accuracy and mean confidence per bin, and
    whether the bin is large enough (min_n) to set MCE."""
    return query(db, "SELECT * FROM calibration_bins(?, bins := ?, scope := ?, binning := ?, min_n := ?)",
                 [run_id, bins, check_scope(scope), binning, min_n])


def anchor_cka(db: Db, model: str | None = None, view: str | None = None,
               estimator: str | None = None) -> pl.DataFrame:
    """The stored CKA of every pair of anchors (`featstore cka`), with the anchors' names where the database
    has them; empty where nothing was computed."""
    return query(db, "SELECT * FROM anchor_cka_named WHERE (? IS NULL OR model = ?) AND (? IS NULL OR view = ?) "
                     "AND (? IS NULL OR estimator = ?) ORDER BY model, view, estimator, anchor_a, anchor_b",
                 [model, model, view, view, estimator, estimator])
