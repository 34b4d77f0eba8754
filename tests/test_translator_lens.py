"""The translator `lens` (tuned lens, Belrose et al. 2023): per anchor an affine map into the head's input space read
through the model's frozen head, trained on KL(head || lens). Checked against what the project computes apart:
the head the build keeps is the network's own classifier (the same random-init ResNet-18 loaded again here) and
reproduces the stored logits from the stored head-input features; at the head's input anchor the lens agrees with
the argmax of the stored logits on >= 99.5% of the held-out images; the objective's value and gradient equal
torch.autograd's of a KL written here from its definition; a store without the head is refused in one line."""

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
    run_cli("probe", "--store", three_anchor_store, "--model", "resnet18", "--db", db, "--variant", "lens",
            "--no-progress", "--threads", "1")
    fs = FeatureStore(three_anchor_store)
    anchors = fs.anchors("resnet18")
    n = fs.num_images
    con = duckdb.connect(str(db), read_only=True)
    pred = con.execute("SELECT pred FROM predictions WHERE run_id = 'resnet18/clean/lens' ORDER BY image_id, "
                       "anchor").fetchnumpy()["pred"].reshape(n, len(anchors))
    infos = {a: json.loads(i) for a, i in con.execute("SELECT anchor, info FROM probe_fits WHERE run_id = "
                                                       "'resnet18/clean/lens'").fetchall()}
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
    gen = torch.Generator().manual_seed(0)
    g, n = 2, 37
    z = torch.randn(g, n, d, generator=gen, dtype=torch.float64)
    y = torch.softmax(torch.randn(n, c, generator=gen, dtype=torch.float64) * 2, dim=-1)
    wh, bh = torch.randn(c, dh, generator=gen, dtype=torch.float64), torch.randn(c, generator=gen, dtype=torch.float64)
    w0 = torch.randn(g, d + 1, dh, generator=gen, dtype=torch.float64)
    w = torch.randn(g, d + 1, dh, generator=gen, dtype=torch.float64)
    l2 = 0.3
    objective = TranslatorObjective(z, y, wh.T.contiguous(), bh, w0, l2, dtype=torch.float64)
    loss, grad = objective(w, torch.arange(g))
    ref = w.clone().requires_grad_(True)
    for i in range(g):  # KL(y || q) from its definition, per anchor, plus the penalty on A's distance from A0
        a_t, b = ref[i, :d], ref[i, d]
        logq = torch.log_softmax((z[i] @ a_t + b) @ wh.T + bh, dim=-1)
        kl = (y * (y.log() - logq)).sum(dim=1).mean() + 0.5 * l2 * (a_t - w0[i, :d]).pow(2).sum()
        (expected_grad,) = torch.autograd.grad(kl, ref)
        assert abs(float(loss[i]) - float(kl.detach())) < 1e-12
        assert torch.allclose(grad[i], expected_grad[i], rtol=1e-10, atol=1e-12)
    assert not torch.allclose(grad[0], grad[1])  # two anchors, two gradients
    only = objective(w[1:], torch.tensor([1]))  # a subset of the anchors reads its own rows
    assert torch.allclose(only[1][0], grad[1], rtol=1e-12, atol=1e-14)


def test_a_store_without_the_head_is_refused(tmp_path):
    feats, labels = class_clusters(120, 4, [8, 8], seed=1)
    store = write_feature_store(tmp_path / "s.zarr", feats, labels, 4)  # writes no head, as stores before did
    db = tmp_path / "f.duckdb"
    line = fails("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", "lens")
    assert "keeps no head weights" in line and "featstore build" in line and "lens-direct" in line
    assert not db.exists() and "probes" not in FeatureStore(store).listed("synthetic")
    run_cli("probe", "--store", store, "--model", "synthetic", "--db", db, "--variant", "lens-direct",
            "--no-progress", "--threads", "1")  # the direct map needs no head
