"""Bad input that used to pass silently or as a traceback: labels CSVs, 16-bit and float images, symlink loops,
foreign --store folders, negative --workers. Each is one line (exit 2) before any file is created."""

from __future__ import annotations

import hashlib
import shutil
import warnings

import numpy as np
import pytest
from PIL import Image

from featstore.errors import FeatstoreError
from featstore.images.datasets import MAX_CLASSES, discover
from featstore.store.reader import FeatureStore

from conftest import fails, run_cli

SMALL = ["--model", "resnet18", "--weights", "none", "--image-size", "32", "--chunk-rows", "6",
         "--batch-size", "3", "--workers", "0", "--no-progress"]


def snapshot(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


@pytest.fixture
def flat(image_dir, tmp_path):
    folder = tmp_path / "flat"
    folder.mkdir()
    for i, src in enumerate(sorted(image_dir.rglob("*.jpg"))[:4]):
        shutil.copy(src, folder / f"{i}.jpg")
    return folder


def labels_file(tmp_path, lines: list[str], encoding: str = "utf-8", name: str = "labels.csv"):
    path = tmp_path / name
    path.write_bytes("\n".join(["filename,label", *lines]).encode(encoding) + b"\n")
    return path


@pytest.mark.parametrize("bad, why", [("-1", "not a class index"), ("1.0", "not a mix"), ("²", "not a mix"),
                                      ("99999999999", "not a class index")])
def test_a_label_that_is_not_an_index_among_indices(flat, tmp_path, bad, why):
    csv = labels_file(tmp_path, ["0.jpg,0", "1.jpg,2", f"2.jpg,{bad}", "3.jpg,1"])
    line = fails("build", "--data", flat, "--labels", csv, "--store", tmp_path / "s.zarr", *SMALL)
    assert f"{csv} line 4" in line and why in line
    assert not (tmp_path / "s.zarr").exists()


def test_indices_with_leading_zeros_and_a_byte_order_mark(flat, tmp_path):
    csv = labels_file(tmp_path, ["0.jpg,02", "1.jpg,0", "3.jpg,1"], encoding="utf-8-sig")
    images = discover(flat, csv)
    assert images.paths == ["0.jpg", "1.jpg", "3.jpg"] and images.labels.tolist() == [2, 0, 1]
    assert images.class_names == ["0", "1", "2"]


def test_class_names_stay_names(flat, tmp_path):
    csv = labels_file(tmp_path, ["0.jpg,n02", "1.jpg,²", "2.jpg,n01"])
    images = discover(flat, csv)
    assert images.class_names == ["n01", "n02", "²"] and images.labels.tolist() == [1, 2, 0]


def test_a_huge_index_is_refused_before_any_allocation(flat, tmp_path):
    csv = labels_file(tmp_path, ["0.jpg,1", f"1.jpg,{MAX_CLASSES}"])
    with pytest.raises(FeatstoreError, match="line 3: label 100000 is not a class index"):
        discover(flat, csv)


def test_a_latin1_labels_file(flat, tmp_path):
    shutil.copy(flat / "0.jpg", flat / "café.jpg")
    csv = labels_file(tmp_path, ["café.jpg,0", "1.jpg,1"], encoding="latin-1")
    line = fails("build", "--data", flat, "--labels", csv, "--store", tmp_path / "s.zarr", *SMALL)
    assert "not UTF-8 (byte 0xe9 on line 2)" in line and str(csv) in line
    assert not (tmp_path / "s.zarr").exists()


def test_one_file_named_two_ways_is_a_duplicate(flat, tmp_path):
    csv = labels_file(tmp_path, ["0.jpg,0", "./0.jpg,1"])
    line = fails("build", "--data", flat, "--labels", csv, "--store", tmp_path / "s.zarr", *SMALL)
    assert "line 3 lists '0.jpg' a second time (first on line 2)" in line
    csv = labels_file(tmp_path, ["../flat/0.jpg,0"], name="outside.csv")
    assert "outside the --data folder" in fails("build", "--data", flat, "--labels", csv, "--store",
                                                tmp_path / "s.zarr", *SMALL)
    assert not (tmp_path / "s.zarr").exists()


def test_sixteen_bit_and_float_images_keep_their_range(tmp_path):
    """A 16-bit grey PNG holding v * 257 and a float TIFF holding v / 255 are the 8-bit image v: same features."""
    folder = tmp_path / "modes" / "grey"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(2):
        v = rng.integers(0, 256, size=(40, 48)).astype(np.uint8)
        Image.fromarray(v).save(folder / f"{i}_a_8bit.png")
        Image.fromarray(v.astype(np.uint16) * 257).save(folder / f"{i}_b_16bit.png")
        Image.fromarray(v.astype(np.float32) / 255).save(folder / f"{i}_c_float.tif")
    assert Image.open(folder / "0_b_16bit.png").mode == "I;16" and Image.open(folder / "0_c_float.tif").mode == "F"
    store = tmp_path / "s.zarr"
    run_cli("build", "--data", tmp_path / "modes", "--store", store, *SMALL)
    fs = FeatureStore(store)
    assert fs.image_table()["path"].tolist()[:3] == ["grey/0_a_8bit.png", "grey/0_b_16bit.png", "grey/0_c_float.tif"]
    for anchor in ("layer1.0", "avgpool"):
        feats = fs.read("resnet18", "clean", anchor)
        for i in (0, 3):
            assert np.array_equal(feats[i], feats[i + 1]) and np.array_equal(feats[i], feats[i + 2]), anchor
        assert not np.array_equal(feats[0], feats[3])


def test_integer_images_are_read_by_the_range_their_file_declares(tmp_path):
    """A mode-I (32-bit) TIFF of 0..255 values was divided by 257 like a 16-bit one (a black image): a 32-bit TIFF
    that states its range (MaxSampleValue) is read by it, one that does not is refused naming the file; 16-bit
    files keep their 0..65535; and the tensor decode path (--decode gpu) reads them as the PIL path does."""
    from PIL import TiffImagePlugin

    from featstore.images.datasets import to_rgb

    v = np.random.default_rng(1).integers(0, 256, size=(40, 48)).astype(np.uint8)
    stated = TiffImagePlugin.ImageFileDirectory_v2()
    stated[281] = 255
    Image.fromarray(v.astype(np.int32)).save(tmp_path / "stated.tif", tiffinfo=stated)
    Image.fromarray(v.astype(np.int32)).save(tmp_path / "silent.tif")
    Image.fromarray(v.astype(np.uint16) * 257).save(tmp_path / "sixteen.tif")
    with open(tmp_path / "sixteen.pgm", "wb") as f:
        f.write(b"P5 48 40 65535\n" + (v.astype(">u2") * 257).tobytes())
    for name in ("stated.tif", "sixteen.tif", "sixteen.pgm"):
        with Image.open(tmp_path / name) as im:
            assert np.array_equal(np.asarray(to_rgb(im))[..., 0], v), name
    with Image.open(tmp_path / "silent.tif") as im:
        assert im.mode == "I"
        with pytest.raises(ValueError, match="32-bit integers \\(values 0..255\\): its range is unknown"):
            to_rgb(im)

    folder = tmp_path / "modes" / "grey"
    folder.mkdir(parents=True)
    Image.fromarray(v).save(folder / "a_8bit.png")
    shutil.copy(tmp_path / "stated.tif", folder / "b_stated.tif")
    Image.fromarray(v.astype(np.uint16) * 257).save(folder / "c_16bit.png")
    for decode in ("cpu", "gpu"):
        store = tmp_path / f"{decode}.zarr"
        run_cli("build", "--data", tmp_path / "modes", "--store", store, *SMALL, "--decode", decode)
        feats = FeatureStore(store).read("resnet18", "clean", "layer1.0")
        assert np.array_equal(feats[0], feats[1]) and np.array_equal(feats[0], feats[2]), decode
    shutil.copy(tmp_path / "silent.tif", folder / "d_silent.tif")
    line = fails("build", "--data", tmp_path / "modes", "--store", tmp_path / "s.zarr", *SMALL)
    assert str(folder / "d_silent.tif") in line and "its range is unknown" in line


def test_images_the_labels_file_leaves_out_are_counted(flat, tmp_path):
    """Files of the folder absent from the labels CSV were dropped without a word."""
    csv = labels_file(tmp_path, ["0.jpg,0", "2.jpg,1"])
    with pytest.warns(UserWarning, match=r"lists 2 images; 2 other image file\(s\) in .*flat are left out "
                                         r"\(e.g. '1.jpg'\)"):
        images = discover(flat, csv)
    assert images.paths == ["0.jpg", "2.jpg"]
    out = run_cli("build", "--data", flat, "--labels", csv, "--store", tmp_path / "s.zarr", *SMALL).output
    assert [line for line in out.splitlines() if "warning" in line] == [
        f"featstore: warning: --labels {csv}: lists 2 images; 2 other image file(s) in {flat} are left out (e.g. "
        f"'1.jpg'); add them to the file if they belong to the set"]
    full = labels_file(tmp_path, ["0.jpg,0", "1.jpg,1", "2.jpg,0", "3.jpg,1"], name="all.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        discover(flat, full)


def test_a_float_image_of_unknown_range_is_refused(tmp_path):
    folder = tmp_path / "modes" / "grey"
    folder.mkdir(parents=True)
    Image.fromarray(np.full((40, 48), 300.0, dtype=np.float32)).save(folder / "hdr.tif")
    line = fails("build", "--data", tmp_path / "modes", "--store", tmp_path / "s.zarr", *SMALL)
    assert str(folder / "hdr.tif") in line and "outside [0, 1]" in line


def test_symlink_loops_are_named(image_dir, tmp_path):
    data = shutil.copytree(image_dir, tmp_path / "data")
    (data / "class_01" / "loop.jpg").symlink_to("loop.jpg")
    line = fails("build", "--data", data, "--store", tmp_path / "s.zarr", *SMALL)
    assert str(data / "class_01" / "loop.jpg") in line and "loops" in line
    (data / "class_01" / "loop.jpg").unlink()
    (data / "class_01" / "up").symlink_to("..")
    line = fails("build", "--data", data, "--store", tmp_path / "s.zarr", *SMALL)
    assert str(data / "class_01" / "up") in line and "symlink loop" in line
    assert not (tmp_path / "s.zarr").exists()


def test_a_folder_of_other_files_is_not_a_store(image_dir, tmp_path):
    data = shutil.copytree(image_dir, tmp_path / "data")
    before = snapshot(data)
    line = fails("build", "--data", data, "--store", data, *SMALL)
    assert f"{data} is a folder with other files, not a featstore store" in line
    assert snapshot(data) == before


def test_negative_workers(image_dir, tmp_path):
    line = fails("build", "--data", image_dir, "--store", tmp_path / "s.zarr", *SMALL, "--workers", "-1")
    assert "--workers -1" in line
    assert not (tmp_path / "s.zarr").exists()
