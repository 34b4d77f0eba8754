"""Readouts of a run beside the decision timeline, as Polars DataFrames: overthinking (Kaya et al.), calibration
(Guo et al.) and the linear CKA of a model's anchors (Kornblith et al.). Each point figure is one SQL macro (or the
`anchor_cka` table) called as `analytics.queries` calls the others, so Python and any DuckDB client agree; what
needs resampling (overthinking's permutation null, calibration's bootstrap intervals) is numpy's, here, over the
per-image rows a macro returns (docs/design.md §7)."""

from __future__ import annotations

from collections.abc import Sequence

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
    return overthinking_runs(db, [run_id], scope, draws, seed)[run_id]


def overthinking_runs(db: Db, run_ids: Sequence[str], scope: str = SCOPE, draws: int = NULL_DRAWS,
                      seed: int = NULL_SEED) -> dict[str, pl.DataFrame]:
    """`overthinking` of each run, by run id: the figures each run gets alone, with one set of permutations drawn
    for the runs whose head-right and head-wrong groups are of the same sizes (`overthinking_nulls`)."""
    if isinstance(draws, bool) or not isinstance(draws, int | np.integer) or draws < 1:
        raise FeatstoreError(f"draws {draws!r}: give a whole number of permutations >= 1 (e.g. draws={NULL_DRAWS})")
    con = _connection(db)
    try:
        shares, rows = {}, {}
        for run_id in run_ids:
            shares[run_id] = query(con, "SELECT * FROM overthinking(?, scope := ?)", [run_id, check_scope(scope)])
            rows[run_id] = query(con, "SELECT image_id, label, head_right, anchor, pred, t FROM "
                                      "overthinking_timelines(?, scope := ?)", [run_id, scope])
    finally:
        if con is not db:
            con.close()
    drawn = [run_id for run_id in run_ids if not shares[run_id].is_empty() and not rows[run_id].is_empty()]
    nulls = dict(zip(drawn, overthinking_nulls([rows[run_id] for run_id in drawn], int(draws), seed), strict=True))
    return {run_id: shares[run_id].join(nulls[run_id], on="anchor", how="left", maintain_order="left")
            if run_id in nulls else shares[run_id] for run_id in run_ids}


def _connection(db: Db) -> duckdb.DuckDBPyConnection:
    """One connection for a readout's queries: the caller's, or one opened read-only here."""
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
    return overthinking_nulls([rows], draws, seed, level)[0]


def overthinking_nulls(frames: Sequence[pl.DataFrame], draws: int = NULL_DRAWS, seed: int = NULL_SEED,
                       level: float = INTERVAL_LEVEL) -> list[pl.DataFrame]:
    """`overthinking_null` of each frame of rows. The permutations depend only on the seed, the draws and the two
    groups' sizes, so the frames whose groups are of the same sizes (a model's runs over the same images and head)
    share one set, drawn once: each frame's figures are those it gets alone."""
    timelines = [_timelines(rows) for rows in frames]
    by_sizes: dict[tuple[int, int], list[int]] = {}
    for k, (*_, head_right) in enumerate(timelines):
        by_sizes.setdefault((int(head_right.sum()), int((~head_right).sum())), []).append(k)
    counts: list[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]] = [{} for _ in frames]
    for same in by_sizes.values():
        rng = np.random.default_rng(seed)
        for group, share in ((True, "wasteful_by"), (False, "destructive_by")):
            members = [np.flatnonzero(timelines[k][2] == group) for k in same]
            parts = _group_nulls([(timelines[k][0][m], timelines[k][1][m]) for k, m in zip(same, members,
                                                                                          strict=True)], draws, rng)
            for k, part in zip(same, parts, strict=True):
                counts[k][share] = part
    return [_null_columns(counts[k], len(timelines[k][1]), timelines[k][0].shape[1], draws, seed, level)
            for k in range(len(frames))]


