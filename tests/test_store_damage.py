"""Everything a store holds is covered: the image table, every group's and array's metadata, and each done
chunk's values (a checksum per array written at its commit). `verify` lists the damage, `info` and `probe` say it
in one line, never a traceback, and `build` repairs what it can recompute (bit-exact with the original) and names
what it cannot. An image file replaced after the build is refused by the next build, naming it, unless asked to
recompute its chunks."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr
from PIL import Image
from test_store_integrity import ARRAYS, SMALL

from featstore.store.reader import FeatureStore

from conftest import fails, run_cli


@pytest.fixture(scope="module")
def built(image_dir, tmp_path_factory):
    """A complete 12-image store (2 chunks of 6), every array's contents and the image table."""
    store = tmp_path_factory.mktemp("damage") / "s.zarr"
    run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    root = zarr.open_group(str(store), mode="r")
    view = root["resnet18"]["clean"]
    images = {name: root["images"][name][:] for name in ("image_id", "label", "path")}
    return store, {name: view[name][:] for name in ARRAYS}, images


def copy(built, tmp_path):
    return shutil.copytree(built[0], tmp_path / "s.zarr")


def probe_fails(store, tmp_path) -> str:
    db = tmp_path / "f.duckdb"
    line = fails("probe", "--store", store, "--model", "resnet18", "--db", db, "--no-progress")
    assert not db.exists()
    return line


def assert_as_built(store, built) -> None:
    root = zarr.open_group(str(store), mode="r")
    for name, want in built[1].items():
        assert np.array_equal(root["resnet18"]["clean"][name][:], want, equal_nan=name != "skipped"), name
    for name, want in built[2].items():
        assert np.array_equal(root["images"][name][:], want), name
    assert run_cli("verify", store).output.strip().endswith("every done chunk is intact")


@pytest.mark.parametrize("array", ["label", "path", "image_id"])
def test_a_removed_image_table_chunk_is_found_refused_and_rewritten(built, image_dir, tmp_path, array):
    """rm images/label/c/0: verify said intact and every label became 0 (test accuracy 1.0); images/path: empty
    paths in the database; images/image_id: a DuckDB constraint traceback."""
    store = copy(built, tmp_path)
    (store / "images" / array / "c" / "0").unlink()
    out = run_cli("verify", store, ok=False)
    assert out.exit_code == 1 and f"images/{array}: values differ from those written (checksum)" in out.output
    assert f"images DAMAGED: images/{array}" in run_cli("info", store).output
    assert f"images/{array}: values differ" in probe_fails(store, tmp_path)
    result = run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    assert f"repaired 1 damaged part(s) of the store: images/{array}" in result.output
    assert_as_built(store, built)


def test_a_damaged_image_table_is_not_rewritten_from_other_images(built, image_dir, tmp_path):
    store = copy(built, tmp_path)
    (store / "images" / "label" / "c" / "0").unlink()
    other = shutil.copytree(image_dir, tmp_path / "other")
    next(p for p in sorted(other.rglob("*.jpg"))).unlink()
    line = fails("build", "--data", other, "--store", store, *SMALL)
    assert "images/label: values differ" in line and "not those the store was built from" in line


