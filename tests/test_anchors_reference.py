"""Every stored anchor of every preset equals an independent extraction, to float16 precision."""

from __future__ import annotations

import pytest
import timm
import torch
import torchvision
from torchvision.models.feature_extraction import create_feature_extractor

from featstore.nets.anchors import PRESETS, TIMM_PRESETS
from featstore.store.reader import FeatureStore

from conftest import assert_fp16_close, reference_batch, run_cli

TORCHVISION_PRESETS = ["resnet18", "resnet50", "resnet101"]
# oneDNN picks convolution algorithms by batch size, so float32 results move by ~1e-6 between batch sizes
# (random-init deep nets amplify that past fp16 precision): the references run the same 3-image batches.
BATCH = 3


def batched(fn, x: torch.Tensor):
    outs = [fn(part) for part in x.split(BATCH)]
    if isinstance(outs[0], dict):
        return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}
    if isinstance(outs[0], (tuple, list)):
        return [torch.cat(parts) for parts in zip(*outs, strict=True)]
    return torch.cat(outs)


def _build(image_dir, tmp_path, model: str, size: int, *extra: str) -> tuple[FeatureStore, str]:
    store = tmp_path / "s.zarr"
    run_cli("build", "--model", model, "--data", image_dir, "--store", store, "--weights", "none",
            "--image-size", size, "--chunk-rows", 6, "--batch-size", BATCH, "--workers", 0, "--no-progress", *extra)
    return FeatureStore(store), model.replace("/", "_")


def _inputs(store: FeatureStore, key: str, image_dir):
    paths = [image_dir / p for p in store.image_table()["path"]]
    return reference_batch(paths, store.model_attrs(key)["config"]["preprocessing"])


def _fx_node(anchor: str) -> str:
    # torch.fx names the first call of a block's twice-used relu `X.relu`: that is the `.mid` tap
    return anchor[: -len(".mid")] + ".relu" if anchor.endswith(".mid") else anchor


@pytest.mark.parametrize("name", TORCHVISION_PRESETS)
def test_torchvision_presets_match_feature_extractor(image_dir, tmp_path, name):
    store, key = _build(image_dir, tmp_path, name, 64)
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    nodes = {_fx_node(a): a for a in PRESETS[name]}
    extractor = create_feature_extractor(model, return_nodes=list(nodes))
    x = _inputs(store, key, image_dir)
    with torch.no_grad():
        outs = batched(extractor, x)
        logits = batched(model, x)
    assert [a.name for a in store.anchors(key)] == PRESETS[name]
    for node, anchor in nodes.items():
        assert_fp16_close(store.read(key, "clean", anchor), outs[node].mean(dim=(2, 3)).numpy(), anchor)
    assert_fp16_close(store.read_logits(key, "clean"), logits.numpy(), "logits")


@pytest.mark.parametrize(("name", "size"), [("vit_b_16", 32), ("convnext_tiny", 64)])
def test_torchvision_vit_and_convnext_presets_match_feature_extractor(image_dir, tmp_path, name, size):
    """The paper's ViT-B/16 and ConvNeXt-T are torchvision's: their presets, in torchvision's module names, against
    torchvision's own feature extractor (ViT: the CLS token of each block and of the final norm, which the head
    reads; ConvNeXt: average-pooled stage blocks and the head's norm)."""
    store, key = _build(image_dir, tmp_path, name, size, "--limit", 6)
    torch.manual_seed(0)
    extra = {"image_size": size} if name.startswith("vit") else {}
    model = getattr(torchvision.models, name)(weights=None, **extra).eval()
    extractor = create_feature_extractor(model, return_nodes=PRESETS[name])
    x = _inputs(store, key, image_dir)
    with torch.no_grad():
        outs = batched(extractor, x)
        logits = batched(model, x)
    assert [a.name for a in store.anchors(key)] == PRESETS[name]
    assert store.model_attrs(key)["config"]["library"] == "torchvision"
    for anchor in PRESETS[name]:
        out = outs[anchor]
        ref = out[:, 0] if out.ndim == 3 else out.mean(dim=(2, 3))
        assert_fp16_close(store.read(key, "clean", anchor), ref.numpy(), anchor)
    head = model.heads.head if name.startswith("vit") else model.classifier[2]
    last = torch.from_numpy(store.read(key, "clean", PRESETS[name][-1]).astype("float32"))
    assert_fp16_close(store.read_logits(key, "clean"), logits.numpy(), "logits")
    assert torch.allclose(head(last), logits, rtol=0.01, atol=0.01 * float(logits.abs().max()))  # what it reads


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_vit_preset_matches_forward_intermediates(image_dir, tmp_path, pool):
    name = "vit_base_patch16_224"
    store, key = _build(image_dir, tmp_path, name, 32, "--pool", pool)
    assert [a.name for a in store.anchors(key)] == TIMM_PRESETS[name]
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, img_size=32).eval()
    x = _inputs(store, key, image_dir)
    with torch.no_grad():
        blocks = batched(lambda b: [torch.cat([prefix, spatial], dim=1) for spatial, prefix in
                                    model.forward_intermediates(b, indices=list(range(11)), norm=False,
                                                                return_prefix_tokens=True, output_fmt="NLC",
                                                                intermediates_only=True)], x)
        final = batched(model.forward_features, x)
        logits = batched(model, x)
    for i in range(11):
        ref = blocks[i][:, 0] if pool == "cls" else blocks[i].mean(dim=1)
        assert_fp16_close(store.read(key, "clean", f"blocks.{i}"), ref.numpy(), f"blocks.{i}")
    ref = final[:, 0] if pool == "cls" else final.mean(dim=1)
    assert_fp16_close(store.read(key, "clean", "norm"), ref.numpy(), "norm")
    assert_fp16_close(store.read_logits(key, "clean"), logits.numpy(), "logits")


def test_timm_convnext_preset_matches_hooks_and_head(image_dir, tmp_path):
    name = "convnext_tiny"
    store, key = _build(image_dir, tmp_path, f"timm/{name}", 64)
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    modules = dict(model.named_modules())
    captured: dict[str, list[torch.Tensor]] = {a: [] for a in TIMM_PRESETS[name][:-1]}
    for anchor in captured:
        modules[anchor].register_forward_hook(lambda m, i, o, a=anchor: captured[a].append(o.clone()))
    x = _inputs(store, key, image_dir)
    with torch.no_grad():
        pre_logits = batched(lambda b: model.forward_head(model.forward_features(b), pre_logits=True), x)
        logits = batched(model, x)
    for anchor, outs in captured.items():
        ref = torch.cat(outs[: len(outs) // 2]).mean(dim=(2, 3))  # the first pass is forward_features
        assert_fp16_close(store.read(key, "clean", anchor), ref.numpy(), anchor)
    assert_fp16_close(store.read(key, "clean", "head.norm"), pre_logits.numpy(), "head.norm")
    assert_fp16_close(store.read_logits(key, "clean"), logits.numpy(), "logits")
