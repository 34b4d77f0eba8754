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

import featstore.nets.models
from featstore.errors import FeatstoreError
from featstore.nets.models import load_model, published_top1, resolve_weights
from featstore.store.reader import FeatureStore

from conftest import assert_fp16_close, fails, reference_batch, run_cli

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
    with pytest.raises(FeatstoreError, match="the paper studies torchvision's resnet18"):
        resolve_weights("torchvision", "resnet34", "paper")


def _light_state_dict(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """`model`'s state dict with the right shapes but one random value per output row (stride 0 elsewhere):
    a file of kilobytes that loads like an 86M-parameter checkpoint."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in model.state_dict().items():
        if not v.is_floating_point() or v.ndim == 0:
            out[k] = v
            continue
        rows = torch.randn(v.shape[0], generator=gen) * 0.05 + (1.0 if k.endswith("weight") and v.ndim == 1 else 0)
        out[k] = rows.view(-1, *([1] * (v.ndim - 1))).expand(v.shape)
    return out


@pytest.mark.parametrize(("name", "weights", "resize", "top1"), [
    ("vit_b_16", torchvision.models.ViT_B_16_Weights.IMAGENET1K_V1, 256, 81.072),
    ("convnext_tiny", torchvision.models.ConvNeXt_Tiny_Weights.IMAGENET1K_V1, 236, 82.52)])
def test_the_papers_vit_and_convnext_are_torchvision_v1_with_their_transform(name, weights, resize, top1, image_dir,
                                                                           tmp_path, monkeypatch):
    """`featstore build --model vit_b_16` / `convnext_tiny` without --weights: torchvision's IMAGENET1K_V1, read
    from the torch hub cache under its official file name, with that checkpoint's own eval transform."""
    architecture = getattr(torchvision.models, name)(weights=None)
    state = _light_state_dict(architecture, seed=len(name))
    hub = tmp_path / "hub"
    (hub / "checkpoints").mkdir(parents=True)
    torch.save(state, hub / "checkpoints" / os.path.basename(weights.url))
    monkeypatch.setattr(torch.hub, "_hub_dir", str(hub))
    store = tmp_path / "s.zarr"
    run_cli("build", "--model", name, "--data", image_dir, "--store", store, "--limit", "2", "--batch-size", "2",
            "--workers", "0", "--no-progress")
    fs = FeatureStore(store)
    cfg = fs.model_attrs(name)["config"]
    tf = weights.transforms()
    assert cfg["weights_id"] == f"torchvision:{weights}" and cfg["library"] == "torchvision"
    assert (cfg["preprocessing"]["resize"], cfg["preprocessing"]["crop"], cfg["preprocessing"]["interpolation"]) == (
        resize, 224, "bilinear") == (tf.resize_size[0], tf.crop_size[0], tf.interpolation.value)
    assert tuple(cfg["preprocessing"]["mean"]) == tuple(tf.mean) and published_top1(cfg["weights_id"]) == top1
    architecture.load_state_dict(state)
    assert_fp16_close(fs.read_logits(name, "clean"), _logits(architecture, fs, name, image_dir).numpy(), "logits")


def test_timm_twins_of_the_papers_vit_and_convnext_stay_selectable(monkeypatch):
    """timm's ImageNet-1k-only checkpoints: `auto` under timm's names, a timm tag on the shared bare name, and
    `--weights paper` on a timm name points at the paper's torchvision model."""
    import timm

    asked = []

    def offline_timm(arch, image_size, pretrained=False, **kwargs):  # the real pretrained_cfg, no 86M-param build
        asked.append((arch, pretrained))
        if pretrained:
            raise OSError("offline")
        return SimpleNamespace(pretrained_cfg=timm.models.get_pretrained_cfg(arch).to_dict())

    monkeypatch.setattr(featstore.nets.models, "_create_timm", offline_timm)
    for name, weights, tag in [("vit_base_patch16_224", "auto", "vit_base_patch16_224.augreg_in1k"),
                               ("vit_base_patch16_224", "augreg_in1k", "vit_base_patch16_224.augreg_in1k"),
                               ("timm/convnext_tiny", "auto", "convnext_tiny.fb_in1k"),
                               ("convnext_tiny", "fb_in1k", "convnext_tiny.fb_in1k")]:
        with pytest.raises(FeatstoreError, match=f"timm/{tag}"):
            load_model(name, weights)  # offline, the error names the timm file
        assert asked[-2:] == [(tag, True), (tag, False)]
        assert published_top1(f"timm:timm/{tag}") > 79
    assert published_top1("timm:timm/vit_base_patch16_224.augreg_in1k") == 79.154
    assert published_top1("timm:timm/convnext_tiny.fb_in1k") == 82.066
    with pytest.raises(FeatstoreError, match="no timm pretrained tag 'in1k_v9'"):
        load_model("timm/convnext_tiny", "in1k_v9")
    with pytest.raises(FeatstoreError, match="torchvision's vit_b_16 IMAGENET1K_V1; use model='vit_b_16'"):
        load_model("vit_base_patch16_224", "paper")
    with pytest.raises(FeatstoreError, match="model='timm/vit_base_patch16_224' weights='TAG'"):
        load_model("vit_b_16", "augreg_in1k")


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


def _hf_cache_holding(placed: torch.nn.Module, cache: Path) -> dict:
    """An environment whose offline Hugging Face cache holds `placed` as timm's resnet18.a1_in1k."""
    from safetensors.torch import save_file

    snapshot = cache / "models--timm--resnet18.a1_in1k" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    save_file(placed.state_dict(), snapshot / "model.safetensors")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}


