"""The GPU extractor's guarantees, checked on CPU tensors: every view is made where the crop is, from
the encoded file alone; noise comes from a counter-based generator, the same whatever the batch, workers, chunks,
threads or resume; a store keeps the generator it was made with; the main thread only feeds the forward."""

from __future__ import annotations

import hashlib
import shutil
import threading
import zlib

import numpy as np
import pytest
import torch
import torchvision
import zarr
from scipy import special, stats
from synthetic import make_image_folder

import featstore.images.tensor_input as tensor_input
from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
from featstore.errors import FeatstoreError
from featstore.images.datasets import discover
from featstore.images.preprocessing import Preprocessing
from featstore.images.tensor_input import EncodedDataset, TensorBatches
from featstore.images.views import gaussian_field, parse_view, parse_views, with_generator
from featstore.store.reader import FeatureStore
from featstore.store.writer import StoreWriter
from featstore.workflows.build import BuildConfig, build

from conftest import assert_fp16_close, fails, reference_batch, run_cli

CPU = torch.device("cpu")
VIEWS = parse_views("clean,gaussian_noise-1,gaussian_noise-2,gaussian_blur-1,gaussian_blur-2,brightness-1,brightness-2")
PREP = Preprocessing(37, 32, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


def numpy_gaussian_field(view: str, ids: list[int], count: int) -> np.ndarray:
    """Generator 2 written again in numpy's unsigned 64-bit arithmetic (wrapping products, logical shifts) with
    scipy's normal quantiles: float32 [len(ids), count]."""
    gamma = np.uint64(0x9E3779B97F4A7C15)

    def mix(z: np.ndarray) -> np.ndarray:
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    n = 1 << 20
    u = np.maximum(np.arange(n // 2 + 1, dtype=np.float64) / n, 0.5 / n)
    lower = special.ndtri(u)
    lower[-1] = 0.0
    knots = np.concatenate([lower, -lower[:-1][::-1]]).astype(np.float32)
    steps = knots[1:] - knots[:-1]
    view_key = np.uint64(int.from_bytes(hashlib.blake2b(f"featstore-noise:{view}".encode(), digest_size=8).digest(),
                                        "little"))
    with np.errstate(over="ignore"):
        keys = mix(np.asarray(ids, dtype=np.uint64) * gamma ^ view_key)
        bits = mix(keys[:, None] + np.arange(count, dtype=np.uint64)[None, :] * gamma)
    index = (bits >> np.uint64(44)).astype(np.int64)
    within = ((bits >> np.uint64(20)) & np.uint64(0xFFFFFF)).astype(np.float32) * np.float32(2.0**-24)
    return knots[index] + within * steps[index]


def test_noise_is_an_independent_splitmix64_and_quantile_table_bit_for_bit():
    ids = [0, 1, 7, 49_999, 1 << 40]
    ours = gaussian_field("gaussian_noise-2", ids, (3, 16, 16), CPU).reshape(len(ids), -1).numpy()
    theirs = numpy_gaussian_field("gaussian_noise-2", ids, 3 * 16 * 16)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    other = gaussian_field("gaussian_noise-1", ids, (3, 16, 16), CPU).reshape(len(ids), -1).numpy()
    assert not np.array_equal(ours, other)  # each view draws its own


def test_noise_of_an_image_is_the_same_in_any_batch_and_at_any_thread_count():
    shape = (3, 40, 40)
    together = gaussian_field("gaussian_noise-1", [5, 9, 2, 11], shape, CPU)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [gaussian_field("gaussian_noise-1", [i], shape, CPU)[0] for i in (5, 9, 2, 11)]
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(together, alone, strict=True):
        assert torch.equal(a, b)


def test_noise_is_standard_normal():
    z = gaussian_field("gaussian_noise-1", list(range(20)), (3, 128, 128), CPU).flatten().double().numpy()
    assert abs(z.mean()) < 3e-3 and abs(z.std() - 1) < 3e-3
    assert stats.kstest(z, "norm").statistic < 2e-3  # ~1e6 values: the KS distance of a true normal is ~1e-3
    assert np.abs(z).max() <= 4.91
    assert stats.pearsonr(z[:-1], z[1:]).statistic < 5e-3  # neighbouring values do not follow each other


def test_a_store_made_before_generator_two_keeps_its_noise_and_an_unknown_one_is_refused():
    old = with_generator(parse_view("gaussian_noise-1"), {"name": "gaussian_noise-1"})
    assert old.generator == 1 and parse_view("gaussian_noise-1").generator == 3
    crops = torch.full((2, 3, 8, 8), 128, dtype=torch.uint8)
    draws = torch.stack([torch.randn((3, 8, 8), generator=torch.Generator().manual_seed(
        zlib.crc32(f"gaussian_noise-1:{i}".encode()))) for i in (3, 4)])
    assert torch.equal(old.apply_batch(crops, [3, 4]), (128 / 255 + 0.08 * draws).clamp(0, 1))
    with pytest.raises(FeatstoreError, match="view generator 4"):
        with_generator(parse_view("gaussian_noise-1"), {"view_generator": 4})


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("jpegs"), n_classes=3, per_class=4, size=(60, 45))


def _per_row(batches) -> dict[int, list[torch.Tensor]]:
    return {r: [v[k] for v in b.views] for b in batches for k, r in enumerate(b.rows)}


def test_every_view_is_the_same_whatever_the_batches_workers_and_chunks(jpegs):
    images = discover(jpegs)
    n = len(images)
    plans = [[list(range(n))], [list(range(k, min(n, k + 5))) for k in range(0, n, 5)],
             [[r] for r in range(n)]]
    runs = [_per_row(TensorBatches(images, PREP, VIEWS, plan, CPU, workers=w)) for plan in plans for w in (0, 2)]
    for other in runs[1:]:
        for r in range(n):
            assert all(torch.equal(a, b) for a, b in zip(runs[0][r], other[r], strict=True)), r


def test_only_the_encoded_files_cross_to_the_device(jpegs, tmp_path):
    images = discover(jpegs)
    batches = TensorBatches(images, PREP, VIEWS, [list(range(len(images)))], CPU, workers=0)
    (batch,) = list(batches)
    assert len(batch.views) == 7 and batches.counts["device"] == len(images)
    assert batches.transferred == sum((jpegs / p).stat().st_size for p in images.paths)  # 7 views, 1 file each
    encoded = EncodedDataset(images, PREP).collate([EncodedDataset(images, PREP)[r] for r in range(3)])
    assert {encoded.blob.dtype, encoded.crops.dtype} == {torch.uint8}  # what the workers hand over: bytes only
    # files the device decoder refuses cross as their uint8 crop, decoded by PIL in the worker
    folder = shutil.copytree(jpegs, tmp_path / "mixed")
    png = folder / "class_00" / "img_0000.png"
    torchvision.io.write_png(torchvision.io.decode_jpeg(torchvision.io.read_file(str(png.with_suffix(".jpg")))),
                             str(png))
    png.with_suffix(".jpg").unlink()
    mixed = discover(folder)
    batches = TensorBatches(mixed, PREP, VIEWS, [list(range(len(mixed)))], CPU, workers=0)
    list(batches)
    jpeg_bytes = sum((folder / p).stat().st_size for p in mixed.paths if p.endswith(".jpg"))
    assert batches.counts == {"device": len(mixed) - 1, "pil": 1, "bad": 0}
    assert batches.transferred == jpeg_bytes + 3 * 32 * 32


SMALL = ["--model", "resnet18", "--weights", "none", "--image-size", "32", "--chunk-rows", "4", "--batch-size", "2",
         "--no-progress", "--threads", "1"]


def test_a_resumed_generator_one_view_is_made_with_generator_one(jpegs, tmp_path):
    """A noise view whose attrs name no generator (made before generator 2) is resumed with generator 1's draws,
    never generator 2's: its rebuilt chunk equals a forward of the independently drawn old noise."""
    store = tmp_path / "s.zarr"
    args = ["--data", jpegs, "--store", store, "--views", "clean,gaussian_noise-1", "--workers", "0", *SMALL]
    run_cli("build", *args)
    group = zarr.open_group(str(store), mode="a")["resnet18"]["gaussian_noise-1"]
    assert group.attrs["view_generator"] == 3
    made_by_two = FeatureStore(store).read_logits("resnet18", "gaussian_noise-1")[4:8]
    attrs = dict(group.attrs)
    del attrs["view_generator"]
    group.attrs.put(attrs)
    group["done"][1] = False
    assert "1 chunk(s) written" in run_cli("build", *args).output
    fs = FeatureStore(store)
    assert "view_generator" not in fs.view_group("resnet18", "gaussian_noise-1").attrs  # still an old view
    images = fs.image_table()
    rows = range(4, 8)
    prep = fs.model_attrs("resnet18")["config"]["preprocessing"]
    clean = reference_batch([jpegs / images["path"][r] for r in rows], {**prep, "mean": [0] * 3, "std": [1] * 3})
    draws = torch.stack([torch.randn((3, 32, 32), generator=torch.Generator().manual_seed(
        zlib.crc32(f"gaussian_noise-1:{int(images['image_id'][r])}".encode()))) for r in rows])
    mean, std = (torch.tensor(prep[k]).view(1, 3, 1, 1) for k in ("mean", "std"))
    noisy = ((clean + 0.08 * draws).clamp(0, 1) - mean) / std
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    with torch.no_grad():
        reference = torch.cat([model(part) for part in noisy.split(2)]).numpy()
    stored = fs.read_logits("resnet18", "gaussian_noise-1")[4:8]
    assert_fp16_close(stored, reference, "generator 1's chunk")
    assert not np.array_equal(stored, made_by_two)


def test_the_main_thread_only_feeds_and_each_file_is_read_and_checksummed_once(jpegs, tmp_path, monkeypatch):
    """Commits (checksums, compression, writes) run on writer threads, file reads and their content checksums on
    the loader's; the main thread does neither, and no file is read twice (nor hashed before the loop)."""
    main = threading.main_thread()
    seen: dict[str, list] = {"commit": [], "read": [], "hash": []}
    commit, read = StoreWriter.commit_chunk, tensor_input.read_file

    def commit_chunk(self, *args, **kwargs):
        seen["commit"].append(threading.current_thread())
        return commit(self, *args, **kwargs)

    def read_file(path):
        seen["read"].append((threading.current_thread(), path))
        return read(path)

    monkeypatch.setattr(StoreWriter, "commit_chunk", commit_chunk)
    monkeypatch.setattr(tensor_input, "read_file", read_file)
    monkeypatch.setattr("featstore.store.integrity.file_checksum", lambda p: seen["hash"].append(p) or 1)
    store = tmp_path / "s.zarr"
    cfg = BuildConfig(model=ModelSpec("resnet18", "none", 32), images=ImageSource(jpegs), store=store,
                      views="clean,gaussian_noise-1", chunk_rows=4, decode="gpu",
                      run=RunOptions(device="cpu", batch_size=2, workers=2, progress=False, threads=1))
    result = build(cfg)
    assert result.chunks_written == 3 and len(seen["commit"]) == 6
    assert main not in seen["commit"] and main not in [t for t, _ in seen["read"]]
    assert sorted(p for _, p in seen["read"]) == sorted(str(jpegs / p) for p in discover(jpegs).paths)
    assert seen["hash"] == []
    # what the loader checksummed is each file's content, as an independent blake2b of the bytes says
    recorded = FeatureStore(store).image_stats()[:, 2]
    expected = [int.from_bytes(hashlib.blake2b((jpegs / p).read_bytes(), digest_size=8).digest(), "little",
                               signed=True) for p in discover(jpegs).paths]
    assert recorded.tolist() == expected


def test_a_resume_must_match_compile_and_is_refused_before_compiling(jpegs, tmp_path, monkeypatch):
    """`--compile` is recorded; a resume without it (or an eager store resumed with it) is one line, before any
    compile (the compiled build itself, and its bit-identical resume, are bench/device_check.py's compile section:
    inductor takes ~40 s on this CPU)."""
    store = tmp_path / "s.zarr"
    args = ["--data", jpegs, "--store", store, "--workers", "0", *SMALL]
    run_cli("build", *args)
    assert FeatureStore(store).config("resnet18").compiled is False
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled before the config was checked"))
    assert "different compiled" in fails("build", *args, "--compile")


@pytest.mark.parametrize("name", ["resnet18", "vgg11", "densenet121", "vit_b_16", "swin_t", "efficientnet_b0"])
def test_the_token_pool_of_a_plain_cnn_is_known_without_a_forward(name, monkeypatch):
    """A torchvision model built only of map modules cannot output tokens: `cls` without running it (a GPU's first
    forward costs seconds), the answer a forward gives; other models still run one."""
    from featstore.nets import extraction

    model = torchvision.models.get_model(name).eval()
    sample = torch.zeros(1, 3, 64, 64)
    forwarded = extraction.default_token_pool(model, sample) if not extraction._convolutional_only(model) else None
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    answer = extraction.default_token_pool(model, sample)
    if name in ("resnet18", "vgg11", "densenet121"):
        assert calls == [] and answer == "cls"
        monkeypatch.setattr(extraction, "_convolutional_only", lambda m: False)
        assert extraction.default_token_pool(model, sample) == answer  # what the forward says
    else:
        assert answer == forwarded
