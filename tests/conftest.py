"""Shared fixtures: generated image folders (real JPEG files) and a helper to run the CLI in-process."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download weights

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from torchvision import transforms as T

from featstore.cli.main import cli
from featstore.synthetic import make_image_folder


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory) -> Path:
    """3 classes x 4 JPEGs of 80x60: small, but decoded, resized and cropped like ImageNet."""
    return make_image_folder(tmp_path_factory.mktemp("images"), n_classes=3, per_class=4, size=(80, 60))


@pytest.fixture(scope="session")
def big_image_dir(tmp_path_factory) -> Path:
    """Enough images for several chunks (resume and multi-rank tests)."""
    return make_image_folder(tmp_path_factory.mktemp("big"), n_classes=4, per_class=24, size=(48, 40), seed=1)


def run_cli(*args: str, ok: bool = True):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def reference_batch(paths: list[Path], prep: dict) -> torch.Tensor:
    """The eval transform written with torchvision's own transform classes, independent of featstore's."""
    tf = T.Compose([
        T.Resize(prep["resize"], interpolation=T.InterpolationMode(prep["interpolation"]), antialias=True),
        T.CenterCrop(prep["crop"]),
        T.PILToTensor(),
        T.ConvertImageDtype(torch.float),
        T.Normalize(prep["mean"], prep["std"]),
    ])
    return torch.stack([tf(Image.open(p).convert("RGB")) for p in paths])


def assert_fp16_close(stored: np.ndarray, reference: np.ndarray, what: str) -> None:
    """Stored float16 must equal the float32 reference rounded to float16 (one half-ulp of slack)."""
    ref = np.asarray(reference, dtype=np.float32)
    tol = np.abs(ref) * 2.0**-10 + 1e-5
    err = np.abs(stored.astype(np.float32) - ref)
    assert stored.shape == ref.shape, f"{what}: shape {stored.shape} vs {ref.shape}"
    assert (err <= tol).all(), f"{what}: max error {err.max():.3g} beyond fp16 precision"
