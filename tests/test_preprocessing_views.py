"""Preprocessing equals the libraries' own eval transforms; corruption views equal reference formulas."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.ndimage import gaussian_filter
from torchvision.models import ResNet50_Weights

from featstore.errors import FeatstoreError
from featstore.images.views import parse_view, parse_views
from featstore.nets.models import load_model


@pytest.fixture(scope="module")
def photo(image_dir) -> Image.Image:
    path = sorted(image_dir.rglob("*.jpg"))[0]
    return Image.open(path).convert("RGB").resize((300, 220))


def test_torchvision_preprocessing_is_the_weights_transform(photo):
    prep = load_model("resnet50", weights="none").preprocessing
    ours = prep.normalize(prep.crop_uint8(photo)[None])[0]
    theirs = ResNet50_Weights.DEFAULT.transforms()(photo)
    assert torch.equal(ours, theirs)


def test_timm_preprocessing_is_timms_eval_transform(photo):
    import timm
    from timm.data import create_transform, resolve_data_config

    loaded = load_model("timm/convnext_tiny", weights="none")  # "convnext_tiny" is torchvision's
    theirs = create_transform(**resolve_data_config({}, model=timm.create_model("convnext_tiny")))(photo)
    prep = loaded.preprocessing
    ours = prep.normalize(prep.crop_uint8(photo)[None])[0]
    assert ours.shape == theirs.shape == (3, 224, 224)
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_image_size_override_resizes_by_256_over_224():
    prep = load_model("resnet18", weights="none", image_size=112).preprocessing
    assert (prep.resize, prep.crop) == (128, 112)


@pytest.fixture(scope="module")
def crop() -> torch.Tensor:
    return (torch.rand(3, 24, 32, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)


@pytest.mark.parametrize("severity", [1, 2])
def test_blur_is_imagenet_c_gaussian(crop, severity):
    view = parse_view(f"gaussian_blur-{severity}")
    sigma = view.parameter
    ref = gaussian_filter(crop.numpy() / 255.0, sigma=(0, sigma, sigma), mode="nearest", truncate=4.0)
    assert np.abs(view.apply(crop, 7).numpy() - ref).max() < 1e-6


@pytest.mark.parametrize("severity", [1, 2])
def test_brightness_adds_to_hsv_value(crop, severity):
    view = parse_view(f"brightness-{severity}")
    x = crop.numpy() / 255.0
    ref = np.empty_like(x)
    for i in range(x.shape[1]):
        for j in range(x.shape[2]):
            h, s, v = colorsys.rgb_to_hsv(*x[:, i, j])
            ref[:, i, j] = colorsys.hsv_to_rgb(h, s, min(1.0, v + view.parameter))
    assert np.abs(view.apply(crop, 0).numpy() - ref).max() < 1e-6


def test_noise_is_gaussian_deterministic_per_image_id():
    grey = torch.full((3, 64, 64), 128, dtype=torch.uint8)
    view = parse_view("gaussian_noise-2")
    a, b, c = view.apply(grey, 5), view.apply(grey, 5), view.apply(grey, 6)
    assert torch.equal(a, b) and not torch.equal(a, c)
    residual = (a - 128 / 255).numpy()
    assert abs(residual.std() - 0.12) < 0.005 and abs(residual.mean()) < 0.005
    assert float(view.apply(torch.full((3, 8, 8), 255, dtype=torch.uint8), 1).max()) <= 1.0


def test_clean_view_is_the_uint8_crop_itself(crop):
    assert parse_view("clean").apply(crop, 3) is crop


def test_view_names_are_checked():
    assert [v.name for v in parse_views("clean, brightness-1,clean")] == ["clean", "brightness-1"]
    for bad in ["fog-1", "gaussian_noise-6", "brightness", ""]:
        with pytest.raises(FeatstoreError):
            parse_views(bad)
