"""Linear CKA of every pair of anchors (`featstore cka`), streamed over a small store's chunks, against the plain
full-matrix formulas in numpy: the centred Gram matrices of Kornblith et al. and the unbiased HSIC of Song et al."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic import pooled_activations, write_feature_store

from featstore.analytics import db as fsdb
from featstore.analytics import readouts
from featstore.compute.similarity import anchor_cka, plan_passes
from featstore.store.reader import FeatureStore
from featstore.store.writer import StoreWriter

from conftest import fails, run_cli

DIMS = [5, 12, 3, 20]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """130 rows in chunks of 32 (the last one short), float16 features with large means and few dominant directions,
    and a noisy copy as a second view."""
    feats, labels = pooled_activations(n_classes=5, per_class=26, dims=DIMS, seed=3)
    noisy = [(f.astype(np.float32) + np.random.default_rng(1).normal(0, 1, f.shape)).astype(np.float16)
             for f in feats]
    path = write_feature_store(tmp_path_factory.mktemp("cka") / "s.zarr", feats, labels, 5, chunk_rows=32,
                               views={"noisy": noisy})
    return path, [f.astype(np.float64) for f in feats], [f.astype(np.float64) for f in noisy]


def gram_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Kornblith et al.: HSIC(K, L) = tr(K H L H) / (n - 1)², K = X Xᵀ, H the centring matrix."""
    n = len(x)
    h = np.eye(n) - np.ones((n, n)) / n
    k, l_ = x @ x.T, y @ y.T

    def hsic(a, b):
        return np.trace(a @ h @ b @ h) / (n - 1) ** 2

    return hsic(k, l_) / np.sqrt(hsic(k, k) * hsic(l_, l_))


def unbiased_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Song et al. 2012's unbiased HSIC of K, L with zeroed diagonals, literally."""
    n = len(x)

    def hsic(k, l_):
        k, l_ = k.copy(), l_.copy()
        np.fill_diagonal(k, 0)
        np.fill_diagonal(l_, 0)
        one = np.ones(n)
        return (np.trace(k @ l_) + (one @ k @ one) * (one @ l_ @ one) / ((n - 1) * (n - 2))
                - 2 / (n - 2) * (one @ k @ l_ @ one)) / (n * (n - 3))

    k, l_ = x @ x.T, y @ y.T
    return hsic(k, l_) / np.sqrt(hsic(k, k) * hsic(l_, l_))


@pytest.mark.parametrize("unbiased", [False, True])
def test_streamed_cka_is_the_full_matrix_formula(store, unbiased):
    path, feats, _ = store
    result = anchor_cka(path, "synthetic", unbiased=unbiased)
    reference = unbiased_cka if unbiased else gram_cka
    expected = np.array([[reference(a, b) for b in feats] for a in feats])
    np.testing.assert_allclose(result.matrix, expected, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(np.diag(result.matrix), 1.0, rtol=1e-12)
    assert np.array_equal(result.matrix, result.matrix.T)
    assert result.n_images == 130 and result.passes == 1
    assert not np.allclose(expected, 1.0)  # the anchors do differ


def test_a_small_memory_budget_takes_more_passes_and_gives_the_same_matrix(store):
    path, feats, _ = store
    one = anchor_cka(path, "synthetic")
    passes = plan_passes(DIMS, 8 * 20 * 20)
    assert len(passes) > 2 and sorted(p for group in passes for p in group) == [
        (a, b) for a in range(len(DIMS)) for b in range(a, len(DIMS))]
    several = anchor_cka(path, "synthetic", memory_budget=8 * 20 * 20)
    assert several.passes == len(passes)
    np.testing.assert_allclose(several.matrix, one.matrix, rtol=1e-12)


def test_skipped_rows_are_left_out(store, tmp_path):
    import shutil

    path, feats, _ = store
    copy = tmp_path / "s.zarr"
    shutil.copytree(path, copy)
    fs = StoreWriter(copy)
    skipped = fs.view_group("synthetic", "clean")["skipped"]
    mask = np.zeros(130, dtype=bool)
    mask[[0, 40, 41, 129]] = True
    skipped[:] = mask
    result = anchor_cka(FeatureStore(copy), "synthetic")
    keep = ~mask
    expected = np.array([[gram_cka(a[keep], b[keep]) for b in feats] for a in feats])
    assert result.n_images == 126
    np.testing.assert_allclose(result.matrix, expected, rtol=1e-6)


def test_cli_writes_both_estimators_and_a_rerun_replaces(store, tmp_path):
    path, _, noisy = store
    db = tmp_path / "f.duckdb"
    out = run_cli("cka", "--store", path, "--model", "synthetic", "--view", "noisy", "--db", db, "--threads", "1",
                  "--no-progress").output
    assert "biased CKA of 4 anchors" in out and "130 images" in out
    run_cli("cka", "--store", path, "--model", "synthetic", "--view", "noisy", "--db", db, "--unbiased",
            "--no-progress")
    run_cli("cka", "--store", path, "--model", "synthetic", "--view", "noisy", "--db", db, "--no-progress")
    con = fsdb.connect(db, read_only=True)
    try:
        rows = readouts.anchor_cka(con, "synthetic", "noisy")
    finally:
        con.close()
    assert rows.group_by("estimator").len().sort("estimator").rows() == [("biased", 16), ("unbiased", 16)]
    biased = rows.filter(rows["estimator"] == "biased").sort("anchor_a", "anchor_b")
    expected = [gram_cka(a, b) for a in noisy for b in noisy]
    np.testing.assert_allclose(biased["cka"].to_numpy(), expected, rtol=1e-6)
    assert biased["name_a"][0] == "anchor00" and biased["name_b"][-1] == "anchor03"


def test_bad_input_is_one_line_and_writes_nothing(store, tmp_path):
    path, _, _ = store
    db = tmp_path / "f.duckdb"
    assert "no view 'blur'" in fails("cka", "--store", path, "--model", "synthetic", "--view", "blur", "--db", db)
    assert "synthetic" in fails("cka", "--store", path, "--model", "nope", "--db", db)
    assert not db.exists()
