"""Circuits: the edge graph, exact clean and fully-ablated patching, the self-check that refuses models the
rewrite does not reproduce, batched EAP-IG against the first (slot-by-slot) implementation and against
brute-force edge ablation, and DDB / CSS against plain-Python computations on hand-made edge tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from eap_ig_reference import edge_count, patched_kl, reference_eap_ig_scores
from scipy.stats import spearmanr
from timm.layers import RmsNorm
from timm.models.vision_transformer import ResPostBlock, VisionTransformer

from featstore.analytics import db as fsdb
from featstore.analytics.queries import query
from featstore.compute.attribution import ViTGraph, eap_ig_scores, node_means
from featstore.errors import FeatstoreError
from featstore.records import CircuitRun

from conftest import fails, run_cli

SMALL = dict(img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=5)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=5).eval()
    images = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    graph = ViTGraph(model)
    means, _ = node_means(graph, iter([images]))
    return model, graph, images, means


def test_edge_count_follows_the_graph_formula(tiny):
    _, graph, _, _ = tiny
    assert len(graph.edges) == edge_count(2, 2) == 46
    assert edge_count(12, 12) == 32_491  # ViT-B/16, docs/design.md §8
    torch.manual_seed(0)
    three = ViTGraph(VisionTransformer(img_size=16, patch_size=8, embed_dim=24, depth=3, num_heads=4, num_classes=3))
    assert len(three.edges) == edge_count(3, 4)
    assert len({(e.src, e.dst, e.kind) for e in three.edges}) == len(three.edges)
    assert all(three.nodes[e.src].layer < three.nodes[e.dst].layer or
               (e.kind == "mlp" and three.nodes[e.src].layer == three.nodes[e.dst].layer) for e in three.edges)


def test_patching_none_is_clean_and_all_is_fully_mean_ablated(tiny):
    model, graph, images, means = tiny
    with torch.no_grad():
        x0 = graph.embed(images)
        none, _ = graph.forward(x0, means, torch.zeros(len(graph.edges), dtype=torch.bool))
        assert torch.allclose(none, model(images), atol=1e-6, rtol=0)
        everything, _ = graph.forward(x0, means, torch.ones(len(graph.edges), dtype=torch.bool))
        # independent: the model's final residual stream, averaged over the images, through norm and head
        finals = []
        handle = model.norm.register_forward_pre_hook(lambda m, i: finals.append(i[0]))
        model(images)
        handle.remove()
        expected = model.forward_head(model.norm(finals[0].mean(dim=0, keepdim=True)))
    assert torch.allclose(everything, expected.expand_as(everything), atol=1e-5)


def test_eap_ig_ranks_edges_like_brute_force_ablation(tiny):
    _, graph, images, means = tiny
    scores = eap_ig_scores(graph, iter([images]), means, steps=20).numpy()
    brute = np.array([float(patched_kl(graph, images, means, torch.arange(len(graph.edges)) == e))
                      for e in range(len(graph.edges))])
    rho = spearmanr(np.abs(scores), brute).statistic
    assert rho > 0.6, rho  # chance is 0; measured 0.82 on this model


@pytest.mark.parametrize(("dtype", "norm"), [(torch.float64, None), (torch.float32, None), (torch.float64, RmsNorm)])
def test_batched_eap_ig_equals_the_slot_by_slot_implementation(dtype, norm):
    """Same edges, same numbers: LayerScale, qk-norm, no qkv bias and 4 heads exercise every term; RmsNorm
    takes the generic (torch.func) norm product instead of LayerNorm's closed form."""
    torch.manual_seed(3)
    model = VisionTransformer(img_size=16, patch_size=8, embed_dim=24, depth=3, num_heads=4, num_classes=5,
                              init_values=0.5, qk_norm=True, qkv_bias=False,
                              **({"norm_layer": norm} if norm else {})).eval().to(dtype)
    images = torch.randn(6, 3, 16, 16, generator=torch.Generator().manual_seed(4), dtype=dtype)
    graph = ViTGraph(model)
    means, _ = node_means(graph, iter([images]))
    batched = eap_ig_scores(graph, iter([images[:4], images[4:]]), means, steps=3).numpy()
    reference = reference_eap_ig_scores(graph, iter([images[:4], images[4:]]), means, steps=3).numpy()
    if dtype == torch.float64:  # the same sums in another order: equal edge by edge
        np.testing.assert_allclose(batched, reference, rtol=1e-9, atol=0)
    else:  # float32 rounding: both lie ~1e-5 of the largest score from the float64 values
        assert np.abs(batched - reference).max() <= 5e-5 * np.abs(reference).max()
        assert spearmanr(batched, reference).statistic > 0.9999