def test_timm_default_weights_load_from_the_hugging_face_cache(image_dir, tmp_path):
    """With HF_HUB_OFFLINE=1, timm's own pretrained path reads a file placed in the HF cache."""
    import timm

    torch.manual_seed(11)
    placed = timm.create_model("resnet18", pretrained=False)
    env = _hf_cache_holding(placed, tmp_path / "hf")
    store = tmp_path / "s.zarr"
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


def test_a_timm_tag_on_a_name_both_libraries_know_builds_timms_model_and_cost_rebuilds_it(image_dir, tmp_path):
    """`--model resnet18 --weights a1_in1k` is timm's resnet18 (torchvision has no such weights); the store
    records the library, and `featstore cost` rebuilds that library's architecture, not torchvision's."""
    import timm

    torch.manual_seed(12)
    placed = timm.create_model("resnet18", pretrained=False)
    env = _hf_cache_holding(placed, tmp_path / "hf")
    store = tmp_path / "s.zarr"
    cmd = [sys.executable, "-m", "featstore.cli.main", "build", "--model", "resnet18", "--weights", "a1_in1k",
           "--data", str(image_dir), "--store", str(store), "--limit", "3", *SMALL]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-1500:]
    config = FeatureStore(store).config("resnet18")
    assert (config.library, config.weights_id) == ("timm", "timm:timm/resnet18.a1_in1k")
    assert config.anchors[0].module not in dict(torchvision.models.resnet18().named_modules())  # timm's names
    out = run_cli("cost", "--model", "resnet18", "--store", store, "--db", tmp_path / "f.duckdb", "--repeats", "1",
                  "--device", "cpu").output
    assert "resnet18" in out


def test_a_checkpoint_holding_nan_fails_once_in_one_line_naming_the_anchor(image_dir, tmp_path):
    """A checkpoint with NaN weights built 'successfully', verify then found every chunk damaged, and
    build 're-did' them forever. Now the first batch is refused, naming the first anchor the NaN reaches, and
    nothing is committed, so a second build says the same and does not loop."""
    weights = torchvision.models.resnet18(weights=None).state_dict()
    weights["layer3.0.conv1.weight"][0, 0, 0, 0] = float("nan")  # finite up to layer2.1, NaN from layer3.0 on
    path = tmp_path / "nan.pth"
    torch.save(weights, path)
    store = tmp_path / "s.zarr"
    args = ("build", "--model", "resnet18", "--weights", path, "--data", image_dir, "--store", store, *SMALL)
    first = fails(*args)
    assert "anchor 'layer3.0' of resnet18 is nan on" in first and "NaN or infinite --weights" in first, first
    assert fails(*args) == first
    assert not FeatureStore(store).done("resnet18", "clean").any()
