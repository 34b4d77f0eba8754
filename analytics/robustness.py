"""How much of a decision timeline is the network's: l*(k) and its early/mid/late band read under a set of probes
grouped in families (sql/robust_bands.sql, sql/robust_sweep.sql), with the raw agreement, Fleiss' kappa and a seeded
bootstrap interval for each figure.

A figure that moves between the probes of the set, or whose interval is wide, is not a property of the network
alone (docs/design.md §5, "Robustness"). Near-duplicate probes (one probe's neighbour-C runs) form one family with
one vote, so adding them neither lowers nor raises the agreement. The macros give the point figures to any DuckDB
client; the intervals are numpy's: by default over images with every probe fixed (one resampling shared by the
set); with `refits`, every probe seed of each run also joins the set and each replicate draws one seed per run, so
the interval covers refitting the probes too.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import polars as pl

from featstore.analytics.queries import Db, check_min_conf, check_scope, known_runs, query, stability_windows
from featstore.errors import FeatstoreError
from featstore.schema import MIN_CONF, SCOPE

REPLICATES = 1000  # bootstrap resamples of the images
SEED = 0
LEVEL = 0.95  # the percentile interval's coverage
FRACTIONS = ("f_early", "f_mid", "f_late", "never_stable")  # per run: each gets <name>_lo and <name>_hi
AGREEMENT = ("band_holds", "kappa")  # per set (two families or more): each gets <name>_lo and <name>_hi
BANDS = ("early", "mid", "late")
OVER_IMAGES = "images (probes fixed)"  # what an interval covers: the `interval_over` column
OVER_REFITS = "images and probe seeds"


def robust_bands(db: Db, kmax: int = 4, scope: str = SCOPE, run_set: Sequence[str] | None = None,
                 min_conf: float = MIN_CONF, seeds: bool = False) -> pl.DataFrame:
    """Per image and k = 1..kmax: its l*(k) and band under each probe of the set, its family, whether its family's
    vote is this run's, and whether the band holds under every family's vote (`run_set`: the declared set;
    default: every run of probe seed 0, or of every seed with `seeds`, without cross-fit, per model and view)."""
    chosen = known_runs(db, run_set) if run_set else None
    return query(db, "SELECT * FROM robust_bands(?, scope := ?, run_set := ?, min_conf := ?, seeds := ?)",
                 [kmax, check_scope(scope), chosen, check_min_conf(min_conf), bool(seeds)])


def robust_sweep(db: Db, ks: Sequence[int] | None = None, scope: str = SCOPE, run_set: Sequence[str] | None = None,
                 min_conf: float = MIN_CONF, replicates: int = REPLICATES, seed: int = SEED,
                 level: float = LEVEL, refits: bool = False) -> pl.DataFrame:
    """sql/robust_sweep.sql at the windows `ks` (each probe's fractions, the set's band_holds, kappa and each
    fraction's range over the set) with a percentile bootstrap interval (<name>_lo, <name>_hi) for each run's
    fractions and, with two families or more, for band_holds and kappa; `interval_over` says what varies in it.

    The bootstrap: per model, view and k, the images of the set's population sorted by id (n of them), and
    `numpy.random.default_rng(seed)`; replicate b draws n image indices with `integers(0, n, n)` (one call per
    replicate, in order), then, with `refits`, one member of each refit group (the runs that differ only in their
    probe seed, groups in the order of their first run id) with one `integers(0, sizes)` call; every figure on
    those rows and runs; the interval is numpy's linear `quantile` of the replicates at (1 - level) / 2 and
    (1 + level) / 2. `refits` also puts every seed of each run in the default set."""
    if replicates < 1 or not 0 < level < 1:
        raise FeatstoreError(f"bootstrap of {replicates} replicate(s) at level {level:g}: give at least 1 replicate "
                             f"and a level between 0 and 1")
    if not isinstance(refits, bool | np.bool_):
        raise FeatstoreError("give True (the interval covers the probe seeds too) or False",
                             field="refits", value=refits)
    chosen = known_runs(db, run_set) if run_set else None
    ks = stability_windows(db, ks, chosen)
    sweep = query(db, "SELECT * FROM robust_sweep(?, scope := ?, run_set := ?, min_conf := ?, seeds := ?)",
                  [max(ks), check_scope(scope), chosen, check_min_conf(min_conf), bool(refits)]
                  ).filter(pl.col("k").is_in(ks))
    if sweep.is_empty():
        return sweep
    bands = query(db, "SELECT model, view, k, image_id, run_id, band, never_stable, votes, refits FROM robust_bands("
                      "?, scope := ?, run_set := ?, min_conf := ?, seeds := ?) WHERE list_contains(?, k) "
                      "ORDER BY model, view, k", [max(ks), scope, chosen, min_conf, bool(refits), list(ks)])
    # each model, view and k a slice of the rows (a group_by would hash and gather all of them: ~80 MB at 48,000
    # images), the columns the intervals read
    group = bands.select(pl.struct("model", "view", "k").rle_id()).to_series().to_numpy()
    starts = np.flatnonzero(np.diff(group, prepend=-1))
    intervals = [_intervals(bands[start:stop], replicates, seed, level, bool(refits))
                 for start, stop in zip(starts, np.append(starts[1:], len(bands)), strict=True)]
    return (sweep.join(pl.concat(intervals), on=["model", "view", "k", "run_id"], how="left", maintain_order="left")
            .with_columns(interval_over=pl.lit(OVER_REFITS if refits else OVER_IMAGES)))


def fleiss_kappa(counts: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Fleiss' kappa of `counts` (images x categories: how many of the m raters put each image in each category;
    every row sums to m >= 2), each image counted `weights` times (a bootstrap draw); NaN where every vote is in one
    category (chance agreement 1)."""
    weights = np.ones(len(counts)) if weights is None else np.asarray(weights, dtype=np.float64)
    return float(_weighted_kappa(counts, _agreeing_pairs(counts), weights))


def _agreeing_pairs(counts: np.ndarray) -> np.ndarray:
    """Each image's count of agreeing ordered rater pairs (sum of squares - m), a whole number: the part of Fleiss'
    kappa that no bootstrap weight changes."""
    return ((counts * counts).sum(axis=1) - counts[0].sum()).astype(np.float64)


def _weighted_kappa(counts: np.ndarray, pairs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Fleiss' kappa under each row of `weights` (replicates x images, or one row)."""
    return _kappa(weights @ pairs, weights @ counts.astype(np.float64), weights.sum(axis=-1), counts[0].sum())


def _kappa(pairs: np.ndarray, votes: np.ndarray, total: np.ndarray, m: int) -> np.ndarray:
    """Fleiss' kappa from its weighted sums over the images: agreeing rater pairs, votes per category (last axis)
    and the images' total weight. With whole-number weights every sum is of whole numbers, exact in float64, so the
    figure does not depend on the order BLAS adds in."""
    observed = pairs / (m * (m - 1)) / total
    shares = votes / (total * m)[..., None]
    expected = (shares * shares).sum(axis=-1)
    with np.errstate(all="ignore"):
        return np.where(expected >= 1, np.nan, (observed - expected) / (1 - expected))


BLOCK = 64  # bootstrap replicates drawn and weighed at once: a block x images matrix of counts


def _image_counts(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """`size` replicates' draws of n image indices (the stream of `size` calls of `integers(0, n, n)`) as a
    replicates x images matrix of how often each image was drawn (the smallest unsigned type that holds them)."""
    counts = np.stack([np.bincount(row, minlength=n) for row in rng.integers(0, n, (size, n))])  # a row in cache
    return counts.astype(np.min_scalar_type(int(counts.max(initial=0))))


def bootstrap_counts(seed: int, n: int, replicates: int) -> list[np.ndarray]:
    """The image counts of `replicates` bootstrap draws of n images from `numpy.random.default_rng(seed)` (one
    `integers(0, n, n)` call each, in order), in blocks of BLOCK replicates x images: the same for every figure
    resampled with that seed over n images, so made once (the robustness intervals per model, view and k, and
    calibration's per run, share them)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        return _draw_counts(seed, n, replicates)
    return _cached_counts(int(seed), n, replicates)


def _draw_counts(seed, n: int, replicates: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [_image_counts(rng, n, min(BLOCK, replicates - start)) for start in range(0, replicates, BLOCK)]


@functools.lru_cache(maxsize=2)  # 1,000 replicates of 50,000 images: 50 MB each
def _cached_counts(seed: int, n: int, replicates: int) -> list[np.ndarray]:
    return _draw_counts(seed, n, replicates)


def _intervals(bands: pl.DataFrame, replicates: int, seed: int, level: float, refits: bool) -> pl.DataFrame:
    """One model, view and k: per run, the bootstrap interval of each fraction, and the set's of band_holds and
    kappa (images resampled alike for all; with `refits`, one seed drawn per refit group)."""
    table = bands.sort("image_id", "run_id")
    runs = table["run_id"].unique(maintain_order=True).to_list()
    n = table["image_id"].n_unique()
    code = table["band"].replace_strict({b: i for i, b in enumerate(BANDS)}, return_dtype=pl.Int64)
    codes = code.to_numpy().reshape(n, len(runs))
    never = table["never_stable"].to_numpy().reshape(n, len(runs)).astype(float)
    indicators = np.stack([codes == 0, codes == 1, codes == 2, never], axis=2).astype(float)  # image, run, fraction
    per_run = table.unique("run_id", keep="first", maintain_order=True)
    groups = list(dict.fromkeys(tuple(r) for r in per_run["refits"].to_list()))
    sizes = np.array([len(g) for g in groups])
    group_of = [groups.index(tuple(r)) for r in per_run["refits"].to_list()]
    voters = [i for i, votes in enumerate(per_run["votes"].to_list()) if votes]
    rng = np.random.default_rng(seed)
    fractions = np.empty((replicates, len(runs), len(FRACTIONS)))
    agreement = np.full((replicates, len(AGREEMENT)), np.nan)

    def per_runs(column: list[int]) -> np.ndarray:
        """Images x what a replicate sums: each run's fraction indicators, then, with two voters or more, whether
        the band holds, the agreeing vote pairs and the votes per band."""
        parts = [indicators[:, column].reshape(n, -1)]
        if len(voters) > 1:
            votes = np.stack([(codes[:, [column[v] for v in voters]] == c).sum(axis=1) for c in range(len(BANDS))],
                             axis=1)
            parts += [(votes.max(axis=1) == len(voters))[:, None], _agreeing_pairs(votes)[:, None], votes]
        return np.hstack(parts).astype(np.float64)

    def weigh(rows: slice, weights: np.ndarray, summed: np.ndarray) -> None:
        sums = weights @ summed  # whole numbers: exact whatever the order of the additions
        width = len(runs) * len(FRACTIONS)
        fractions[rows] = sums[:, :width].reshape(-1, len(runs), len(FRACTIONS)) / n
        if len(voters) > 1:
            agreement[rows, 0] = sums[:, width] / n
            agreement[rows, 1] = _kappa(sums[:, width + 1], sums[:, width + 2:], np.full(len(sums), float(n)),
                                        len(voters))

    if refits:  # a seed drawn per group after each replicate's images: one replicate at a time
        for b in range(replicates):
            weights = _image_counts(rng, n, 1).astype(np.float64)
            pick = rng.integers(0, sizes)
            weigh(slice(b, b + 1), weights, per_runs([runs.index(groups[g][pick[g]]) for g in group_of]))
    else:  # every replicate has the same runs: blocks of replicates weighed at once
        summed = per_runs([runs.index(groups[g][0]) for g in group_of])
        for start, counts in zip(range(0, replicates, BLOCK), bootstrap_counts(seed, n, replicates), strict=True):
            weigh(slice(start, start + len(counts)), counts.astype(np.float64), summed)
    quantiles = [(1 - level) / 2, (1 + level) / 2]
    low, high = np.quantile(fractions, quantiles, axis=0)
    spread = (np.quantile(agreement, quantiles, axis=0) if len(voters) > 1
              else np.full((2, len(AGREEMENT)), np.nan))
    first = table.row(0, named=True)
    return pl.DataFrame({"model": [first["model"]] * len(runs), "view": [first["view"]] * len(runs),
                         "k": [first["k"]] * len(runs), "run_id": runs,
                         **{f"{name}_lo": low[:, j] for j, name in enumerate(FRACTIONS)},
                         **{f"{name}_hi": high[:, j] for j, name in enumerate(FRACTIONS)},
                         **{f"{name}_lo": [spread[0, j]] * len(runs) for j, name in enumerate(AGREEMENT)},
                         **{f"{name}_hi": [spread[1, j]] * len(runs) for j, name in enumerate(AGREEMENT)}},
                        schema_overrides={"k": table["k"].dtype}).fill_nan(None)
