"""`head-probe` (`--variant lens` runs it too; not Belrose et al.'s tuned lens, which is `tuned-lens`): per anchor an
affine map into the head's input space read through the model's frozen head, trained on KL(head || lens). Checked
against what the project computes apart: the head the build keeps is the network's own classifier (the same
random-init ResNet-18 loaded again here) and reproduces the stored logits from the stored head-input features; at
the head's input anchor the lens agrees with the argmax of the stored logits on >= 99.5% of the held-out images;
the objective's value and gradient equal torch.autograd's of a KL written here from its definition; on the demo's
trained network the lens predicts as an exact solve (scipy, float64) of the same objective written in the logits'
own coordinates, at the C it chose on the val rows; a store without the head is refused in one line."""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest
import torch
from synthetic import class_clusters, write_feature_store

from featstore.nets.models import load_model
from featstore.probing.split import make_split
from featstore.probing.translator import TranslatorObjective
from featstore.store.reader import FeatureStore

from conftest import fails, run_cli


def test_the_build_keeps_the_networks_head(digits_store):
    fs = FeatureStore(digits_store)
    weight, bias, module = fs.read_head("resnet18")
    fc = load_model("resnet18", "none", seed=0, image_size=32).module.fc
    assert module == "fc"
    assert np.array_equal(weight, fc.weight.numpy()) and np.array_equal(bias, fc.bias.numpy())
    last = fs.anchors("resnet18")[-1]
    x = fs.read("resnet18", "clean", last.name).astype(np.float64)  # avgpool: what fc reads, stored float16
    logits = fs.read_logits("resnet18", "clean").astype(np.float64)
    assert np.abs(x @ weight.T.astype(np.float64) + bias - logits).max() < 2e-2 * max(1.0, np.abs(logits).max())
    assert "head" not in fs.views("resnet18")  # the head group is no view


@pytest.fixture(scope="module")
def three_anchor_store(digits_store, tmp_path_factory):
    """The digits through the same network at three anchors: the stem (narrower than the head's input), a 512-wide
    block output that is not the head's input, and avgpool (what fc reads). The translator's cost is its L-BFGS
    iterations times the anchors' widths; all 12 anchors take 5 minutes of one core."""
    store = tmp_path_factory.mktemp("lens") / "s.zarr"
    run_cli("build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--data",
            digits_store.parent / "images", "--store", store, "--anchors", "relu,layer4.0,avgpool", "--no-progress")
    return store


def test_lens_at_the_head_input_agrees_with_the_head(three_anchor_store, tmp_path):
    db = tmp_path / "f.duckdb"
    run_cli("probe", "--store", three_anchor_store, "--model", "resnet18", "--db", db, "--variant", "head-probe",
            "--no-progress", "--threads", "1")
    fs = FeatureStore(three_anchor_store)
    anchors = fs.anchors("resnet18")
    n = fs.num_images
    con = duckdb.connect(str(db), read_only=True)
    pred = con.execute("SELECT pred FROM predictions WHERE run_id = 'resnet18/clean/head-probe' ORDER BY image_id, "
                       "anchor").fetchnumpy()["pred"].reshape(n, len(anchors))
    infos = {a: json.loads(i) for a, i in con.execute("SELECT anchor, info FROM probe_fits WHERE run_id = "
                                                       "'resnet18/clean/head-probe'").fetchall()}
    con.close()
    head = fs.read_logits("resnet18", "clean").astype(np.float32).argmax(axis=1)
    test = make_split(fs.image_table()["image_id"]) == "test"
    agreement = float((pred[test, -1] == head[test]).mean())
    print(f"lens at {anchors[-1].name}: {agreement:.4f} of {int(test.sum())} held-out images agree with the head")
    assert agreement >= 0.995
    width = fs.read_head("resnet18")[0].shape[1]
    for a in anchors:  # identity where the width is the head input's, the head's marginal elsewhere
        assert infos[a.index]["init"] == ("identity" if a.dim == width else "head marginal"), a.name
        assert infos[a.index]["map"] == "translator"
    early = float((pred[test, 0] == head[test]).mean())
    assert early < agreement  # the first anchor's lens is no copy of the head


