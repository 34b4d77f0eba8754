"""Bad input ends in one line that names the file and the fix, and never leaves a chunk falsely done."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from featstore.store.reader import FeatureStore

from conftest import fails, run_cli

SMALL = ["--model", "resnet18", "--weights", "none", "--image-size", "32", "--chunk-rows", "6",
         "--batch-size", "3", "--workers", "0", "--no-progress",
         "--threads", "1"]  # other thread counts differ in the last bits (docs/build.md#reliability)


@pytest.fixture
def data(image_dir, tmp_path):
    return shutil.copytree(image_dir, tmp_path / "data")


def test_corrupt_image_stops_before_its_chunk_is_marked_done(data, tmp_path):
    bad = data / "class_01" / "img_0002.jpg"  # image_id 6: the first of chunk 1
    bad.write_bytes(b"\xff\xd8 not really a jpeg")
    store = tmp_path / "s.zarr"
    line = fails("build", "--data", data, "--store", store, *SMALL)
    assert str(bad) in line and "--skip-bad" in line
    assert FeatureStore(store).done("resnet18", "clean").tolist() == [True, False]


def test_truncated_image_is_reported(data, tmp_path):
    bad = data / "class_02" / "img_0003.jpg"
    bad.write_bytes(bad.read_bytes()[:200])
    line = fails("build", "--data", data, "--store", tmp_path / "s.zarr", *SMALL)
    assert str(bad) in line


def test_skip_bad_records_the_skipped_ids(data, tmp_path):
    bad = data / "class_00" / "img_0001.jpg"
    bad.write_bytes(b"garbage")
    store = tmp_path / "s.zarr"
    result = run_cli("build", "--data", data, "--store", store, "--skip-bad", *SMALL)
    assert "skipped 1 unreadable image" in result.output
    fs = FeatureStore(store)
    skipped = fs.read_skipped("resnet18", "clean")
    ids = fs.image_table()["image_id"]
    assert ids[skipped].tolist() == [1]
    assert fs.done("resnet18", "clean").all()
    feats = fs.read("resnet18", "clean", "layer1.0")
    assert np.isnan(feats[1]).all() and not np.isnan(np.delete(feats, 1, axis=0)).any()


def test_empty_class_folder(data, tmp_path):
    (data / "class_99").mkdir()
    line = fails("build", "--data", data, "--store", tmp_path / "s.zarr", *SMALL)
    assert str(data / "class_99") in line and "remove the folder" in line


def test_missing_data_folder(tmp_path):
    line = fails("build", "--data", tmp_path / "nope", "--store", tmp_path / "s.zarr", *SMALL)
    assert str(tmp_path / "nope") in line


def _flat(image_dir, tmp_path, rows: list[str], header: str = "filename,label"):
    flat = tmp_path / "flat"
    flat.mkdir()
    for i, src in enumerate(sorted(image_dir.rglob("*.jpg"))[:4]):
        shutil.copy(src, flat / f"ILSVRC_{i}.JPEG")
    csv = tmp_path / "labels.csv"
    csv.write_text("\n".join([header, *rows]) + "\n")
    return flat, csv


def test_flat_folder_with_wnid_labels(image_dir, tmp_path):
    flat, csv = _flat(image_dir, tmp_path, ["ILSVRC_0.JPEG,n02", "ILSVRC_1.JPEG,n01", "ILSVRC_3.JPEG,n01"])
    store = tmp_path / "s.zarr"
    run_cli("build", "--data", flat, "--labels", csv, "--store", store, *SMALL)
    fs = FeatureStore(store)
    table = fs.image_table()
    assert table["path"].tolist() == ["ILSVRC_0.JPEG", "ILSVRC_1.JPEG", "ILSVRC_3.JPEG"]
    assert table["label"].tolist() == [1, 0, 0]
    assert fs.image_attrs()["class_names"] == ["n01", "n02"]


def test_labels_csv_naming_a_missing_file(image_dir, tmp_path):
    flat, csv = _flat(image_dir, tmp_path, ["ILSVRC_0.JPEG,1", "ILSVRC_9.JPEG,2"])
    line = fails("build", "--data", flat, "--labels", csv, "--store", tmp_path / "s.zarr", *SMALL)
    assert str(csv) in line and "line 3" in line and "ILSVRC_9.JPEG" in line


def test_labels_csv_with_a_label_beyond_the_models_classes(image_dir, tmp_path):
    flat, csv = _flat(image_dir, tmp_path, ["ILSVRC_0.JPEG,1", "ILSVRC_1.JPEG,1000", "ILSVRC_2.JPEG,1",
                                            "ILSVRC_3.JPEG,1"])  # every file listed: no warning of left-out ones
    line = fails("build", "--data", flat, "--labels", csv, "--store", tmp_path / "s.zarr", *SMALL)
    assert "ILSVRC_1.JPEG" in line and "1000 classes" in line
    assert not (tmp_path / "s.zarr").exists()


def test_labels_csv_without_header(image_dir, tmp_path):
    flat, csv = _flat(image_dir, tmp_path, ["ILSVRC_0.JPEG,1"], header="ILSVRC_1.JPEG,2")
    line = fails("build", "--data", flat, "--labels", csv, "--store", tmp_path / "s.zarr", *SMALL)
    assert str(csv) in line and "header" in line


def test_store_built_with_another_model_config(image_dir, tmp_path):
    store = tmp_path / "s.zarr"
    run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    line = fails("build", "--data", image_dir, "--store", store, *SMALL, "--seed", "1")
    assert str(store) in line and "weights_id" in line and "--name" in line
    run_cli("build", "--data", image_dir, "--store", store, *SMALL, "--seed", "1", "--name", "resnet18-seed1")
    assert FeatureStore(store).models() == ["resnet18", "resnet18-seed1"]


def test_store_built_from_another_image_list(image_dir, tmp_path):
    store = tmp_path / "s.zarr"
    run_cli("build", "--data", image_dir, "--store", store, "--limit", "6", *SMALL)
    line = fails("build", "--data", image_dir, "--store", store, "--limit", "8", *SMALL)
    assert str(store) in line and "different image list" in line


def test_not_a_featstore_store(image_dir, tmp_path):
    import zarr

    zarr.open_group(str(tmp_path / "other.zarr"), mode="w").create_group("something")
    line = fails("build", "--data", image_dir, "--store", tmp_path / "other.zarr", *SMALL)
    assert "not a featstore store" in line


def test_unknown_anchor_lists_close_names(image_dir, tmp_path):
    line = fails("build", "--data", image_dir, "--store", tmp_path / "s.zarr", *SMALL, "--anchors", "layer1.0,layr2.1")
    assert "layr2.1" in line and "layer2.1" in line


def test_unknown_model(image_dir, tmp_path):
    line = fails("build", "--data", image_dir, "--store", tmp_path / "s.zarr", *SMALL[2:], "--model", "resnet5O")
    assert "resnet5O" in line and "resnet50" in line


def test_skip_bad_when_a_whole_batch_is_bad(data, tmp_path):
    bad = data / "class_02" / "img_0003.jpg"  # the last image: its batch of one holds nothing decodable
    bad.write_bytes(b"garbage")
    store = tmp_path / "s.zarr"
    run_cli("build", "--data", data, "--store", store, "--skip-bad", *SMALL[:-5], "--batch-size", "1",
            "--workers", "0", "--no-progress", "--views", "clean,brightness-1")
    fs = FeatureStore(store)
    for view in ("clean", "brightness-1"):
        assert fs.read_skipped("resnet18", view).tolist() == [False] * 11 + [True]
        assert np.isnan(fs.read("resnet18", view, "avgpool")[11]).all() and fs.done("resnet18", view).all()


def test_a_build_killed_while_creating_groups_recovers(image_dir, tmp_path):
    import shutil as sh

    import zarr

    store = tmp_path / "s.zarr"
    run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    reference = FeatureStore(store).read("resnet18", "clean", "layer2.0")
    sh.rmtree(store / "resnet18" / "clean" / "done")  # as if killed before the view's bitmap was created
    run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    assert FeatureStore(store).done("resnet18", "clean").all()
    assert np.array_equal(FeatureStore(store).read("resnet18", "clean", "layer2.0"), reference)
    root = zarr.open_group(str(store), mode="a")
    del root["resnet18"].attrs["config"]  # as if killed before the model's config was committed
    run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    assert np.array_equal(FeatureStore(store).read("resnet18", "clean", "layer2.0"), reference)