def _timelines(rows: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images (by id) x anchors: each timeline's first predictions of a class (`_first_occurrences`), each image's
    label and whether the head gets it right."""
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
    return _first_occurrences(preds, absent), labels, head_right


def _null_columns(counts: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], n: int, width: int, draws: int,
                  seed: int, level: float) -> pl.DataFrame:
    """The null's frame from each group's observed, expected and drawn counts right by each anchor."""
    observed, expected, drawn = ({share: part[i] for share, part in counts.items()} for i in range(3))
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


def _group_nulls(groups: Sequence[tuple[np.ndarray, np.ndarray]], draws: int,
                 rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per group of the same size (its first-prediction matrix and labels): its observed count right by each
    anchor, the exact expectation under the labels' shuffle and `draws` shuffled counts (draws x anchors), every
    group under the same permutations, drawn from `rng` one per draw."""
    size = len(groups[0][1])
    counters = [_GroupCounter(firsts, labels) for firsts, labels in groups]
    if size:
        for start in range(0, draws, _BLOCK):
            orders = np.stack([rng.permutation(size) for _ in range(start, min(draws, start + _BLOCK))])
            lookups: dict[bytes, np.ndarray] = {}  # the groups of the same labels look their draws up alike
            for counter in counters:
                counter.add(orders, lookups)
    return [(c.observed, c.expected, np.concatenate(c.drawn) if c.drawn else np.zeros((draws, c.width), np.int64))
            for c in counters]


class _GroupCounter:
    """One group's counts right by each anchor: observed, expected under the labels' shuffle, and under each
    block of permutations given to `add` (rows of `drawn`)."""

    def __init__(self, firsts: np.ndarray, labels: np.ndarray) -> None:
        self.firsts, self.labels = firsts, labels
        size, self.width = firsts.shape
        self.drawn: list[np.ndarray] = []
        if size == 0:
            self.observed, self.expected = np.zeros(self.width, dtype=np.int64), np.zeros(self.width)
            return
        self.observed = np.cumsum((firsts == labels[:, None]).sum(axis=0))
        classes, counts = np.unique(labels, return_counts=True)
        where = np.clip(np.searchsorted(classes, firsts), 0, len(classes) - 1)
        matched = classes[where] == firsts
        weight = np.where(matched, counts[where], 0)  # how many of the group's labels each cell matches
        self.expected = np.cumsum(weight.sum(axis=0)) / size
        table = size * len(classes) <= _TABLE_CELLS
        self.at = _match_anchors(where, matched, len(classes)).ravel() if table else None
        self.label_class, self.row = np.searchsorted(classes, labels), np.arange(size) * len(classes)
        self.key = labels.tobytes()

    def add(self, orders: np.ndarray, lookups: dict[bytes, np.ndarray]) -> None:
        """Count each permutation's hits (draws x images: permutation[i], the image whose label image i gets);
        `lookups` keeps each block's cells per labels, for the groups of the same labels."""
        block, width = len(orders), self.width
        if self.at is None:
            hits = (self.firsts[None, :, :] == self.labels[orders][:, :, None]).sum(axis=1)
        else:  # the anchor each image matches its drawn label at (width: none), counted per draw
            if self.key not in lookups:  # per image, its cell of `at`: (image, class of the label it gets)
                lookups[self.key] = self.label_class[orders] + self.row
            cells = np.take(self.at, lookups[self.key])
            cells += (np.arange(block, dtype=cells.dtype) * (width + 1))[:, None]
            hits = np.bincount(cells.ravel(), minlength=block * (width + 1)).reshape(-1, width + 1)[:, :width]
        self.drawn.append(np.cumsum(hits, axis=1))


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
    blocks = bootstrap_counts(seed, n, replicates)
    if binning == "mass":
        ids = frame["image_id"].to_numpy().reshape(width, n)
        ece, mce = _mass_errors(hit, conf, ids, blocks, bins, min_n)
    else:
        ece, mce = _width_errors(hit, conf, frame["bin"].to_numpy().reshape(width, n) - 1, blocks, bins, min_n)
    mce[~np.isfinite(mce)] = np.nan
    quantiles = [(1 - level) / 2, (1 + level) / 2]
    ece_lo, ece_hi = np.quantile(ece, quantiles, axis=0)
    with np.errstate(all="ignore"):
        mce_lo, mce_hi = _nanquantile(mce, quantiles)
    return pl.DataFrame({"anchor": anchors, "ece_lo": ece_lo, "ece_hi": ece_hi, "mce_lo": mce_lo, "mce_hi": mce_hi,
                         "replicates": np.full(width, replicates), "seed": np.full(width, seed)}
                        ).with_columns(pl.col("mce_lo", "mce_hi").fill_nan(None))


def _width_errors(hit: np.ndarray, conf: np.ndarray, bin_of: np.ndarray, blocks: list[np.ndarray], bins: int,
                  min_n: int) -> tuple[np.ndarray, np.ndarray]:
    """ECE and MCE (replicates x anchors) of equal-width bins (`bin_of`: each image's 0-based bin per anchor, kept
    on a resample) under blocks of bootstrap counts (replicates x images), a block at once. A bin's size and hits
    are sums of whole numbers, exact in any order; its confidence sum adds copies x conf one image after another in
    id order, as `numpy.bincount` over the images adds them, so a replicate's figures do not depend on its block."""
    width, n = conf.shape
    layouts = [_bin_layout(hit[a], conf[a], bin_of[a]) for a in range(width)]
    ece, mce = [], []
    for counts in blocks:
        copies = np.ascontiguousarray(counts.T)  # images x replicates, the counts' own small type
        size, misses, confs = (np.zeros((len(counts), width, bins)) for _ in range(3))
        for a, (order, starts, used, wrong, wrong_starts, wrong_used, conf_sorted) in enumerate(layouts):
            by_bin = copies[order].astype(np.float64)
            size[:, a, used] = _run_sums(by_bin, starts)
            misses[:, a, wrong_used] = _run_sums(copies[wrong], wrong_starts, np.int64)
            confs[:, a, used] = _run_sums(np.multiply(by_bin, conf_sorted, out=by_bin), starts)
        block_ece, block_mce = _errors(size - misses, confs, size, n, min_n)
        ece.append(block_ece)
        mce.append(block_mce)
    return np.concatenate(ece), np.concatenate(mce)


def _bin_layout(hit: np.ndarray, conf: np.ndarray, bin_of: np.ndarray) -> tuple[np.ndarray, ...]:
    """One anchor's images ordered by bin (by id within a bin), where each non-empty bin starts and which bins
    those are; the same for its images whose probe is wrong; and the confidences in the first order (a column)."""
    order = np.argsort(bin_of, kind="stable")
    used, starts = np.unique(bin_of[order], return_index=True)
    wrong = order[hit[order] == 0]
    wrong_used, wrong_starts = np.unique(bin_of[wrong], return_index=True)
    return order, starts, used, wrong, wrong_starts, wrong_used, conf[order][:, None]


def _run_sums(values: np.ndarray, starts: np.ndarray, dtype: type | None = None) -> np.ndarray:
    """Columns x runs: each column's sum over each run of rows (from one of `starts` to the next), in `dtype`.
    Floats are added row by row in order: numpy adds that way along an axis that is not the fast one in memory
    (its pairwise summation is only for the fast axis), so a lone column is given a second, of zeros, and dropped."""
    columns = values.shape[1]
    if len(starts) == 0:  # no rows (say, no image the probe got wrong): no runs
        return np.zeros((columns, 0), dtype=dtype or values.dtype)
    if columns == 1:
        values = np.hstack([values, np.zeros_like(values)])
    ends = np.append(starts[1:], len(values))
    return np.stack([np.add.reduce(values[s:e], axis=0, dtype=dtype) for s, e in zip(starts, ends, strict=True)],
                    axis=1)[:columns]


def _mass_errors(hit: np.ndarray, conf: np.ndarray, ids: np.ndarray, blocks: list[np.ndarray], bins: int,
                 min_n: int) -> tuple[np.ndarray, np.ndarray]:
    """ECE and MCE (replicates x anchors) of equal-mass bins, formed again on each resample: the bins are runs of
    the sorted resample, so their sums are differences of prefix sums."""
    width, n = conf.shape
    order = np.stack([np.lexsort((ids[a], conf[a])) for a in range(width)])
    hit, conf = np.take_along_axis(hit, order, axis=1), np.take_along_axis(conf, order, axis=1)
    edges = np.concatenate([[0], np.cumsum([len(part) for part in np.array_split(np.arange(n), bins)])])
    size = np.broadcast_to(np.diff(edges).astype(np.float64), (width, bins))
    ece, mce = [], []
    for counts in blocks:
        for row in counts:
            copies = row.astype(np.int64)[order]
            cum = np.cumsum(copies, axis=1)
            hits = np.diff(_prefix_sums(cum, hit, copies, edges), axis=1)
            confs = np.diff(_prefix_sums(cum, conf, copies, edges), axis=1)
            one_ece, one_mce = _errors(hits, confs, size, n, min_n)
            ece.append(one_ece)
            mce.append(one_mce)
    return np.stack(ece), np.stack(mce)


def _errors(hits: np.ndarray, confs: np.ndarray, size: np.ndarray, n: int, min_n: int) -> tuple[np.ndarray, ...]:
    """ECE and MCE (-inf: no bin of min_n images) from each bin's hits, confidence sum and size (last axis: bins)."""
    gap = np.abs(hits - confs)
    bin_gap = np.divide(gap, size, out=np.zeros_like(gap), where=size > 0)
    return gap.sum(axis=-1) / n, np.where(size >= min_n, bin_gap, -np.inf).max(axis=-1)


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
