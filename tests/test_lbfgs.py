"""The full-batch L-BFGS finish of the `linear` probe: its loss and gradient against autograd, its minimum
against scikit-learn's LogisticRegression solved to a tight tolerance, and where the trainer uses it."""

from __future__ import annotations

import warnings

import duckdb
import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from synthetic import class_clusters, write_feature_store

from featstore.compute.specs import RunOptions
from featstore.probing.lbfgs import SoftmaxObjective, _strong_wolfe, chunk_rows, minimise
from featstore.probing.strength import Softmax, StrengthGrid, Tolerances, choose_and_solve
from featstore.workflows.probe import ProbeConfig, probe


def _digits() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    return StandardScaler().fit_transform(x).astype(np.float32), y


def test_loss_and_gradient_match_autograd():
    x, y = _digits()
    z = torch.from_numpy(np.stack([x[:300], x[300:600]]))  # two anchors, one batched call
    labels = torch.from_numpy(y[:300])
    objective = SoftmaxObjective(z, labels, 10, l2=0.01)
    w = torch.randn(2, 65, 10, generator=torch.Generator().manual_seed(0)) * 0.1
    loss, grad = objective(w, torch.arange(2))
    for g in range(2):
        wg = w[g].double().requires_grad_()
        logits = z[g].double() @ wg[:64] + wg[64]
        reference = torch.nn.functional.cross_entropy(logits, labels) + 0.005 * wg[:64].pow(2).sum()
        reference.backward()
        assert abs(float(loss[g]) - float(reference.detach())) < 1e-5
        assert torch.allclose(grad[g].double(), wg.grad, atol=1e-6)
    one, _ = objective(w[1:], torch.tensor([1]))  # a subset of the anchors sees its own rows
    assert abs(float(one[0]) - float(loss[1])) < 1e-6


def test_the_gradient_at_the_digits_shape_is_the_same_at_one_and_two_threads():
    """The shape of the digits store's widest anchors (1,437 fit rows x 512 x 10 classes): loss and gradient equal
    to the last bit at 1 and 2 threads (docs/threads.md, "Which products"), so a solve's path cannot part. The
    transposed product P^T z, 5-7x faster here, differed on the machine this was measured on."""
    gen = torch.Generator().manual_seed(0)
    z, labels = torch.randn(1, 1437, 512, generator=gen), torch.randint(0, 10, (1437,), generator=gen)
    w = torch.randn(1, 513, 10, generator=gen) * 0.01
    saved, out = torch.get_num_threads(), []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out.append(SoftmaxObjective(z, labels, 10, l2=1e-3)(w, torch.arange(1)))
    finally:
        torch.set_num_threads(saved)
    (loss1, grad1), (loss2, grad2) = out
    assert torch.equal(loss1, loss2) and torch.equal(grad1, grad2), float((grad1 - grad2).abs().max())


def test_float64_chunks_at_1000_classes_match_autograd_and_one_and_two_threads():
    """ImageNet's class count in float64, the rows in several cache-sized chunks: the loss and gradient of labels and
    of target distributions (the lens) equal autograd's cross-entropy to 1e-12, and the same bits at 1 and 2
    threads (the chunks' sums are added in one order at any thread count)."""
    gen = torch.Generator().manual_seed(0)
    n, d, classes = 1500, 16, 1000
    assert chunk_rows(2, classes, torch.float64, torch.device("cpu")) < n / 2  # three chunks or more
    z = torch.randn(2, n, d, generator=gen, dtype=torch.float64)
    w = torch.randn(2, d + 1, classes, generator=gen, dtype=torch.float64) * 0.3
    hard = torch.randint(0, classes, (n,), generator=gen)
    soft = torch.softmax(torch.randn(n, classes, generator=gen) * 3, dim=-1)  # float32, as the model's outputs
    for y in (hard, soft):
        objective = SoftmaxObjective(z, y, classes, l2=0.01, dtype=torch.float64)
        saved, out = torch.get_num_threads(), []
        try:
            for threads in (1, 2):
                torch.set_num_threads(threads)
                out.append(objective(w, torch.arange(2)))
        finally:
            torch.set_num_threads(saved)
        (loss, grad), (loss2, grad2) = out
        assert torch.equal(loss, loss2) and torch.equal(grad, grad2)
        for g in range(2):
            wg = w[g].clone().requires_grad_()
            target = y.double() if y.is_floating_point() else y
            reference = (torch.nn.functional.cross_entropy(z[g] @ wg[:d] + wg[d], target)
                         + 0.005 * wg[:d].pow(2).sum())
            reference.backward()
            assert abs(float(loss[g]) - float(reference.detach())) <= 1e-12 * float(reference.detach())
            assert torch.allclose(grad[g], wg.grad, rtol=0, atol=1e-12)


def test_minimum_matches_sklearn_solved_tightly():
    """Same objective as LogisticRegression(C=1) on the same rows: the same minimum (loss within 1e-5, every
    prediction equal), reached from zero by the gradient criterion."""
    x, y = _digits()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = LogisticRegression(C=1.0, tol=1e-10, max_iter=5000).fit(x, y)
    objective = SoftmaxObjective(torch.from_numpy(x)[None], torch.from_numpy(y), 10, l2=1.0 / len(y))
    w, (state,) = minimise(objective, torch.zeros(1, 65, 10), gtol=1e-5, max_iter=500)
    theirs = torch.from_numpy(np.vstack([clf.coef_.T, clf.intercept_[None]]).astype(np.float32))[None]
    their_loss = float(objective(theirs, torch.arange(1))[0][0])
    assert state.stop == "gradient" and state.max_gradient <= 1e-5 and state.iterations < 500
    assert abs(state.loss - their_loss) < 1e-5 * their_loss
    ours = (torch.from_numpy(x) @ w[0, :64] + w[0, 64]).argmax(1).numpy()
    assert (ours == clf.predict(x)).mean() > 0.998


