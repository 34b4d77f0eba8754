"""The real weight-loading paths, offline: hub cache files, local state dicts, and the offline errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from urllib.error import URLError

import pytest
import torch
import torchvision
from torchvision.models import ResNet18_Weights, ResNet50_Weights

import featstore.models
from featstore.errors import FeatstoreError
from featstore.models import load_model, published_top1, resolve_weights
from featstore.store import FeatureStore

from conftest import assert_fp16_close, reference_batch, run_cli

SMALL = ["--image-size", "32", "--chunk-rows", "6", "--batch-size", "3", "--workers", "0", "--no-progress"]


def _logits(model: torch.nn.Module, store: FeatureStore, key: str, image_dir: Path) -> torch.Tensor:
    paths = [image_dir / p for p in store.image_table()["path"]]
    x = reference_batch(paths, store.model_attrs(key)["config"]["preprocessing"])
    with torch.no_grad():
        return torch.cat([model.eval()(part) for part in x.split(3)])


def _place_in_hub_cache(model: torch.nn.Module, weights, tmp_path: Path, monkeypatch) -> torch.nn.Module:
    """Put `model`'s state dict where torch's hub looks for the file of `weights` (a fresh hub dir)."""
    hub = tmp_path / "hub"
    target = hub / "checkpoints" / os.path.basename(weights.url)
    target.parent.mkdir(parents=True)
    torch.save(model.state_dict(), target)
    monkeypatch.setattr(torch.hub, "_hub_dir", str(hub))
    return model


def test_default_weights_load_from_the_torch_hub_cache(image_dir, tmp_path, monkeypatch):
    """`--weights default` runs torchvision's own download path, which finds a file placed in the hub dir."""
    torch.manual_seed(123)
    placed = _place_in_hub_cache(torchvision.models.resnet18(weights=None), ResNet18_Weights.DEFAULT, tmp_path,
                                 monkeypatch)
    store = tmp_path / "s.zarr"
    run_cli("build", "--model", "resnet18", "--weights", "default", "--data", image_dir, "--store", store, *SMALL)
    fs = FeatureStore(store)
    assert fs.model_attrs("resnet18")["config"]["weights_id"] == "torchvision:ResNet18_Weights.IMAGENET1K_V1"
    assert_fp16_close(fs.read_logits("resnet18", "clean"), _logits(placed, fs, "resnet18", image_dir).numpy(),
                      "logits")


def test_default_weights_offline_say_where_to_put_the_file(image_dir, tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise URLError("no network")

    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", offline)
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))
    for weights, file in [("auto", "resnet50-0676ba61.pth"), ("default", "resnet50-11ad3fa6.pth")]:
        result = run_cli("build", "--model", "resnet50", "--weights", weights, "--data", image_dir,
                         "--store", tmp_path / "s.zarr", *SMALL, ok=False)
        assert result.exit_code == 2
        expected = tmp_path / "hub" / "checkpoints" / file
        assert str(expected) in result.output and "--weights PATH" in result.output


def test_paper_weights_are_torchvision_v1_with_the_v1_transform(tmp_path, monkeypatch):
    """Without --weights, the paper's ResNet-50 is IMAGENET1K_V1 (resize 256 -> crop 224), not the library's V2."""
    torch.manual_seed(5)
    _place_in_hub_cache(torchvision.models.resnet50(weights=None), ResNet50_Weights.IMAGENET1K_V1, tmp_path,
                        monkeypatch)
    for weights in ("auto", "paper", "IMAGENET1K_V1"):
        loaded = load_model("resnet50", weights)
        assert loaded.weights_id == "torchvision:ResNet50_Weights.IMAGENET1K_V1"
        tf = ResNet50_Weights.IMAGENET1K_V1.transforms()
        p = loaded.preprocessing
        assert (p.resize, p.crop, p.interpolation) == (256, 224, "bilinear") == (
            tf.resize_size[0], tf.crop_size[0], tf.interpolation.value)
    assert published_top1(loaded.weights_id) == 76.13
    assert published_top1("torchvision:ResNet50_Weights.IMAGENET1K_V2") == 80.858
    assert resolve_weights("torchvision", "resnet34", "auto") == "default"
    with pytest.raises(FeatstoreError, match="the paper studies resnet18"):
        resolve_weights("torchvision", "resnet34", "paper")


