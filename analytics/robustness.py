"""How much of a decision timeline is the network's: l*(k) and its early/mid/late band read under a set of probes
(sql/robust_bands.sql, sql/robust_sweep.sql), and each band fraction with a seeded bootstrap interval over images.

A fraction that moves between the probes of the set, or whose interval is wide, is not a property of the network
alone (docs/design.md §5, "Robustness"). The macros give the point figures to any DuckDB client; the intervals are
numpy's (one resampling of images shared by every probe of the set, so the probes are compared on the same draws).
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
FRACTIONS = ("f_early", "f_mid", "f_late", "never_stable", "band_holds")  # each gets <name>_lo and <name>_hi
_INDICATORS = {"f_early": pl.col("band") == "early", "f_mid": pl.col("band") == "mid",
               "f_late": pl.col("band") == "late", "never_stable": pl.col("never_stable"),
               "band_holds": pl.col("band_holds")}


def robust_bands(db: Db, kmax: int = 4, scope: str = "auto", run_set: Sequence[str] | None = None,
                 min_conf: float = 0.0) -> pl.DataFrame:
    """Per image and k = 1..kmax: its l*(k) and band under each probe of the set, and whether the band holds under
    all (`run_set`: the declared set; default: every run of probe seed 0 and no cross-fit, per model and view)."""
    chosen = known_runs(db, run_set) if run_set else None
    return query(db, "SELECT * FROM robust_bands(?, scope := ?, run_set := ?, min_conf := ?)",
                 [kmax, check_scope(scope), chosen, check_min_conf(min_conf)])


def robust_sweep(db: Db, ks: Sequence[int] | None = None, scope: str = "auto", run_set: Sequence[str] | None = None,
                 min_conf: float = 0.0, replicates: int = REPLICATES, seed: int = SEED,
                 level: float = LEVEL) -> pl.DataFrame:
    """sql/robust_sweep.sql at the windows `ks` (each probe's fractions, the set's band_holds and each fraction's
    range over the set) with, for every fraction, a percentile bootstrap interval (<fraction>_lo, <fraction>_hi).

    The bootstrap: per model, view and k, the images of the set's population sorted by id (n of them), and
    `numpy.random.default_rng(seed)`; replicate b draws n image indices with `integers(0, n, n)` (one call per
    replicate, in order); each probe's fraction on those rows; the interval is numpy's linear `quantile` of the
    replicates at (1 - level) / 2 and (1 + level) / 2."""
    if replicates < 1 or not 0 < level < 1:
        raise FeatstoreError(f"bootstrap of {replicates} replicate(s) at level {level:g}: give at least 1 replicate "
                             f"and a level between 0 and 1")
    chosen = known_runs(db, run_set) if run_set else None
    ks = stability_windows(db, ks, chosen)
    sweep = query(db, "SELECT * FROM robust_sweep(?, scope := ?, run_set := ?, min_conf := ?)",
                  [max(ks), check_scope(scope), chosen, check_min_conf(min_conf)]).filter(pl.col("k").is_in(ks))
    if sweep.is_empty():
        return sweep
    bands = robust_bands(db, max(ks), scope, chosen, min_conf).filter(pl.col("k").is_in(ks))
    intervals = [_intervals(group, replicates, seed, level)
                 for _, group in bands.group_by("model", "view", "k", maintain_order=True)]
    return sweep.join(pl.concat(intervals), on=["model", "view", "k", "run_id"], how="left", maintain_order="left")


def _intervals(bands: pl.DataFrame, replicates: int, seed: int, level: float) -> pl.DataFrame:
    """One model, view and k: per probe, the bootstrap interval of each fraction (images resampled alike for all)."""
    wide = bands.sort("image_id", "run_id").with_columns(**{name: expr.cast(pl.Float64)
                                                            for name, expr in _INDICATORS.items()})
    runs = wide["run_id"].unique(maintain_order=True).to_list()
    n = wide["image_id"].n_unique()
    values = wide.select(list(FRACTIONS)).to_numpy().reshape(n, len(runs) * len(FRACTIONS))  # rows: images, by run
    rng = np.random.default_rng(seed)
    draws = np.empty((replicates, values.shape[1]))
    for b in range(replicates):
        counts = np.bincount(rng.integers(0, n, n), minlength=n)
        draws[b] = counts @ values / n
    low, high = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2], axis=0)
    low, high = low.reshape(len(runs), len(FRACTIONS)), high.reshape(len(runs), len(FRACTIONS))
    first = wide.row(0, named=True)
    return pl.DataFrame({"model": [first["model"]] * len(runs), "view": [first["view"]] * len(runs),
                         "k": [first["k"]] * len(runs), "run_id": runs,
                         **{f"{name}_lo": low[:, j] for j, name in enumerate(FRACTIONS)},
                         **{f"{name}_hi": high[:, j] for j, name in enumerate(FRACTIONS)}},
                        schema_overrides={"k": wide["k"].dtype})