def test_self_check_accepts_plain_vits():
    images = torch.randn(3, 3, 16, 16)
    for options in ({}, {"global_pool": "avg", "init_values": 0.1}, {"qk_norm": True, "global_pool": "map"},
                    {"class_token": False, "global_pool": "avg", "reg_tokens": 2}):
        torch.manual_seed(0)
        gap = ViTGraph(VisionTransformer(**SMALL, **options)).self_check(images)
        assert gap < 1e-5, options


def test_self_check_refuses_an_attention_with_an_extra_norm():
    """beit3's layout: a LayerNorm inside the attention, before the output projection."""
    torch.manual_seed(0)
    graph = ViTGraph(VisionTransformer(**SMALL, scale_attn_norm=True), "extra-norm-vit")
    with pytest.raises(FeatstoreError, match=r"cannot rewrite extra-norm-vit: unsupported part blocks\.0\.attn\.norm "
                                             r"\(LayerNorm\).*differs from model\(x\) by"):
        graph.self_check(torch.randn(3, 3, 16, 16))
    with pytest.raises(FeatstoreError, match="extra-norm-vit"):  # every run checks before scoring
        node_means(graph, iter([torch.randn(3, 3, 16, 16)]))


def test_self_check_names_the_block_a_hidden_change_sits_in():
    torch.manual_seed(0)
    model = VisionTransformer(**SMALL).eval()
    model.blocks[1].register_forward_hook(lambda _m, _i, out: out + torch.linspace(-1, 1, 16))
    with pytest.raises(FeatstoreError, match=r"unsupported part blocks\.1 \(its forward"):
        ViTGraph(model, "hooked").self_check(torch.randn(3, 3, 16, 16))


def test_unsupported_block_types_are_refused_in_one_line():
    with pytest.raises(FeatstoreError, match="cannot rewrite rpn-vit: unsupported block type ResPostBlock"):
        ViTGraph(VisionTransformer(**SMALL, block_fn=ResPostBlock), "rpn-vit")


def hand_made_edges(rng, layers: int, n: int):
    src_layer = rng.integers(-1, layers, n)
    dst_layer = np.minimum(src_layer + rng.integers(1, layers + 1, n), layers)
    return src_layer, dst_layer, rng.normal(0, 1, n)


@pytest.fixture(scope="module")
def edge_db(tmp_path_factory):
    rng = np.random.default_rng(0)
    db = tmp_path_factory.mktemp("edges") / "f.duckdb"
    con = fsdb.connect(db)
    layers, n = 10, 400
    src_layer, dst_layer, score = hand_made_edges(rng, layers, n)
    shifted = score + rng.normal(0, 0.7, n)
    shifted[:5] = score[:5]  # some ties in the ranks
    names = [(f"s{i}", f"d{i}", int(a), int(b)) for i, (a, b) in enumerate(zip(src_layer, dst_layer, strict=True))]
    for view, values in (("clean", score), ("noise", shifted)):
        run = CircuitRun(f"vit/{view}/eap-ig5", "vit", view, layers, 2, 5, 10, len(names), {})
        fsdb.write_circuit(con, run, names, values)
    con.close()
    return db, layers, src_layer, dst_layer, score, shifted