def _flip(path, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


def test_every_bit_flip_that_changes_values_is_found(built, tmp_path):
    """Of 60 single-bit flips inside zstd chunks, 48 decoded to other values (up to 2.0 off) and verify said
    intact. Here every flip is either found, or decodes to exactly the values written."""
    store = copy(built, tmp_path)
    chunk = store / "resnet18" / "clean" / "anchors" / "avgpool" / "c" / "1" / "0"
    original = chunk.read_bytes()
    want = built[1]["anchors/avgpool"]
    rng = np.random.default_rng(0)
    found = unchanged = 0
    for bit in rng.choice(len(original) * 8, size=40, replace=False).tolist():
        chunk.write_bytes(original)
        _flip(chunk, bit)
        problems = FeatureStore(store).verify()
        if problems:
            assert [str(p) for p in problems] in (
                ["resnet18/clean/anchors/avgpool chunk 1: values differ from those its commit wrote (checksum)"],
            ) or "cannot be decoded" in str(problems[0]), problems
            found += 1
            continue
        stored = zarr.open_group(str(store), mode="r")["resnet18"]["clean"]["anchors"]["avgpool"][:]
        assert np.array_equal(stored, want, equal_nan=True), f"bit {bit}: other values, and verify says intact"
        unchanged += 1
    assert found >= 30, (found, unchanged)


def test_an_infinity_is_damage_with_or_without_checksums(built, image_dir, tmp_path):
    """An infinity in a chunk passed verify, then probe said 'predict NaN'."""
    store = copy(built, tmp_path)
    zarr.open_group(str(store), mode="a")["resnet18"]["clean"]["logits"][8, 2] = np.inf
    assert "resnet18/clean/logits chunk 1: values differ" in run_cli("verify", store, ok=False).output
    shutil.rmtree(store / "resnet18" / "clean" / "checksums")  # as a store written before checksums
    out = run_cli("verify", store, ok=False).output
    assert "resnet18/clean/logits chunk 1: NaN or infinity in 1 row(s) not marked skipped (first: row 8)" in out
    assert "NaN or infinity" in probe_fails(store, tmp_path)
    result = run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    assert "re-did 1 damaged chunk(s)" in result.output
    assert_as_built(store, built)


def _garbage(path) -> None:
    path.write_text("{ not json")


def _reshape(path) -> None:
    meta = json.loads(path.read_text())
    meta["shape"] = [meta["shape"][0] + 5, *meta["shape"][1:]]
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize("damage, where, what", [
    (lambda v: _garbage(v / "anchors" / "avgpool" / "zarr.json"), "anchors/avgpool", "metadata cannot be read"),
    (lambda v: shutil.rmtree(v / "anchors" / "avgpool"), "anchors/avgpool", "missing"),
    (lambda v: _reshape(v / "logits" / "zarr.json"), "logits", "shape (17, 1000) in chunks of (6, 1000), where the "
                                                                 "model's config gives (12, 1000)"),
    (lambda v: _garbage(v / "zarr.json"), "", "its metadata cannot be read"),
    (lambda v: _garbage(v / "done" / "zarr.json"), "done", "metadata cannot be read"),
])
def test_damaged_view_metadata_is_named_and_the_view_made_again(built, image_dir, tmp_path, damage, where, what):
    """A garbage zarr.json, a removed anchor array, a shape that disagrees with the chunks: verify, info, probe and
    build crashed with tracebacks, and nothing repaired it."""
    store = copy(built, tmp_path)
    damage(store / "resnet18" / "clean")
    name = f"resnet18/clean/{where}".rstrip("/")
    out = run_cli("verify", store, ok=False)
    assert out.exit_code == 1 and f"{name}: " in out.output and what in out.output, out.output
    assert f"view clean: DAMAGED: {name}" in run_cli("info", store).output
    assert "damaged" in probe_fails(store, tmp_path)
    result = run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    assert f"repaired 1 damaged part(s) of the store: {name}" in result.output
    assert "2 chunk(s) written, 0 already done" in result.output
    assert_as_built(store, built)


def test_what_build_cannot_recompute_is_named_in_one_line(built, image_dir, tmp_path):
    store = copy(built, tmp_path)
    _garbage(store / "resnet18" / "zarr.json")
    out = run_cli("verify", store, ok=False)
    assert out.exit_code == 1 and "resnet18: its metadata cannot be read" in out.output
    assert "model  resnet18: DAMAGED" in run_cli("info", store).output
    assert "damaged" in probe_fails(store, tmp_path)
    line = fails("build", "--data", image_dir, "--store", store, *SMALL)
    assert "the metadata of model 'resnet18' (resnet18/zarr.json) cannot be read" in line and "new --store" in line
    _garbage(store / "zarr.json")
    for command in (["verify", store], ["info", store], ["build", "--data", image_dir, "--store", store, *SMALL]):
        assert "cannot open" in fails(*command)


def test_a_replaced_image_is_refused_unless_asked_to_rebuild(built, image_dir, tmp_path):
    """An image replaced after a build, then build --views clean,brightness-1: clean came from the old content,
    brightness-1 from the new, without a word."""
    images = shutil.copytree(image_dir, tmp_path / "images")
    store = tmp_path / "s.zarr"
    run_cli("build", "--data", images, "--store", store, *SMALL)
    first = sorted(images.rglob("*.jpg"))[7]
    Image.new("RGB", (80, 60), (250, 10, 10)).save(first)
    line = fails("build", "--data", images, "--store", store, *SMALL, "--views", "clean,brightness-1")
    assert f"image {first} changed since store {store} was built" in line and "--rebuild-changed" in line
    assert "brightness-1" not in FeatureStore(store).views("resnet18")
    result = run_cli("build", "--data", images, "--store", store, *SMALL, "--views", "clean,brightness-1",
                     "--rebuild-changed")
    assert "1 image file(s) changed since the store was built" in result.output
    fresh = tmp_path / "fresh.zarr"
    run_cli("build", "--data", images, "--store", fresh, *SMALL, "--views", "clean,brightness-1")
    for view in ("clean", "brightness-1"):
        for name in ARRAYS:
            a = zarr.open_group(str(store), mode="r")["resnet18"][view][name][:]
            b = zarr.open_group(str(fresh), mode="r")["resnet18"][view][name][:]
            assert np.array_equal(a, b, equal_nan=name != "skipped"), (view, name)
    assert "changed" not in run_cli("build", "--data", images, "--store", store, *SMALL).output
    first.touch()  # a new time, the same bytes: the recorded content says it is unchanged
    assert "0 chunk(s) written" in run_cli("build", "--data", images, "--store", store, *SMALL).output


def test_verify_blames_the_arrays_a_stale_writer_left_not_the_commits(tmp_path):
    """A writer that lost its lease PUT two arrays and the checksum row over another build's
    committed chunk; verify blamed the correct arrays (they differ from the stale row). Now the arrays that agree
    with a row most arrays disagree with are named as the stale ones, beside the row."""
    from synthetic import class_clusters, write_feature_store

    from featstore.store.integrity import checksum

    feats, labels = class_clusters(32, 2, [4, 4, 4, 4], seed=3)
    path = write_feature_store(tmp_path / "s.zarr", feats, labels, 2, chunk_rows=16)
    g = zarr.open_group(str(path), mode="a")["synthetic"]["clean"]
    stale = {"anchors/anchor00": feats[0][:16] - 3.0, "logits": np.full((16, 2), 7.0)}
    for name, values in stale.items():
        g[name][0:16] = values
    # the stale writer's row: the checksums of its own values of every array (other than the commit's, but for
    # `skipped`), though it PUT only two of them
    theirs = {**{n: -np.ones(g[n].chunks) for n in g["checksums"].attrs["arrays"]}, **stale,
              "skipped": g["skipped"][0:16]}
    g["checksums"][0] = np.asarray([checksum(np.asarray(theirs[n], dtype=g[n].dtype))
                                    for n in g["checksums"].attrs["arrays"]], dtype=np.uint64)
    found = {(p.array, p.what) for p in FeatureStore(path).verify()}
    blamed = {a for a, what in found if "another commit than the chunk's other arrays" in what}
    assert blamed == {"anchors/anchor00", "logits"}
    assert any(a == "checksums" and "disagrees with 3 of 5 arrays" in what for a, what in found)
    assert not {a for a, _ in found} & {"anchors/anchor01", "anchors/anchor02", "anchors/anchor03"}
