"""A done chunk is trusted only when its files are present, decodable, hold the values its commit wrote and no NaN
outside skipped rows (tests/test_store_damage.py: the image table, metadata, stores without checksums):
`verify` names each bad (array, chunk), `probe` refuses before training, `build` re-does exactly those chunks."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import zarr

from featstore.store.reader import FeatureStore

from conftest import fails, run_cli

SMALL = ["--model", "resnet18", "--weights", "none", "--image-size", "32", "--chunk-rows", "6",
         "--batch-size", "3", "--workers", "0", "--no-progress",
         "--threads", "1"]  # other thread counts differ in the last bits (docs/build.md#reliability)
ARRAYS = ["anchors/layer1.0", "anchors/avgpool", "logits", "skipped"]


@pytest.fixture(scope="module")
def built(image_dir, tmp_path_factory):
    """A complete 12-image store (2 chunks of 6) and every array's contents, for bit-exact comparisons."""
    store = tmp_path_factory.mktemp("integrity") / "s.zarr"
    run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    view = zarr.open_group(str(store), mode="r")["resnet18"]["clean"]
    return store, {name: view[name][:] for name in ARRAYS}


def damaged_copy(built, tmp_path) -> tuple:
    store, reference = built
    return shutil.copytree(store, tmp_path / "s.zarr"), reference


def assert_rebuilt(image_dir, store, reference, tmp_path, expected: str) -> None:
    """verify lists the damage, probe refuses (writing nothing), build re-does it and the store is bit-exact."""
    out = run_cli("verify", store, ok=False)
    assert out.exit_code == 1 and expected in out.output, out.output
    db = tmp_path / "f.duckdb"
    line = fails("probe", "--store", store, "--model", "resnet18", "--db", db, "--no-progress")
    assert "damaged" in line and expected in line
    assert not db.exists()
    result = run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    assert "re-did" in result.output and "1 chunk(s) written, 1 already done" in result.output
    view = zarr.open_group(str(store), mode="r")["resnet18"]["clean"]
    for name, want in reference.items():
        assert np.array_equal(view[name][:], want, equal_nan=name != "skipped"), name
    assert run_cli("verify", store).output.strip().endswith("every done chunk is intact")


def test_a_deleted_chunk_file_is_found_and_rebuilt(built, image_dir, tmp_path):
    store, reference = damaged_copy(built, tmp_path)
    (store / "resnet18" / "clean" / "anchors" / "layer1.0" / "c" / "1" / "0").unlink()
    info = run_cli("info", store).output
    assert "DAMAGED (chunk files missing: 1" in info
    assert_rebuilt(image_dir, store, reference, tmp_path, "resnet18/clean/anchors/layer1.0 chunk 1: file missing")


def test_done_flags_claiming_chunks_never_written(built, image_dir, tmp_path):
    store, reference = damaged_copy(built, tmp_path)
    for name in ARRAYS[:3]:  # chunk 1 of every float array gone: only the done flag says it was written
        shutil.rmtree(store / "resnet18" / "clean" / name / "c" / "1")
    assert FeatureStore(store).done("resnet18", "clean").all()
    assert_rebuilt(image_dir, store, reference, tmp_path, "chunk 1: file missing")


def test_a_corrupt_chunk_is_named_not_a_codec_traceback(built, image_dir, tmp_path):
    store, reference = damaged_copy(built, tmp_path)
    (store / "resnet18" / "clean" / "logits" / "c" / "0" / "0").write_bytes(b"\x28\xb5\x2f\xfd garbage")
    assert_rebuilt(image_dir, store, reference, tmp_path, "resnet18/clean/logits chunk 0: cannot be decoded")


def test_nan_in_rows_not_marked_skipped(built, image_dir, tmp_path):
    store, reference = damaged_copy(built, tmp_path)
    arr = zarr.open_group(str(store), mode="a")["resnet18"]["clean"]["anchors"]["avgpool"]
    arr[7, :3] = np.nan
    assert_rebuilt(image_dir, store, reference, tmp_path, "anchors/avgpool chunk 1: values differ from those its "
                   "commit wrote (checksum)")


def test_verify_quick_and_unknown_model(built, tmp_path):
    store, _ = built
    assert "intact" in run_cli("verify", store, "--quick", "--model", "resnet18").output
    assert "no model 'resnet50'" in fails("verify", store, "--model", "resnet50")
    assert "no featstore store" in fails("verify", tmp_path / "nope.zarr")


def test_info_reads_each_metadata_once_within_a_call_and_afresh_across_calls(built, tmp_path):
    """`info` opens a view's group and arrays once per call (`one_reading`), yet one handle kept across calls sees
    what changed on disk in between: a deleted chunk file, a done flag cleared by another job."""
    store, _ = damaged_copy(built, tmp_path)
    handle = FeatureStore(store)
    first = handle.info().models["resnet18"].views["clean"]
    assert (first.chunks_done, first.damaged_chunks) == (2, ())
    (store / "resnet18" / "clean" / "anchors" / "layer1.0" / "c" / "1" / "0").unlink()
    assert handle.info().models["resnet18"].views["clean"].damaged_chunks == (1,)
    done = zarr.open_array(str(store / "resnet18" / "clean" / "done"), mode="r+")
    done[0] = False
    again = handle.info().models["resnet18"].views["clean"]
    assert (again.chunks_done, again.damaged_chunks) == (1, (1,))
    with handle.one_reading():
        group = handle.view_group("resnet18", "clean")
        with handle.one_reading():  # nested: the outer reading's lasts past the inner one
            assert handle.view_group("resnet18", "clean") is group
        assert handle.view_group("resnet18", "clean") is group
    assert handle.view_group("resnet18", "clean") is not handle.view_group("resnet18", "clean")