@pytest.mark.parametrize("variant", ["global", "deep", "out"])
@pytest.mark.parametrize("tau", [0.3, 0.2])
def test_ddb_equals_plain_python(edge_db, variant, tau):
    db, layers, src, dst, score, _ = edge_db
    targets = {"global": np.ones_like(dst, bool), "deep": dst >= (1 - tau) * layers, "out": dst == layers}[variant]
    deep = np.abs(score)[targets & (src >= (1 - tau) * layers)].sum()
    shallow = np.abs(score)[targets & (src < tau * layers)].sum()
    got = query(db, "SELECT * FROM ddb(tau := ?, variant := ?) WHERE view = 'clean'", [tau, variant]).to_dicts()[0]
    assert got["ddb"] == pytest.approx(np.log(deep / shallow))
    idm = query(db, "SELECT * FROM idm('vit/clean/eap-ig5')")
    for i, j, lam in idm.rows():
        assert lam == pytest.approx(np.abs(score)[(src == i) & (dst == j)].sum())


def test_css_equals_plain_python(edge_db):
    db, _, _, _, x, y = edge_db
    expected = {"srcc": 1 - spearmanr(x, y).statistic,
                "cosine": 1 - x @ y / (np.linalg.norm(x) * np.linalg.norm(y)),
                "l2": np.linalg.norm(x - y)}
    top_x, top_y = set(np.argsort(-np.abs(x))[:50]), set(np.argsort(-np.abs(y))[:50])
    expected["jaccard"] = 1 - len(top_x & top_y) / len(top_x | top_y)
    for distance, value in expected.items():
        got = query(db, "SELECT * FROM css('vit/clean/eap-ig5', 'vit/noise/eap-ig5', distance := ?, top_n := 50)",
                    [distance])
        assert got["css"][0] == pytest.approx(value), distance
        assert got["n_edges"][0] == 400


def test_circuits_ddb_css_commands(image_dir, tmp_path):
    db = tmp_path / "f.duckdb"
    common = ["--model", "vit_tiny_patch16_224", "--weights", "none", "--image-size", "32", "--data", image_dir,
              "--db", db, "--ig-steps", "2", "--workers", "0", "--no-progress"]
    run_cli("circuits", *common)
    run_cli("circuits", *common, "--view", "gaussian_noise-2")
    runs = query(db, "SELECT run_id, n_edges, n_images FROM circuit_runs ORDER BY run_id").rows()
    assert runs == [("vit_tiny_patch16_224/clean/eap-ig2", edge_count(12, 3), 12),
                    ("vit_tiny_patch16_224/gaussian_noise-2/eap-ig2", edge_count(12, 3), 12)]
    assert "vit_tiny_patch16_224/clean/eap-ig2" in run_cli("ddb", "--db", db, "--variant", "out").output
    out = run_cli("css", "--db", db, "--id", "vit_tiny_patch16_224/clean/eap-ig2", "--ood",
                  "vit_tiny_patch16_224/gaussian_noise-2/eap-ig2", "--format", "csv").output
    assert out.splitlines()[0] == "id_run,ood_run,distance,css,n_edges"
    graph = run_cli("css", "--db", db, "--id", "vit_tiny_patch16_224/clean/eap-ig2", "--ood",
                    "vit_tiny_patch16_224/gaussian_noise-2/eap-ig2", "--distance", "netlsd", "--top-n", "50",
                    "--format", "csv").output.splitlines()
    assert graph[1].split(",")[2] == "netlsd" and float(graph[1].split(",")[3]) >= 0
    # computed from the edges on the fly: a query command writes nothing
    assert query(db, "SELECT count(*) AS n FROM css_graph")["n"][0] == 0
    assert "no common edges" in fails("css", "--db", db, "--id", "a", "--ood", "b")
    run_cli("report", "--db", db, "--out", tmp_path / "rep", "--figures", "svg")
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "Circuit shift score" in page and page.count("<figcaption>Inter-layer dependency matrix") == 2
    assert len(list((tmp_path / "rep").glob("*_idm.svg"))) == 2
    assert "circuits need a timm VisionTransformer" in fails("circuits", *common[2:], "--model", "resnet18")


def test_circuits_command_refuses_beit3_before_writing(image_dir, tmp_path):
    db = tmp_path / "f.duckdb"
    line = fails("circuits", "--model", "beit3_base_patch16_224", "--weights", "none", "--image-size", "32",
                 "--data", image_dir, "--db", db, "--limit", "2", "--ig-steps", "1", "--workers", "0",
                 "--no-progress")
    assert "cannot rewrite beit3_base_patch16_224: unsupported part blocks.0.attn.norm (LayerNorm)" in line
    assert not db.exists()
