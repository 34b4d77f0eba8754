"""The tensor input path (`--decode gpu`), run here on CPU tensors, against the PIL path and torchvision."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torchvision
import zarr
from PIL import Image
from synthetic import make_image_folder
from test_anchors_reference import _fx_node
from test_resume_ranks import assert_identical
from torchvision import transforms as T
from torchvision.io import ImageReadMode, decode_jpeg

from featstore.images.datasets import ViewDataset, collate, discover
from featstore.images.preprocessing import Preprocessing
from featstore.images.tensor_input import EncodedDataset, TensorBatches, device_decodable
from featstore.images.views import parse_views
from featstore.nets.anchors import PRESETS
from featstore.store.reader import FeatureStore

from conftest import assert_fp16_close, fails, run_cli

CPU = torch.device("cpu")
VIEWS = parse_views("clean,gaussian_noise-1,gaussian_noise-2,gaussian_blur-1,gaussian_blur-2,brightness-1,brightness-2")
SMALL = ["--model", "resnet18", "--weights", "none", "--image-size", "32", "--chunk-rows", "6", "--batch-size", "3",
         "--workers", "0", "--no-progress"]


@pytest.fixture(scope="module")
def imagenet_sized(tmp_path_factory):
    """JPEGs of ImageNet's common sizes, both orientations."""
    root = tmp_path_factory.mktemp("inet")
    for k, size in enumerate([(500, 375), (375, 500), (500, 333)]):
        make_image_folder(root / f"set{k}", n_classes=2, per_class=2, size=size, seed=k)
    return root


def _both_paths(images, prep, views):
    plan = [list(range(len(images)))]
    batch, = list(TensorBatches(images, prep, views, plan, CPU, workers=0))
    ds = ViewDataset(images, prep, views)
    _, pil_views, pil_errors = collate([ds[r] for r in batch.rows])
    return batch.views, pil_views, batch.errors, pil_errors


# Measured on these files: bilinear max 1 level (mean 0.18), bicubic max 8 levels (mean 0.20). The decode
# itself is identical (both use libjpeg-turbo); the difference is PIL's resampler vs torchvision's.
@pytest.mark.parametrize(("interpolation", "max_levels"), [("bilinear", 1), ("bicubic", 8)])
def test_tensor_crop_is_the_pil_crop_within_the_measured_bound(imagenet_sized, interpolation, max_levels):
    prep = Preprocessing(256, 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), interpolation)
    for folder in sorted(imagenet_sized.iterdir()):
        (tensor_clean,), (pil_clean,), _, _ = _both_paths(discover(folder), prep, VIEWS[:1])
        diff = (tensor_clean.int() - pil_clean.int()).abs()
        print(f"{folder.name} {interpolation}: max {diff.max().item()} levels, mean {diff.float().mean():.3f}")
        assert diff.max().item() <= max_levels
        assert diff.float().mean().item() < 0.25


