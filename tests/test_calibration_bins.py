"""Calibration that small bins cannot drive (sql/calibration*.sql, analytics/readouts.py): MCE only from bins of at
least min_n images, equal-width or equal-mass bins, n per bin in every output, and bootstrap intervals of ECE and
MCE, each against a numpy binning written here; and a run whose MCE, over every non-empty bin, is set by one image."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from synthetic import register_toy_images, run_rows

from featstore.analytics import db as fsdb
from featstore.analytics import readouts as r
from featstore.errors import FeatstoreError
from featstore.schema import CALIBRATION_BINNINGS, CALIBRATION_BINS, CALIBRATION_MIN_N, INTERVAL_LEVEL

RUN = "m/clean/linear"
ROOT = Path(__file__).resolve().parents[1]


def write_run(path, labels, preds, confs) -> None:
    con = fsdb.connect(path)
    n = len(labels)
    register_toy_images(con, np.asarray(labels), np.array(["test"] * n), ("m",), preds.shape[1])
    fsdb.write_runs(con, [run_rows({"run_id": RUN, "model": "m", "view": "clean"}, np.arange(n), preds,
                                   np.asarray(confs, dtype=np.float32))])
    con.close()


def width_bins(conf: np.ndarray, bins: int) -> list[np.ndarray]:
    """Bin m holds conf in ((m-1)/M, m/M], conf 0 in bin 1: the indices of each bin."""
    inside = []
    for m in range(1, bins + 1):
        lo, hi = (m - 1) / bins, m / bins
        inside.append(np.flatnonzero(((conf > lo) | ((m == 1) & (conf == 0))) & (conf <= hi)))
    return inside


def mass_bins(conf: np.ndarray, ids: np.ndarray, bins: int) -> list[np.ndarray]:
    """The images sorted by (conf, id), cut into `bins` runs of near-equal count (the first ones one larger)."""
    return np.array_split(np.lexsort((ids, conf)), bins)


def errors(conf: np.ndarray, hit: np.ndarray, groups: list[np.ndarray], min_n: int):
    """ECE over every non-empty bin; MCE, its bin (1-based) and its count over the bins of at least min_n images;
    every non-empty bin's count."""
    ece, best, sizes = 0.0, None, {}
    for m, members in enumerate(groups, start=1):
        if len(members) == 0:
            continue
        gap = abs(hit[members].mean() - conf[members].mean())
        ece += len(members) / len(conf) * gap
        sizes[m] = len(members)
        if len(members) >= min_n and (best is None or gap > best[0]):
            best = (gap, m, len(members))
    return ece, best, sizes


@pytest.fixture(scope="module")
def one_image_bin(tmp_path_factory):
    """Anchor 0: 40 images at conf 0.9 (36 right), 30 at 0.7 (20 right) and one at 0.55, wrong: that one image's
    bin has the largest gap of all."""
    confs = np.array([0.9] * 40 + [0.7] * 30 + [0.55], dtype=np.float32)
    hit = np.array([1] * 36 + [0] * 4 + [1] * 20 + [0] * 10 + [0])
    labels = np.zeros(len(confs), dtype=int)
    preds = np.where(hit == 1, 0, 1)[:, None]
    db = tmp_path_factory.mktemp("one") / "f.duckdb"
    write_run(db, labels, preds, confs[:, None])
    return db, confs.astype(np.float64), hit


def test_a_bin_of_one_image_no_longer_sets_mce(one_image_bin):
    db, conf, hit = one_image_bin
    got = r.calibration(db, RUN, replicates=50).row(0, named=True)
    cells = r.calibration_bins(db, RUN)
    ece, (mce, mce_bin, mce_n), sizes = errors(conf, hit, width_bins(conf, 15), CALIBRATION_MIN_N)
    every_bin = max(abs(hit[g].mean() - conf[g].mean()) for g in width_bins(conf, 15) if len(g))
    lone = width_bins(conf, 15)[8]  # (8/15, 9/15]: conf 0.55
    assert len(lone) == 1 and every_bin == pytest.approx(abs(0 - conf[lone[0]]))  # one image set MCE before
    assert got["mce"] == pytest.approx(mce, abs=1e-9) and got["mce"] < every_bin - 0.2
    assert (got["mce_bin"], got["mce_n"]) == (mce_bin, mce_n) and mce_n >= CALIBRATION_MIN_N
    assert got["ece"] == pytest.approx(ece, abs=1e-9)
    assert (got["bins_used"], got["small_bins"], got["min_bin_n"]) == (3, 1, 1)
    assert dict(zip(cells["bin"].to_list(), cells["n"].to_list(), strict=True)) == sizes
    assert cells.filter(cells["n"] == 1)["sets_mce"].to_list() == [False]
    every = r.calibration(db, RUN, min_n=1, replicates=50).row(0, named=True)
    assert every["mce"] == pytest.approx(every_bin, abs=1e-6) and every["mce_n"] == 1