# both orders of the products: the head composed into the map (D x C <= D_head x (D + C)), and through the head's input
@pytest.mark.parametrize("d, dh, c", [(5, 4, 6), (9, 4, 12)])
def test_the_kl_objective_gradient_equals_autograd(d, dh, c):
    """The objective is a function of the map's move V in a basis of the head's input space (W = W0 + V basis^T),
    penalised by l2/2 |V[:D]|^2 (the bias moves freely), for per-anchor strengths."""
    gen = torch.Generator().manual_seed(0)
    g, n, r = 2, 37, dh - 1
    z = torch.randn(g, n, d, generator=gen, dtype=torch.float64)
    y = torch.softmax(torch.randn(n, c, generator=gen, dtype=torch.float64) * 2, dim=-1)
    wh, bh = torch.randn(c, dh, generator=gen, dtype=torch.float64), torch.randn(c, generator=gen, dtype=torch.float64)
    w0 = torch.randn(g, d + 1, dh, generator=gen, dtype=torch.float64)
    basis = torch.randn(dh, r, generator=gen, dtype=torch.float64)
    v = torch.randn(g, d + 1, r, generator=gen, dtype=torch.float64)
    l2 = torch.tensor([0.3, 0.05], dtype=torch.float64)
    objective = TranslatorObjective(z, y, wh.T.contiguous(), bh, w0, basis, l2, dtype=torch.float64)
    loss, grad = objective(v, torch.arange(g))
    ref = v.clone().requires_grad_(True)
    for i in range(g):  # KL(y || q) from its definition, per anchor, plus the penalty on the map's move
        w = w0[i] + ref[i] @ basis.T
        a_t, b = w[:d], w[d]
        logq = torch.log_softmax((z[i] @ a_t + b) @ wh.T + bh, dim=-1)
        kl = (y * (y.log() - logq)).sum(dim=1).mean() + 0.5 * l2[i] * ref[i, :d].pow(2).sum()
        (expected_grad,) = torch.autograd.grad(kl, ref)
        assert abs(float(loss[i]) - float(kl.detach())) < 1e-12
        assert torch.allclose(grad[i], expected_grad[i], rtol=1e-10, atol=1e-12)
    assert not torch.allclose(grad[0], grad[1])  # two anchors, two gradients
    only = objective(v[1:], torch.tensor([1]))  # a subset of the anchors reads its own rows
    assert torch.allclose(only[1][0], grad[1], rtol=1e-12, atol=1e-14)


def test_the_basis_whitens_the_heads_fisher_metric():
    """basis^T H basis = I on H's range, H = W^T (diag p - p p^T) W from its definition, and the directions it
    drops change no logit difference (the head's null space and the softmax's shift)."""
    from featstore.probing.translator import head_basis

    gen = torch.Generator().manual_seed(1)
    w = torch.randn(6, 10, generator=gen, dtype=torch.float64)  # 6 classes, 10-wide input: rank 5 with the shift
    p = torch.softmax(torch.randn(6, generator=gen, dtype=torch.float64), dim=0)
    h = w.T @ (torch.diag(p) - torch.outer(p, p)) @ w
    basis = head_basis(w.float(), p.float()).double()
    assert basis.shape == (10, 5)
    assert torch.allclose(basis.T @ h @ basis, torch.eye(5, dtype=torch.float64), atol=1e-4)
    dropped = torch.linalg.svd(basis.T, full_matrices=True).Vh[5:].T  # [10, 5]: orthogonal to the basis
    logits = w @ dropped  # each dropped direction's change of the logits: the same for every class
    assert torch.allclose(logits - logits.mean(dim=0), torch.zeros_like(logits), atol=1e-4)


def exact_lens(x: np.ndarray, y: np.ndarray, weight: np.ndarray, bias: np.ndarray, fit: np.ndarray, train: np.ndarray,
               c: float, identity: bool, gtol: float = 1e-9) -> np.ndarray:
    """The lens's optimum written apart from featstore: its map moves the logits by L z + l (z the features
    standardised on the fit rows; L = W_head (A - A0) spans every [C, D] matrix when the head has full row rank),
    so it is a softmax regression on the head's distribution y, offset by the start's logits (the head's own on
    its input, a constant elsewhere, which l absorbs), with the penalty |A - A0|^2 in the head's Fisher metric at the
    train rows' marginal p: sum_d L[:, d]^T (diag p - p p^T) L[:, d], scaled 1 / (2 C n). scipy's Newton
    trust-region CG in float64 (its Hessian-vector product written out below) to a gradient of 1e-10, or to where
    float64 stops resolving a step just above it (1.6e-10 at worst on the demo's anchors); L-BFGS-B took 13 s for
    the four anchors the test checks against Newton's 1.2 s, to the same class on every test image. Returns the
    logits of every row. `gtol`: the largest gradient accepted at the end (a few rows of a tiny set leave the
    optimum flat: trust-ncg stops at ~1e-8 there)."""
    from scipy.optimize import minimize
    from sklearn.preprocessing import StandardScaler

    z = StandardScaler().fit(x[fit]).transform(x)
    base = x @ weight.T + bias if identity else np.zeros((len(x), len(bias)))
    p = y[train].mean(axis=0)
    sigma = np.diag(p) - np.outer(p, p)
    zf, yf, bf = z[fit], y[fit], base[fit]
    n, d, k = len(zf), z.shape[1], y.shape[1]
    l2 = 1.0 / (c * n)

    def split(theta):
        return theta[: k * d].reshape(k, d), theta[k * d :]

    def log_probabilities(theta):
        big_l, small_l = split(theta)
        logits = bf + zf @ big_l.T + small_l
        logits -= logits.max(axis=1, keepdims=True)
        return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))

    def loss_and_grad(theta):
        big_l, _ = split(theta)
        logq = log_probabilities(theta)
        penalty = 0.5 * l2 * np.einsum("kd,kj,jd->", big_l, sigma, big_l)
        g = (np.exp(logq) - yf) / n
        grad_l = g.T @ zf + l2 * sigma @ big_l
        return -(yf * logq).sum() / n + penalty, np.concatenate([grad_l.ravel(), g.sum(axis=0)])

    def hessp(theta, v):  # the loss's Hessian times v: the softmax's Jacobian on the logits' move, plus the penalty's
        q = np.exp(log_probabilities(theta))
        move_l, move_b = split(v)
        moved = zf @ move_l.T + move_b
        dq = q * (moved - (q * moved).sum(axis=1, keepdims=True)) / n
        return np.concatenate([(dq.T @ zf + l2 * sigma @ move_l).ravel(), dq.sum(axis=0)])

    out = minimize(loss_and_grad, np.zeros(k * d + k), jac=True, hessp=hessp, method="trust-ncg",
                   options={"maxiter": 10_000, "gtol": 1e-10})
    assert np.abs(loss_and_grad(out.x)[1]).max() <= gtol, out.message  # at the optimum, to float64's floor
    big_l, small_l = split(out.x)
    return base + z @ big_l.T + small_l