def test_paper_weights_of_vit_and_convnext_are_imagenet_1k_timm_tags(monkeypatch):
    """The paper names no checkpoint for ViT-B/16 and ConvNeXt-T: ours are timm's IN-1k-only ones."""
    import timm

    asked = []

    def offline_timm(arch, image_size, pretrained=False, **kwargs):  # the real pretrained_cfg, no 86M-param build
        asked.append((arch, pretrained))
        if pretrained:
            raise OSError("offline")
        return SimpleNamespace(pretrained_cfg=timm.models.get_pretrained_cfg(arch).to_dict())

    monkeypatch.setattr(featstore.models, "_create_timm", offline_timm)
    for name, tag in [("vit_base_patch16_224", "vit_base_patch16_224.augreg_in1k"),
                      ("convnext_tiny", "convnext_tiny.fb_in1k")]:
        with pytest.raises(FeatstoreError, match=f"timm/{tag}"):
            load_model(name)  # auto = paper for the paper's models; offline, the error names the file
        assert asked[-2:] == [(tag, True), (tag, False)]
        assert published_top1(f"timm:timm/{tag}") > 79
    with pytest.raises(FeatstoreError, match="no timm pretrained tag 'in1k_v9'"):
        load_model("convnext_tiny", "in1k_v9")


def test_info_shows_weights_and_their_published_top1(image_dir, tmp_path, monkeypatch):
    torch.manual_seed(3)
    _place_in_hub_cache(torchvision.models.resnet18(weights=None), ResNet18_Weights.IMAGENET1K_V1, tmp_path,
                        monkeypatch)
    store = tmp_path / "s.zarr"
    run_cli("build", "--model", "resnet18", "--data", image_dir, "--store", store, *SMALL)
    out = run_cli("info", store).output
    assert "weights torchvision:ResNet18_Weights.IMAGENET1K_V1 (published top-1 69.76%)" in out


def test_weights_from_a_local_state_dict_with_its_own_class_count(image_dir, tmp_path):
    torch.manual_seed(7)
    trained = torchvision.models.resnet18(weights=None, num_classes=3)
    path = tmp_path / "digits-resnet18.pth"
    torch.save({"state_dict": trained.state_dict()}, path)
    store = tmp_path / "s.zarr"
    run_cli("build", "--model", "resnet18", "--weights", path, "--data", image_dir, "--store", store, *SMALL)
    fs = FeatureStore(store)
    cfg = fs.model_attrs("resnet18")["config"]
    assert cfg["weights_id"].startswith("file:digits-resnet18.pth:sha256=") and cfg["num_classes"] == 3
    assert_fp16_close(fs.read_logits("resnet18", "clean"), _logits(trained, fs, "resnet18", image_dir).numpy(),
                      "logits")


def test_a_state_dict_for_another_model_is_refused(image_dir, tmp_path):
    path = tmp_path / "wrong.pth"
    torch.save(torchvision.models.resnet50(weights=None).state_dict(), path)
    result = run_cli("build", "--model", "resnet18", "--weights", path, "--data", image_dir,
                     "--store", tmp_path / "s.zarr", *SMALL, ok=False)
    assert result.exit_code == 2 and str(path) in result.output and "does not fit resnet18" in result.output


def test_weights_are_loaded_without_unpickling_arbitrary_objects(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": {"x": torch.zeros(1)}, "hook": Path("/")}, path)  # not allowed by weights_only
    with pytest.raises(FeatstoreError, match="cannot read weights file"):
        load_model("resnet18", weights=str(path))


def test_timm_default_weights_load_from_the_hugging_face_cache(image_dir, tmp_path):
    """With HF_HUB_OFFLINE=1, timm's own pretrained path reads a file placed in the HF cache."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(11)
    placed = timm.create_model("resnet18", pretrained=False)
    snapshot = tmp_path / "hf" / "models--timm--resnet18.a1_in1k" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    save_file(placed.state_dict(), snapshot / "model.safetensors")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    store = tmp_path / "s.zarr"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf")}
    cmd = [sys.executable, "-m", "featstore.cli.main", "build", "--model", "timm/resnet18", "--weights", "default",
           "--data", str(image_dir), "--store", str(store), *SMALL]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-1500:]
    fs = FeatureStore(store)
    assert fs.model_attrs("timm_resnet18")["config"]["weights_id"] == "timm:timm/resnet18.a1_in1k"
    assert_fp16_close(fs.read_logits("timm_resnet18", "clean"),
                      _logits(placed, fs, "timm_resnet18", image_dir).numpy(), "logits")

    env["HF_HUB_CACHE"] = str(tmp_path / "empty")
    done = subprocess.run(cmd[:-len(SMALL)] + ["--store", str(tmp_path / "t.zarr"), *SMALL], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "timm/resnet18.a1_in1k" in done.stderr and "--weights PATH" in done.stderr