@pytest.fixture(scope="module")
def random_run(tmp_path_factory):
    rng = np.random.default_rng(3)
    n, anchors = 230, 4
    labels = rng.integers(0, 4, n)
    confs = np.clip(rng.beta(4, 2, (n, anchors)), 0, 1).astype(np.float32)
    confs[::11, 0] = confs[0, 0]  # ties across an equal-mass cut: ordered by image id
    hit = rng.random((n, anchors)) < confs
    preds = np.where(hit, labels[:, None], (labels[:, None] + 1) % 4)
    db = tmp_path_factory.mktemp("random") / "f.duckdb"
    write_run(db, labels, preds, confs)
    return db, confs.astype(np.float64), hit.astype(np.float64)


@pytest.mark.parametrize("binning, bins, min_n", [("width", 15, 10), ("mass", 15, 10), ("mass", 7, 33),
                                                   ("width", 6, 1)])
def test_errors_and_bins_match_a_numpy_binning(random_run, binning, bins, min_n):
    db, confs, hits = random_run
    got = r.calibration(db, RUN, bins=bins, binning=binning, min_n=min_n, replicates=20)
    cells = r.calibration_bins(db, RUN, bins=bins, binning=binning, min_n=min_n)
    ids = np.arange(len(confs))
    for layer in range(confs.shape[1]):
        conf, hit = confs[:, layer], hits[:, layer]
        groups = width_bins(conf, bins) if binning == "width" else mass_bins(conf, ids, bins)
        ece, best, sizes = errors(conf, hit, groups, min_n)
        row = got.row(layer, named=True)
        assert row["ece"] == pytest.approx(ece, abs=1e-9)
        assert row["mce"] == pytest.approx(best[0], abs=1e-9)
        assert (row["mce_bin"], row["mce_n"]) == best[1:]
        assert row["bins_used"] == len(sizes) and row["min_bin_n"] == min(sizes.values())
        assert row["small_bins"] == sum(size < min_n for size in sizes.values())
        mine = cells.filter(cells["anchor"] == layer)
        assert dict(zip(mine["bin"].to_list(), mine["n"].to_list(), strict=True)) == sizes
        assert mine["sets_mce"].to_list() == [sizes[m] >= min_n for m in sorted(sizes)]
        if binning == "mass":
            assert mine["lo"].to_list() == pytest.approx([conf[groups[m - 1]].min() for m in sorted(sizes)])
            assert mine["hi"].to_list() == pytest.approx([conf[groups[m - 1]].max() for m in sorted(sizes)])


def bootstrap_loop(confs, hits, bins: int, binning: str, min_n: int, replicates: int, seed: int):
    """The documented resampling as a loop: one generator, replicate b draws n image indices with
    integers(0, n, n); each anchor's ECE and MCE recomputed on the resample by this file's own binning."""
    rng = np.random.default_rng(seed)
    n, anchors = confs.shape
    ece, mce = np.zeros((replicates, anchors)), np.full((replicates, anchors), np.nan)
    for b in range(replicates):
        pick = rng.integers(0, n, n)
        for layer in range(anchors):
            conf, hit = confs[pick, layer], hits[pick, layer]
            groups = width_bins(conf, bins) if binning == "width" else mass_bins(conf, pick, bins)
            e, best, _ = errors(conf, hit, groups, min_n)
            ece[b, layer] = e
            if best is not None:
                mce[b, layer] = best[0]
    return ece, mce


@pytest.mark.parametrize("binning, min_n", [("width", 10), ("mass", 10), ("width", 25)])
def test_bootstrap_intervals_match_a_resampling_loop(random_run, binning, min_n):
    db, confs, hits = random_run
    replicates, seed = 120, 4
    got = r.calibration(db, RUN, binning=binning, min_n=min_n, replicates=replicates, seed=seed)
    ece, mce = bootstrap_loop(confs, hits, 15, binning, min_n, replicates, seed)
    for layer in range(confs.shape[1]):
        row = got.row(layer, named=True)
        assert [row["ece_lo"], row["ece_hi"]] == pytest.approx(np.percentile(ece[:, layer], [2.5, 97.5]), abs=1e-9)
        kept = mce[:, layer][~np.isnan(mce[:, layer])]
        assert [row["mce_lo"], row["mce_hi"]] == pytest.approx(np.percentile(kept, [2.5, 97.5]), abs=1e-9)
        assert row["ece_lo"] <= row["ece_hi"] and row["replicates"] == replicates


