"""Overthinking (Kaya et al.), first correct anchor and calibration (Guo et al.) of a hand-made
run, each against a plain numpy loop over the same images, predictions and confidences; a knn run's calibration
against exact fractions of its vote counts."""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
from synthetic import register_toy_images, run_rows

from featstore.analytics import db as fsdb
from featstore.analytics import readouts as r
from featstore.analytics.report_readouts import readout_sections
from featstore.errors import FeatstoreError
from featstore.schema import CALIBRATION_MIN_N

N, T, RUN = 300, 6, "m/clean/linear"
KNN_RUN, K = "m/clean/knn:metric=euclidean,ties=lowest", 30


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One run of T + 1 = 7 anchors whose predictions turn right at a random anchor (and sometimes wrong again),
    confidences on a grid with values on bin edges (0, 1/15, 1) and the model's head, absent for a few images."""
    rng = np.random.default_rng(11)
    db = tmp_path_factory.mktemp("readouts") / "f.duckdb"
    con = fsdb.connect(db)
    labels = rng.integers(0, 5, N)
    split = rng.choice(["train", "val", "test"], N, p=[0.5, 0.2, 0.3])
    register_toy_images(con, labels, split, ("m",), T + 1)
    preds = (labels[:, None] + rng.integers(1, 5, (N, T + 1))) % 5  # wrong everywhere ...
    turn = rng.integers(0, T + 3, N)  # ... right from `turn` on (never for turn > T)
    for i in range(N):
        preds[i, turn[i]:] = labels[i]
        if turn[i] <= T and rng.random() < 0.3:  # right, then wrong again at some later anchors
            preds[i, rng.integers(turn[i] + 1, T + 2):] = (labels[i] + 1) % 5
    confs = np.concatenate([rng.random((N, T + 1 - 2)), np.full((N, 1), 1 / 15), np.zeros((N, 1))], axis=1)
    confs[::7, : T - 1] = 1.0
    confs = confs.astype(np.float32)
    head_ids = np.flatnonzero(np.arange(N) % 13 != 0)
    head = np.where(rng.random(N) < 0.6, labels, (labels + 2) % 5)
    fsdb.replace_model_outputs(con, "m", "clean", head_ids, head[head_ids], np.full(len(head_ids), 0.9))
    fsdb.write_runs(con, [run_rows({"run_id": RUN, "model": "m", "view": "clean"}, np.arange(N), preds, confs)])
    votes = rng.integers(0, K + 1, (N, T + 1))
    votes[::3] = 2 * rng.integers(0, K // 2 + 1, (len(votes[::3]), T + 1))  # many even counts: on a bin edge at B = 15
    knn = {"run_id": KNN_RUN, "model": "m", "view": "clean", "probe": "knn",
           "params": {"k": K, "metric": "euclidean", "ties": "lowest", "leave_out": "self", "tile": 8192, "refs": ""}}
    fsdb.write_runs(con, [run_rows(knn, np.arange(N), preds, (votes / K).astype(np.float32))])
    cka = np.eye(T + 1) + 0.5 * (1 - np.eye(T + 1))
    cka[0, 1] = cka[1, 0] = np.nan  # an anchor pair without variance
    fsdb.replace_anchor_cka(con, "m", "clean", "biased", cka, N)
    con.close()
    reader = fsdb.connect(db, read_only=True)
    yield SimpleNamespace(db=reader, labels=labels, split=split, preds=preds, confs=confs, head=head,
                          has_head=np.isin(np.arange(N), head_ids), votes=votes)
    reader.close()


def first_right(preds: np.ndarray, label: int) -> int | None:
    for layer, p in enumerate(preds):
        if p == label:
            return layer
    return None


def test_first_correct_is_the_first_right_anchor_of_each_test_image(world):
    got = r.first_correct(world.db, RUN)
    test = np.flatnonzero(world.split == "test")
    assert got["image_id"].to_list() == test.tolist()
    expected = [first_right(world.preds[i], world.labels[i]) for i in test]
    assert got["first_correct"].to_list() == expected
    assert None in expected and 0 in expected  # both ends are exercised
    every = r.first_correct(world.db, RUN, scope="all")
    assert len(every) == N


def test_overthinking_shares_match_a_loop(world):
    got = r.overthinking(world.db, RUN)
    rows = [i for i in np.flatnonzero(world.split == "test") if world.has_head[i]]
    assert len(rows) < (world.split == "test").sum()  # images without the head's answer are left out
    first = np.array([T + 1 if (f := first_right(world.preds[i], world.labels[i])) is None else f for i in rows])
    head_right = np.array([world.head[i] == world.labels[i] for i in rows])
    assert got["anchor"].to_list() == list(range(T + 1))
    for layer in range(T + 1):
        by = first <= layer
        row = got.row(layer, named=True)
        assert row["correct_by"] == pytest.approx(by.mean())
        assert row["wasteful_by"] == pytest.approx((by & head_right).mean())
        assert row["destructive_by"] == pytest.approx((by & ~head_right).mean())
    internal = first < T  # some anchor 0..T-1 is right
    assert got["wasteful"][0] == pytest.approx((internal & head_right).mean())
    assert got["destructive"][0] == pytest.approx((internal & ~head_right).mean())
    assert got["head_accuracy"][0] == pytest.approx(head_right.mean())
    assert got["n"][0] == len(rows)
    assert 0 < got["destructive"][0] < got["wasteful"][0]


def ece_loop(conf: np.ndarray, hit: np.ndarray, bins: int,
             min_n: int = CALIBRATION_MIN_N) -> tuple[float, float, dict[int, tuple]]:
    """Guo et al.'s ECE literally: bin m holds conf in ((m-1)/M, m/M] (conf 0 in bin 1); MCE over the bins of at
    least min_n images."""
    ece, mce, table = 0.0, None, {}
    for m in range(1, bins + 1):
        lo, hi = (m - 1) / bins, m / bins
        inside = [(c > lo or (m == 1 and c == 0)) and c <= hi for c in conf.astype(np.float64)]
        inside = np.array(inside)
        if not inside.any():
            continue
        acc, mean_conf = hit[inside].mean(), conf[inside].astype(np.float64).mean()
        ece += inside.mean() * abs(acc - mean_conf)
        if inside.sum() >= min_n:
            mce = max(mce or 0.0, abs(acc - mean_conf))
        table[m] = (int(inside.sum()), acc, mean_conf)
    return ece, mce, table


@pytest.mark.parametrize("bins", [15, 4])
def test_calibration_error_and_bins_match_a_loop(world, bins):
    got = r.calibration(world.db, RUN, bins=bins)
    got_bins = r.calibration_bins(world.db, RUN, bins=bins)
    test = world.split == "test"
    for layer in range(T + 1):
        conf, hit = world.confs[test, layer], (world.preds[test, layer] == world.labels[test]).astype(float)
        ece, mce, table = ece_loop(conf, hit, bins)
        row = got.row(layer, named=True)
        assert row["ece"] == pytest.approx(ece, abs=1e-9)
        assert row["mce"] == (None if mce is None else pytest.approx(mce, abs=1e-9))
        assert row["accuracy"] == pytest.approx(hit.mean())
        assert row["n"] == test.sum()
        mine = got_bins.filter(got_bins["anchor"] == layer)
        assert mine["bin"].to_list() == sorted(table)
        assert mine["n"].to_list() == [table[m][0] for m in sorted(table)]
        assert mine["confidence"].to_list() == pytest.approx([table[m][2] for m in sorted(table)])
        assert mine["share"].sum() == pytest.approx(1.0)
    assert got["ece"][T] == pytest.approx(got["accuracy"][T])  # all confidences 0 there: ECE = accuracy


def exact_calibration(votes: np.ndarray, hit: np.ndarray, k: int, bins: int,
                      min_n: int) -> tuple[float, float, dict[int, int]]:
    """ECE and MCE of vote shares v/k in exact fractions: bin m holds v/k in ((m-1)/M, m/M] (0 in bin 1); MCE over
    the bins of at least min_n images."""
    shares = [Fraction(int(v), k) for v in votes]
    ece = mce = Fraction(0)
    table = {}
    for m in range(1, bins + 1):
        lo, hi = Fraction(m - 1, bins), Fraction(m, bins)
        inside = np.array([(s > lo or (m == 1 and s == 0)) and s <= hi for s in shares])
        if not inside.any():
            continue
        n = int(inside.sum())
        gap = abs(Fraction(int(hit[inside].sum()), n) - sum(s for s, i in zip(shares, inside, strict=True) if i) / n)
        ece += Fraction(n, len(shares)) * gap
        if n >= min_n:
            mce = max(mce, gap)
        table[m] = n
    return float(ece), float(mce), table


@pytest.mark.parametrize("bins, min_n", [(15, 1), (10, 1), (10, CALIBRATION_MIN_N)])
def test_knn_calibration_bins_exact_vote_counts(world, bins, min_n):
    got = r.calibration(world.db, KNN_RUN, bins=bins, min_n=min_n)
    got_bins = r.calibration_bins(world.db, KNN_RUN, bins=bins)
    test = world.split == "test"
    moved = 0
    for layer in range(T + 1):
        votes, hit = world.votes[test, layer], world.preds[test, layer] == world.labels[test]
        ece, mce, table = exact_calibration(votes, hit, K, bins, min_n)
        row = got.row(layer, named=True)
        assert row["ece"] == pytest.approx(ece, abs=1e-12)
        assert row["mce"] == pytest.approx(mce, abs=1e-12)
        mine = got_bins.filter(got_bins["anchor"] == layer)
        assert dict(zip(mine["bin"].to_list(), mine["n"].to_list(), strict=True)) == table
        by_float = ece_loop((votes / K).astype(np.float32), hit.astype(float), bins)[2]
        moved += {m: cell[0] for m, cell in by_float.items()} != table
    assert moved == T + 1  # float32 shares on a bin edge land in the upper bin: the float rule bins otherwise


def test_bad_bins_are_one_line(world):
    with pytest.raises(FeatstoreError, match="bins 0"):
        r.calibration(world.db, RUN, bins=0)


def test_cka_rows_have_both_anchors_names_and_nan_as_null(world):
    rows = r.anchor_cka(world.db, "m")
    assert len(rows) == (T + 1) ** 2 and rows["estimator"].unique().to_list() == ["biased"]
    pair = rows.filter((rows["anchor_a"] == 1) & (rows["anchor_b"] == 0)).row(0, named=True)
    assert pair["cka"] is None and pair["name_a"] == "a1" and pair["name_b"] == "a0"
    assert rows.filter(rows["anchor_a"] == rows["anchor_b"])["cka"].to_list() == [1.0] * (T + 1)
    assert r.anchor_cka(world.db, "m", view="noisy").is_empty()


def test_readout_sections_draw_every_part_and_name_the_run(world, tmp_path):
    page = readout_sections(world.db, [RUN])
    assert page.count("<figure>") == 3 == page.count("class='plot-spec'")  # reliability, overthinking, CKA: drawn
    # by the browser from their data
    assert f"Reliability of the probes of {RUN}" in page and f"Overthinking (Kaya et al. 2019) of {RUN}" in page
    assert "Linear CKA (biased) between every pair of anchors of m on view clean (300 images)" in page
    rows = [i for i in np.flatnonzero(world.split == "test") if world.has_head[i]]
    first = np.array([T + 1 if (f := first_right(world.preds[i], world.labels[i])) is None else f for i in rows])
    wasteful = ((first < T) & (world.head[rows] == world.labels[rows])).mean()
    assert f"<td>{wasteful:.3f}</td>" in page
    wrong = [i for i in rows if world.head[i] != world.labels[i]]  # the null's mean: every label of the head's
    null = sum(world.labels[j] in world.preds[i, :T] for i in wrong for j in wrong) / len(wrong) / len(rows)
    assert f"<td>{null:.3f}</td>" in page  # mistakes over every timeline of them, each pair once
    assert "<th>null 95%</th>" in page and "mce_hi" in page and "hollow: a bin of fewer than 10 images" in page
    assert not list(tmp_path.iterdir())  # nothing written: the page carries its plots
