"""Values a float16 store cannot hold: an anchor whose values overflow, or whose differences between images float16
rounds away, is stored as float32 and recorded so; a value that appears only on real images stops the build in
one line, before its chunk is committed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision

from featstore.nets.stored_types import choose_dtype, unstorable_rows
from featstore.store.reader import FeatureStore

from conftest import fails, reference_batch, run_cli

SMALL = ["--chunk-rows", "12", "--batch-size", "6", "--workers", "0", "--no-progress", "--weights", "none"]


def test_the_auto_rule_on_values_with_known_float16_fate():
    big = torch.tensor([[1.0, 2000.0], [1.5, 2100.0]])  # 2100 * 64 > 65504: too near the limit
    ordinary = torch.tensor([[0.5, -3.0], [0.7, -2.0]])
    blurred = torch.tensor([[0.4, 0.5], [0.4 + 1e-6, 0.5 - 1e-6]])  # the images differ below float16's 2^-11
    tiny = torch.tensor([[1e-6, 2e-6], [3e-6, 1e-6]])
    assert [choose_dtype("auto", v) for v in (big, ordinary, blurred, tiny)] == ["float32", "float16", "float32",
                                                                                  "float32"]
    assert choose_dtype("float16", big) == "float16" and choose_dtype("float32", ordinary) == "float32"
    flags = unstorable_rows([torch.tensor([[1.0], [7e4]]), torch.tensor([[np.inf], [1.0]]),
                             torch.tensor([[7e4], [1.0]])], ["float16", "float32", "float32"])
    assert flags.tolist() == [[False, True], [True, False], [False, False]]


def test_random_init_inception_logits_are_stored_wide_and_exact(image_dir, tmp_path):
    """torchvision inception_v3 with random weights: logits of ~3e7 (float16 would store inf)."""
    store = tmp_path / "s.zarr"
    run_cli("build", "--model", "inception_v3", "--image-size", "80", "--data", image_dir, "--store", store, *SMALL)
    fs = FeatureStore(store)
    config = fs.config("inception_v3")
    assert config.logits_dtype == "float32" and config.to_dict()["logits_dtype"] == "float32"
    logits = fs.read_logits("inception_v3", "clean")
    assert logits.dtype == np.float32 and np.isfinite(logits).all()
    torch.manual_seed(0)
    model = torchvision.models.inception_v3(weights=None).eval()
    x = reference_batch([image_dir / p for p in fs.image_table()["path"]], config.preprocessing.to_dict())
    with torch.no_grad():
        ref = torch.cat([model(part) for part in x.split(6)]).numpy()
    assert np.abs(ref).max() > 65504  # what float16 could not have held
    np.testing.assert_allclose(logits, ref, rtol=1e-3, atol=1e-4 * np.abs(ref).max())
    wide = [a.name for a in config.anchors if a.dtype == "float32"]
    assert wide and all(np.isfinite(fs.read("inception_v3", "clean", a)).all() for a in wide)


def test_forcing_float16_on_values_it_cannot_hold_refuses_naming_the_array_and_image(image_dir, tmp_path):
    store = tmp_path / "s.zarr"
    line = fails("build", "--model", "inception_v3", "--image-size", "80", "--data", image_dir, "--store", store,
                 "--store-dtype", "float16", *SMALL)
    assert "beyond float16's ±65504" in line and "--store-dtype float32" in line and "class_" in line
    assert not FeatureStore(store).done("inception_v3", "clean").any()  # nothing was committed


def test_differences_float16_rounds_away_are_kept_in_float32(image_dir, tmp_path):
    """timm's repvgg_a0 with random weights: its late blocks vary between images by ~1e-7 of their size; in
    float16 every image would get the same vector (and the probes would predict NaN)."""
    store, db = tmp_path / "s.zarr", tmp_path / "f.duckdb"
    run_cli("build", "--model", "timm/repvgg_a0", "--image-size", "32", "--anchors", "stem,stages.2.13,head.fc.input",
            "--data", image_dir, "--store", store, *SMALL)
    fs = FeatureStore(store)
    dtypes = {a.name: a.dtype for a in fs.anchors("timm_repvgg_a0")}
    assert dtypes == {"stem": "float16", "stages.2.13": "float32", "head.fc.input": "float32"}
    late = fs.read("timm_repvgg_a0", "clean", "stages.2.13").astype(np.float64)
    assert late.std(axis=0).max() > 0 and late.std(axis=0).max() < 1e-3 * np.abs(late).max()
    assert (late.astype(np.float16).std(axis=0) == 0).mean() > 0.9  # float16: one value for all images, nearly
    # everywhere
    run_cli("probe", "--store", store, "--model", "timm_repvgg_a0", "--db", db, "--variant", "paper:epochs=2",
            "--no-progress")


@pytest.mark.parametrize("policy", ["float16", "float32"])
def test_store_dtype_is_part_of_the_config_a_resume_must_match(image_dir, tmp_path, policy):
    store = tmp_path / "s.zarr"
    run_cli("build", "--model", "resnet18", "--image-size", "32", "--data", image_dir, "--store", store,
            "--store-dtype", policy, *SMALL)
    fs = FeatureStore(store)
    assert {a.dtype for a in fs.anchors("resnet18")} == {policy}
    assert fs.read("resnet18", "clean", "avgpool").dtype == policy
    other = "float32" if policy == "float16" else "float16"
    assert "different anchors" in fails("build", "--model", "resnet18", "--image-size", "32", "--data", image_dir,
                                        "--store", store, "--store-dtype", other, *SMALL)