def test_the_cap_is_reported():
    x, y = _digits()
    objective = SoftmaxObjective(torch.from_numpy(x)[None], torch.from_numpy(y), 10, l2=1.0 / len(y))
    _, (state,) = minimise(objective, torch.zeros(1, 65, 10), gtol=1e-9, max_iter=3)
    assert state.stop == "cap" and state.iterations == 3


def test_resident_fits_finish_by_lbfgs_and_streamed_ones_by_sgd(tmp_path):
    """With `full_batch=1`: L-BFGS finishes resident fits to the gradient test; a streamed store keeps SGD."""
    feats, labels = class_clusters(2000, 20, [48, 48, 96], seed=3)
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, 20, chunk_rows=512)
    stops = {}
    for budget in ("4GB", "0"):
        db = tmp_path / f"{budget}.duckdb"
        probe(ProbeConfig(store=store, model="synthetic", db=db, memory_budget=budget, variant="linear:full_batch=1",
                          run=RunOptions(progress=False)))
        con = duckdb.connect(str(db), read_only=True)
        stops[budget] = con.execute("SELECT converged, info->>'lbfgs_stop', (info->>'max_gradient')::DOUBLE "
                                    "FROM probe_fits ORDER BY anchor").fetchall()
        con.close()
    # converged by the gradient test, or at the float32 floor a little above it
    assert all(c and stop in ("gradient", "precision") and g <= 1e-4 for c, stop, g in stops["4GB"]), stops
    assert all(c and stop is None for c, stop, _ in stops["0"]), stops


def _search(f, slope, step: float) -> tuple[int, list[float]]:
    """Run one line search on a function of the step: the index it accepts and the steps it tried."""
    search = _strong_wolfe(f(0.0), slope(0.0), step, 1.0)
    tried = [next(search)]
    try:
        while True:
            tried.append(search.send((f(tried[-1]), slope(tried[-1]))))
    except StopIteration as done:
        return done.value, tried


def test_the_line_search_meets_the_wolfe_conditions_extrapolating_when_needed():
    """A minimum 50 unit steps away: the search extrapolates (10x per evaluation) instead of accepting the first
    step that lowers the loss, and the accepted step meets both conditions (sufficient decrease, and the slope
    shrunk to at most 0.9 of the initial one)."""
    f, slope = (lambda t: (t - 50.0) ** 2), (lambda t: 2 * (t - 50.0))
    index, tried = _search(f, slope, 1.0)
    t = tried[index]
    assert f(t) <= f(0) + 1e-3 * t * slope(0) and abs(slope(t)) <= 0.9 * abs(slope(0))
    assert t >= 10 and len(tried) <= 4


def test_the_line_search_takes_any_decrease_when_no_step_meets_the_conditions():
    """A loss that falls steeply only within 1e-7 of the start, then gently (what a feature far off its
    standardising scale makes): no tried step meets the sufficient-decrease condition, and the search returns
    the lowest loss it saw instead of giving up (which stopped such fits at the start, at chance accuracy)."""
    drop, width = 1e-3, 2e-8
    f = lambda t: 2.3 - drop * (1 - np.exp(-t / width)) - 0.3 * t  # noqa: E731
    slope = lambda t: -drop / width * np.exp(-t / width) - 0.3  # noqa: E731
    index, tried = _search(f, slope, 0.0043)
    assert index >= 0 and f(tried[index]) < f(0) - drop


def _correlated(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """900 rows x 256 standardised features driven by 16 latent directions (as a network's pooled units are: most
    columns correlated), 8 classes apart along those directions: a weak penalty's Hessian spans several decades."""
    gen = np.random.default_rng(seed)
    labels = gen.integers(0, 8, 900)
    latent = gen.standard_normal((900, 16)) + 2.0 * gen.standard_normal((8, 16))[labels]
    x = latent @ gen.standard_normal((16, 256)) + 0.05 * gen.standard_normal((900, 256))
    return (x - x.mean(0)) / x.std(0), labels


def test_correlated_features_reach_the_exact_optimum_in_few_passes():
    """The C path and refit on correlated features, preconditioned by the feature side of the Hessian
    (`RowPreconditioner`): every row predicted as scikit-learn's Newton-CG at tol 1e-8 at the chosen C, in at most
    300 passes over the rows (plain L-BFGS took 371 here, the same predictions)."""
    x, labels = _correlated()
    is_val = np.arange(len(x)) % 10 == 0
    z = torch.from_numpy(x.astype(np.float32))[None]
    solved = choose_and_solve(z, torch.from_numpy(labels), torch.from_numpy(is_val), Softmax(8), StrengthGrid(),
                              Tolerances())
    assert solved.states[0].stop == "gradient"
    assert solved.passes[0] <= 300, solved.passes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        exact = LogisticRegression(C=solved.c[0], tol=1e-8, max_iter=10_000, solver="newton-cg").fit(x, labels)
    ours = (z[0] @ solved.w[0, :256] + solved.w[0, 256]).argmax(dim=-1).numpy()
    assert np.array_equal(ours, exact.predict(x))
