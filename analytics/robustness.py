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

from collections.abc import Sequence

import numpy as np
import polars as pl

from featstore.analytics.queries import Db, check_min_conf, check_scope, known_runs, query, stability_windows
from featstore.errors import FeatstoreError

REPLICATES = 1000  # bootstrap resamples of the images
SEED = 0
LEVEL = 0.95  # the percentile interval's coverage
FRACTIONS = ("f_early", "f_mid", "f_late", "never_stable")  # per run: each gets <name>_lo and <name>_hi
AGREEMENT = ("band_holds", "kappa")  # per set (two families or more): each gets <name>_lo and <name>_hi
BANDS = ("early", "mid", "late")
OVER_IMAGES = "images (probes fixed)"  # what an interval covers: the `interval_over` column
OVER_REFITS = "images and probe seeds"


def robust_bands(db: Db, kmax: int = 4, scope: str = "auto", run_set: Sequence[str] | None = None,
                 min_conf: float = 0.0, seeds: bool = False) -> pl.DataFrame:
    """Per image and k = 1..kmax: its l*(k) and band under each probe of the set, its family, whether its family's
    vote is this run's, and whether the band holds under every family's vote (`run_set`: the declared set;
    default: every run of probe seed 0, or of every seed with `seeds`, without cross-fit, per model and view)."""
    chosen = known_runs(db, run_set) if run_set else None
    return query(db, "SELECT * FROM robust_bands(?, scope := ?, run_set := ?, min_conf := ?, seeds := ?)",
                 [kmax, check_scope(scope), chosen, check_min_conf(min_conf), bool(seeds)])


def robust_sweep(db: Db, ks: Sequence[int] | None = None, scope: str = "auto", run_set: Sequence[str] | None = None,
                 min_conf: float = 0.0, replicates: int = REPLICATES, seed: int = SEED,
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
    bands = robust_bands(db, max(ks), scope, chosen, min_conf, bool(refits)).filter(pl.col("k").is_in(ks))
    intervals = [_intervals(group, replicates, seed, level, bool(refits))
                 for _, group in bands.group_by("model", "view", "k", maintain_order=True)]
    return (sweep.join(pl.concat(intervals), on=["model", "view", "k", "run_id"], how="left", maintain_order="left")
            .with_columns(interval_over=pl.lit(OVER_REFITS if refits else OVER_IMAGES)))


def fleiss_kappa(counts: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Fleiss' kappa of `counts` (images x categories: how many of the m raters put each image in each category;
    every row sums to m >= 2), each image counted `weights` times (a bootstrap draw); NaN where every vote is in one
    category (chance agreement 1)."""
    weights = np.ones(len(counts)) if weights is None else weights
    return _weighted_kappa(counts, _image_agreement(counts), weights)


def _image_agreement(counts: np.ndarray) -> np.ndarray:
    """Each image's share of agreeing rater pairs: the part of Fleiss' kappa that no bootstrap weight changes."""
    m = counts[0].sum()
    return ((counts * counts).sum(axis=1) - m) / (m * (m - 1))


def _weighted_kappa(counts: np.ndarray, per_image: np.ndarray, weights: np.ndarray) -> float:
    m = counts[0].sum()
    total = weights.sum()
    observed = weights @ per_image / total
    shares = weights @ counts / (total * m)
    expected = float(shares @ shares)
    return float("nan") if expected >= 1 else (observed - expected) / (1 - expected)


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
    fixed: dict[tuple, tuple] = {}  # without refits every replicate has the same runs: their arrays made once

    def per_runs(column: list[int]) -> tuple:
        if len(voters) < 2:
            return indicators[:, column], None, None, None
        votes = np.stack([(codes[:, [column[v] for v in voters]] == c).sum(axis=1) for c in range(len(BANDS))],
                         axis=1)
        return indicators[:, column], votes, votes.max(axis=1) == len(voters), _image_agreement(votes)

    for b in range(replicates):
        weights = np.bincount(rng.integers(0, n, n), minlength=n).astype(float)
        pick = rng.integers(0, sizes) if refits else np.zeros(len(groups), int)
        column = [runs.index(groups[g][pick[g]]) for g in group_of]  # the run that stands for each run here
        if not refits and tuple(column) not in fixed:
            fixed[tuple(column)] = per_runs(column)
        chosen, votes, holds, per_image = per_runs(column) if refits else fixed[tuple(column)]
        fractions[b] = np.einsum("i,irf->rf", weights, chosen) / n
        if len(voters) > 1:
            agreement[b] = weights @ holds / n, _weighted_kappa(votes, per_image, weights)
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