def test_batched_views_equal_the_per_image_views(imagenet_sized):
    images = discover(imagenet_sized / "set0")
    prep = Preprocessing(73, 64, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    crops = torch.stack([ViewDataset(images, prep, VIEWS[:1])[r][1][0] for r in range(len(images))])
    ids = [int(i) for i in images.image_ids]
    for v in VIEWS:
        per_image = torch.stack([v.apply(c, i) for c, i in zip(crops, ids, strict=True)])
        assert torch.equal(v.apply_batch(crops, ids), per_image), v.name


def test_tensor_views_equal_the_pil_views_applied_to_the_tensor_crop(imagenet_sized):
    """Every view of the tensor path is the per-image view of its own clean crop, in batch order."""
    images = discover(imagenet_sized / "set1")
    prep = Preprocessing(73, 64, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    batch, = list(TensorBatches(images, prep, VIEWS, [[3, 0, 2]], CPU, workers=2))
    for v, x in zip(VIEWS, batch.views, strict=True):
        expected = torch.stack([v.apply(batch.views[0][k], int(images.image_ids[r]))
                                for k, r in enumerate(batch.rows)])
        assert torch.equal(x, expected), v.name


@pytest.fixture
def odd_files(tmp_path):
    """One class folder holding every kind of file the device decoder must hand to PIL, and two bad ones."""
    src = make_image_folder(tmp_path / "src", n_classes=1, per_class=1, size=(120, 90))
    rgb = Image.open(next(src.rglob("*.jpg"))).convert("RGB")
    folder = tmp_path / "odd" / "class_00"
    folder.mkdir(parents=True)
    rgb.save(folder / "a_baseline.jpg", quality=90)
    rgb.save(folder / "b_progressive.jpg", quality=90, progressive=True)
    rgb.save(folder / "c_png.png")
    rgb.convert("CMYK").save(folder / "d_cmyk.jpg", quality=90)
    rgb.convert("L").save(folder / "e_gray.jpg", quality=90)
    (folder / "f_corrupt.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (folder / "g_truncated.jpg").write_bytes((folder / "a_baseline.jpg").read_bytes()[:300])
    return tmp_path / "odd"


def test_fallback_files_take_the_pil_path_and_bad_files_are_errors(odd_files):
    images = discover(odd_files)
    assert [device_decodable((odd_files / p).read_bytes()) for p in images.paths] == [
        True, True, False, False, False, False, True]  # the truncated file's header is fine: its decode fails
    ds = EncodedDataset(images, Preprocessing(73, 64, (0.5,) * 3, (0.5,) * 3))
    items = [ds[r] for r in range(7)]
    kinds = [("bytes" if i.data is not None else "pil" if i.crop is not None else "error") for i in items]
    assert kinds == ["bytes", "bytes", "pil", "pil", "pil", "error", "bytes"]

    prep = Preprocessing(73, 64, (0.5,) * 3, (0.5,) * 3)
    batches = TensorBatches(images, prep, VIEWS[:2], [list(range(7))], CPU, workers=0)
    batch, = list(batches)
    (clean, noisy), errors = batch.views, batch.errors
    assert batches.counts == {"device": 2, "pil": 3, "bad": 2}
    assert [e is not None for e in errors] == [False] * 5 + [True, True]
    assert (clean[5:] == 0).all() and (noisy[5:] == 0).all()
    pil = ViewDataset(images, prep, VIEWS[:1])
    for r in (2, 3, 4):  # PIL-decoded: exactly the PIL path's crop
        assert torch.equal(clean[r], pil[r][1][0])
    for r in (0, 1):
        assert (clean[r].int() - pil[r][1][0].int()).abs().max() <= 1


def test_build_on_the_tensor_path_follows_skip_bad(odd_files, tmp_path):
    line = fails("build", "--data", odd_files, "--store", tmp_path / "a.zarr", "--decode", "gpu", *SMALL)
    assert "f_corrupt.jpg" in line and "--skip-bad" in line
    store = tmp_path / "b.zarr"
    result = run_cli("build", "--data", odd_files, "--store", store, "--decode", "gpu", "--skip-bad", *SMALL)
    assert "skipped 2 unreadable image" in result.output
    fs = FeatureStore(store)
    assert fs.read_skipped("resnet18", "clean").tolist() == [False] * 5 + [True, True]
    feats = fs.read("resnet18", "clean", "layer1.0")
    assert np.isnan(feats[5:]).all() and not np.isnan(feats[:5]).any()


def _tensor_reference(paths, prep: dict) -> torch.Tensor:
    """The tensor path written independently: torchvision's decode and transform classes, image by image."""
    tf = T.Compose([
        T.Resize(prep["resize"], interpolation=T.InterpolationMode(prep["interpolation"]), antialias=True),
        T.CenterCrop(prep["crop"]),
        T.ConvertImageDtype(torch.float),
        T.Normalize(prep["mean"], prep["std"]),
    ])
    return torch.stack([tf(decode_jpeg(torchvision.io.read_file(str(p)), mode=ImageReadMode.RGB)) for p in paths])


def test_stored_anchors_of_the_tensor_path_match_torchvision(imagenet_sized, tmp_path):
    from torchvision.models.feature_extraction import create_feature_extractor

    data = imagenet_sized / "set0"
    store = tmp_path / "s.zarr"
    run_cli("build", "--model", "resnet18", "--data", data, "--store", store, "--weights", "none", "--image-size",
            64, "--chunk-rows", 3, "--batch-size", 3, "--workers", 0, "--no-progress", "--decode", "gpu")
    fs = FeatureStore(store)
    x = _tensor_reference([data / p for p in fs.image_table()["path"]],
                          fs.model_attrs("resnet18")["config"]["preprocessing"])
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    extractor = create_feature_extractor(model, return_nodes=[_fx_node(a) for a in PRESETS["resnet18"]])
    with torch.no_grad():
        outs = [extractor(part) for part in x.split(3)]  # the build's batches: oneDNN picks kernels by batch
        logits = torch.cat([model(part) for part in x.split(3)])
    for anchor in PRESETS["resnet18"]:
        ref = torch.cat([o[_fx_node(anchor)] for o in outs]).mean(dim=(2, 3))
        assert_fp16_close(fs.read("resnet18", "clean", anchor), ref.numpy(), anchor)
    assert_fp16_close(fs.read_logits("resnet18", "clean"), logits.numpy(), "logits")


def test_rebuilt_chunks_are_bit_identical_on_the_tensor_path(big_image_dir, tmp_path):
    views = ("clean", "gaussian_noise-1")  # batched blur is compared bit for bit above; it is slow on CPU
    args = ["--model", "resnet18", "--weights", "none", "--image-size", "32", "--limit", "40", "--chunk-rows", "8",
            "--batch-size", "3", "--workers", "2", "--views", ",".join(views), "--decode", "gpu", "--no-progress",
            "--data", big_image_dir, "--threads", "1"]  # other thread counts differ in the last bits
    reference, store = tmp_path / "ref.zarr", tmp_path / "resumed.zarr"
    run_cli("build", "--store", reference, *args)
    shutil.copytree(reference, store)
    root = zarr.open_group(str(store), mode="r+")
    for view in views:  # as if killed before chunks 1 and 3 landed
        group = root[f"resnet18/{view}"]
        group["done"][[1, 3]] = False
        for node in [a for _, a in group["anchors"].members()] + [group["logits"]]:
            node[8:16] = 0
            node[24:32] = 0
    result = run_cli("build", "--store", store, *args)
    assert "2 chunk(s) written, 3 already done" in result.output
    assert_identical(store, reference)


def test_decoder_is_recorded_and_a_resume_with_another_is_refused(image_dir, tmp_path):
    store = tmp_path / "s.zarr"
    run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    assert FeatureStore(store).model_attrs("resnet18")["config"]["decoder"] == "pil"
    line = fails("build", "--data", image_dir, "--store", store, "--decode", "gpu", *SMALL)
    assert "different decoder" in line
    other = tmp_path / "t.zarr"
    run_cli("build", "--data", image_dir, "--store", other, "--decode", "gpu", *SMALL)
    assert FeatureStore(other).model_attrs("resnet18")["config"]["decoder"] == "torchvision-cpu"
    assert "different decoder" in fails("build", "--data", image_dir, "--store", other, "--decode", "cpu", *SMALL)


def test_a_store_written_before_the_decoder_was_recorded_resumes_on_pil(image_dir, tmp_path):
    store = tmp_path / "s.zarr"
    run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    group = zarr.open_group(str(store), mode="a")["resnet18"]
    config = dict(dict(group.attrs)["config"])
    del config["decoder"]
    group.attrs["config"] = config
    assert "0 chunk(s) written, 2 already done" in run_cli("build", "--data", image_dir, "--store", store,
                                                           *SMALL).output
    assert "different decoder" in fails("build", "--data", image_dir, "--store", store, "--decode", "gpu", *SMALL)