def test_the_demos_lens_is_the_exact_optimum_at_its_chosen_strength(demo):
    """On the demo's trained ResNet-18 (8 classes, 512-wide head input), >= 99.5% of test images get the class of
    `exact_lens` at featstore's chosen C, one of the declared grid's, chosen on the val loss: at the stem (64 wide),
    a middle block, a 512-wide block that is not the head's input and the head's input (identity start). All 12
    anchors agreed on every test image when measured."""
    home = demo[0] / "layouts"
    fs = FeatureStore(home / "store.zarr")
    weight, bias, _ = fs.read_head("resnet18")
    weight, bias = weight.astype(np.float64), bias.astype(np.float64)
    logits = fs.read_logits("resnet18", "clean").astype(np.float64)
    y = np.exp(logits - logits.max(axis=1, keepdims=True))
    y /= y.sum(axis=1, keepdims=True)
    con = duckdb.connect(str(home / "featstore.duckdb"), read_only=True)
    run = "resnet18/clean/head-probe"
    pred = con.execute("SELECT pred FROM predictions WHERE run_id = ? ORDER BY image_id, anchor", [run]).fetchnumpy()
    infos = {a: json.loads(i) for a, i in con.execute("SELECT anchor, info FROM probe_fits WHERE run_id = ?",
                                                       [run]).fetchall()}
    split = dict(con.execute("SELECT image_id, split FROM images").fetchall())
    con.close()
    anchors = fs.anchors("resnet18")
    ids = fs.image_table()["image_id"]
    pred = pred["pred"].reshape(len(ids), len(anchors))
    split = np.array([split[int(i)] for i in ids])
    fit, train, test = np.isin(split, ["train", "val"]), split == "train", split == "test"
    grid = (0.001, 0.00316, 0.01, 0.0316, 0.1, 0.316, 1, 3.16, 10, 31.6, 100)
    for a in (anchors[0], anchors[4], anchors[9], anchors[-1]):
        info = infos[a.index]
        assert info["C"] in grid and info["C_chosen_on"] == "val loss", (a.name, info["C"])
        assert min(info["val_loss_per_C"].values()) >= info["val_loss_per_C"][format(info["C"], "g")] * (1 - 1e-3)
        x = fs.read("resnet18", "clean", a.name).astype(np.float64)
        theirs = exact_lens(x, y, weight, bias, fit, train, info["C"], info["init"] == "identity").argmax(axis=1)
        agree = float((pred[test, a.index] == theirs[test]).mean())
        print(f"{a.name}: C={info['C']:g}, {agree:.4f} of {int(test.sum())} test images as the exact optimum")
        assert agree >= 0.995, (a.name, agree)


def test_a_store_without_the_head_is_refused(tmp_path):
    feats, labels = class_clusters(120, 4, [8, 8], seed=1)
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, 4)  # writes no head, as stores before did
    db = tmp_path / "f.duckdb"
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", "head-probe")
    assert "keeps no head weights" in line and "featstore build" in line and "lens-direct" in line
    assert not db.exists() and "probes" not in FeatureStore(store).listed("synthetic")
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", "lens-direct",
            "--no-progress", "--threads", "1")  # the direct map needs no head