def test_no_bin_large_enough_gives_no_mce(one_image_bin):
    got = r.calibration(one_image_bin[0], RUN, min_n=100, replicates=20).row(0, named=True)
    assert got["mce"] is None and got["mce_lo"] is None and got["mce_hi"] is None and got["ece"] > 0


@pytest.mark.parametrize("call, match", [
    (dict(binning="quantile"), "binning 'quantile': use width"),
    (dict(min_n=0), "min_n 0: must be a whole number >= 1"),
    (dict(min_n=2.5), "min_n 2.5: must be a whole number >= 1"),
    (dict(replicates=0), "replicates 0: give a whole number"),
])
def test_bad_options_are_one_line(one_image_bin, call, match):
    with pytest.raises(FeatstoreError, match=match):
        r.calibration(one_image_bin[0], RUN, **call)


@pytest.mark.parametrize("file", ["calibration.sql", "calibration_bins.sql", "calibration_images.sql"])
def test_the_macros_default_as_the_schema(file):
    text = (ROOT / "sql" / file).read_text()
    signature = re.search(r"CREATE OR REPLACE MACRO \w+\(([^)]*)\)", text).group(1)
    assert f"bins := {CALIBRATION_BINS}" in signature and f"binning := '{CALIBRATION_BINNINGS[0]}'" in signature
    if file != "calibration_images.sql":
        assert f"min_n := {CALIBRATION_MIN_N}" in signature


def bincount_bootstrap(confs, hits, bins_of, bins: int, min_n: int, replicates: int, seed: int):
    """Equal-width bins' ECE and MCE per replicate, one replicate at a time: each bin's size, hits and confidence
    sum by numpy.bincount over the images in id order, weighted by the replicate's copies of each image."""
    rng = np.random.default_rng(seed)
    n, anchors = confs.shape
    ece, mce = np.zeros((replicates, anchors)), np.full((replicates, anchors), np.nan)
    for b in range(replicates):
        copies = np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)
        for layer in range(anchors):
            size = np.bincount(bins_of[:, layer], weights=copies, minlength=bins)
            right = np.bincount(bins_of[:, layer], weights=copies * hits[:, layer], minlength=bins)
            conf = np.bincount(bins_of[:, layer], weights=confs[:, layer] * copies, minlength=bins)
            gap = np.abs(right - conf)
            ece[b, layer] = gap.sum() / n
            large = [gap[m] / size[m] for m in range(bins) if size[m] >= min_n]
            mce[b, layer] = max(large) if large else np.nan
    return ece, mce


# blocks of 64, 64 and 1 replicates; one alone; an anchor whose probe is right on every image (no wrong image to sum)
@pytest.mark.parametrize("replicates, min_n, all_right", [(129, 10, False), (1, 40, False), (65, 10, True)])
def test_blocked_bootstrap_is_bit_identical_to_one_replicate_at_a_time(replicates, min_n, all_right):
    rng = np.random.default_rng(8)
    n, anchors, bins = 3000, 3, 15
    confs = rng.beta(5, 2, (n, anchors))  # float64: each sum's rounding depends on the order of its additions
    hits = (rng.random((n, anchors)) < confs).astype(np.float64)
    if all_right:
        hits[:, 1] = 1.0
    bins_of = np.maximum(np.ceil(confs * bins).astype(int), 1) - 1
    rows = pl.DataFrame({"anchor": np.repeat(np.arange(anchors), n), "image_id": np.tile(np.arange(n) * 3 + 1, anchors),
                         "hit": hits.T.ravel().astype(bool), "conf": confs.T.ravel(), "bin": bins_of.T.ravel() + 1})
    got = r.calibration_intervals(rows.sample(fraction=1.0, shuffle=True, seed=1), bins, "width", min_n, replicates, 5)
    ece, mce = bincount_bootstrap(confs, hits, bins_of, bins, min_n, replicates, 5)
    quantiles = [(1 - INTERVAL_LEVEL) / 2, (1 + INTERVAL_LEVEL) / 2]  # as documented: 0.025 is not (1 - 0.95) / 2
    for layer in range(anchors):
        row = got.row(layer, named=True)
        assert [row["ece_lo"], row["ece_hi"]] == np.quantile(ece[:, layer], quantiles).tolist()  # exact, bit for bit
        kept = mce[:, layer][~np.isnan(mce[:, layer])]
        assert [row["mce_lo"], row["mce_hi"]] == (np.quantile(kept, quantiles).tolist() if len(kept) else [None] * 2)
