"""Generator 3 of the noise views (32-bit hashing, a 3,969-knot quantile table): its values against a rewrite in
numpy's unsigned integers and scipy's normal quantiles, its distribution against the normal, its bit-identity across
batches, blocks, shapes and thread counts, and the stores made with generators 1 and 2 keeping theirs."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
import torchvision
import zarr
from scipy import special, stats
from synthetic import make_image_folder
from test_gpu_input import SMALL, numpy_gaussian_field

import featstore.images.views as views
from featstore.errors import FeatstoreError
from featstore.images.views import gaussian_field32, parse_view, with_generator
from featstore.store.reader import FeatureStore

from conftest import assert_fp16_close, reference_batch, run_cli

CPU = torch.device("cpu")
IDS = [0, 1, 7, 49_999, 1 << 40]


def numpy_lowbias32(x: np.ndarray) -> np.ndarray:
    """Wellons' lowbias32 over uint32 (logical shifts, products mod 2^32)."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def numpy_normal(bits: np.ndarray) -> np.ndarray:
    """uint32 hashes -> float32 normal values: bit 31 the side, v = bits 1..30 | 1 the distance to the tail in
    units of 2^-32, float32(v)'s exponent and top 7 mantissa bits the interval, the 16 below where in it."""
    k = np.arange(31 * 128 + 1)
    v_knots = np.ldexp(1 + (k % 128) / 128, k // 128)
    knots = special.ndtri(v_knots / 2.0**32)
    knots[-1] = 0.0
    knots = knots.astype(np.float32)
    steps = np.append((knots[1:] - knots[:-1]) * np.float32(2.0**-16), np.float32(0))
    v = ((bits | np.uint32(1)) & np.uint32(0x7FFFFFFF)).astype(np.float32)
    float_bits = v.view(np.uint32)
    index = (float_bits >> np.uint32(16)).astype(np.int64) - 127 * 128
    fraction = (float_bits & np.uint32(0xFFFF)).astype(np.float32)
    z = knots[index] + fraction * steps[index]
    return np.where(bits >> np.uint32(31) == 1, -z, z)


def numpy_gaussian_field32(view: str, ids: list[int], count: int) -> np.ndarray:
    """Generator 3 written again: float32 [len(ids), count]."""
    rows = []
    for image_id in ids:
        digest = hashlib.blake2b(f"featstore-noise-3:{view}:{image_id}".encode(), digest_size=8).digest()
        k0, k1 = (np.uint32(int.from_bytes(digest[i:i + 4], "little")) for i in (0, 4))
        with np.errstate(over="ignore"):
            bits = numpy_lowbias32(numpy_lowbias32(np.arange(count, dtype=np.uint32) ^ k0) ^ k1)
        rows.append(numpy_normal(bits))
    return np.stack(rows)


def field(ids: list[int], shape: tuple[int, ...], view: str = "gaussian_noise-2") -> np.ndarray:
    return gaussian_field32(view, ids, shape, CPU).reshape(len(ids), -1).numpy()


def test_generator_three_is_an_independent_lowbias32_and_quantile_table_bit_for_bit():
    ours = field(IDS, (3, 16, 16))
    theirs = numpy_gaussian_field32("gaussian_noise-2", IDS, 3 * 16 * 16)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    assert not np.array_equal(ours, field(IDS, (3, 16, 16), "gaussian_noise-1"))  # each view draws its own


def test_the_normal_transform_of_every_octave_bit_for_bit():
    """Hashes chosen in each of the 31 octaves of the distance to the tail, on both sides, and the extremes."""
    rng = np.random.default_rng(0)
    exponent = rng.integers(0, 31, 4000)
    v = (np.ldexp(1.0, exponent) * (1 + rng.random(4000))).astype(np.uint64).clip(1, 2**31 - 1)
    bits = ((v & ~np.uint64(1)) | (rng.integers(0, 2, 4000).astype(np.uint64) << np.uint64(31))).astype(np.uint32)
    bits = np.concatenate([bits, np.array([0, 1, 2, 0x7FFFFFFE, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF], np.uint32)])
    out, values, fraction = (torch.empty(len(bits)) for _ in range(3))
    views.normal_from_bits_(torch.from_numpy(bits.view(np.int32).copy()), out, torch.empty(len(bits),
                            dtype=torch.int32), values, fraction)
    assert np.array_equal(out.numpy().view(np.uint32), numpy_normal(bits).view(np.uint32))


def test_each_value_is_its_probability_s_normal_quantile_within_1e_6():
    """For every odd v (the distance to the tail in 2^-32) at 65 places in each of the 3,968 intervals,
    |Phi(z) - v / 2^32| <= 1.01e-6 (linear between knots, the error peaks at the top octave's start), and in the
    tails within 1e-5 of v / 2^32 itself; the smallest value is Phi^-1(2^-32) = -6.2303."""
    lows = np.ldexp(1 + np.arange(128) / 128, np.arange(31)[:, None]).ravel()
    v = np.unique((lows[:, None] + np.outer(lows / 128, np.linspace(0, 1, 65))).ravel() // 2 * 2 + 1)
    v = v[v < 2**31].astype(np.int64)
    out, values, fraction = (torch.empty(len(v)) for _ in range(3))
    views.normal_from_bits_(torch.from_numpy(v.astype(np.int32)), out, torch.empty(len(v), dtype=torch.int32),
                            values, fraction)
    p = v / 2.0**32
    error = np.abs(special.ndtr(out.double().numpy()) - p)
    assert error.max() <= 1.01e-6 and (error / p).max() <= 1e-5
    assert out.min().item() == pytest.approx(special.ndtri(2.0**-32), abs=1e-6)


def test_generator_three_is_standard_normal():
    z = field(list(range(20)), (3, 128, 128)).ravel().astype(np.float64)
    assert abs(z.mean()) < 3e-3 and abs(z.std() - 1) < 3e-3
    assert abs(stats.skew(z)) < 1e-2 and abs(stats.kurtosis(z)) < 2e-2  # 4 standard errors of 983,040 draws
    assert stats.kstest(z, "norm").statistic < 2e-3  # the KS distance of a true normal's ~1e6 draws is ~1e-3
    assert np.abs(z).max() <= 6.24
    assert abs(stats.pearsonr(z[:-1], z[1:]).statistic) < 5e-3  # neighbouring values do not follow each other
    images = z.reshape(20, -1)
    assert np.abs(np.corrcoef(images)[np.triu_indices(20, 1)]).max() < 2.5e-2  # nor images each other (5.5 s.e.)


def test_generator_three_is_the_same_in_any_batch_block_shape_and_thread_count(monkeypatch):
    together = field([5, 9, 2, 11, 1 << 40], (3, 40, 40))
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            alone = np.concatenate([field([i], (3, 40, 40)) for i in (5, 9, 2, 11, 1 << 40)])
            assert np.array_equal(together.view(np.uint32), alone.view(np.uint32))
    finally:
        torch.set_num_threads(threads)
    for block in (1000, 4800, 9600, 1 << 24):  # part of an image, one, two whole images, all in one block
        monkeypatch.setattr(views, "NOISE_BLOCK", block)
        assert np.array_equal(together.view(np.uint32), field([5, 9, 2, 11, 1 << 40], (3, 40, 40)).view(np.uint32))
        assert np.array_equal(together[:, :1000], field([5, 9, 2, 11, 1 << 40], (1000,)))  # value i: index i


def test_new_views_use_generator_three_and_stores_keep_generator_two_and_one():
    crops = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    x = crops.numpy().astype(np.float32) / np.float32(255)
    new = parse_view("gaussian_noise-2")
    assert new.generator == 3 and new.to_dict()["view_generator"] == 3
    z3 = numpy_gaussian_field32("gaussian_noise-2", [3, 4], 192).reshape(2, 3, 8, 8)
    assert np.array_equal(new.apply_batch(crops, [3, 4]).numpy(), np.clip(x + np.float32(0.12) * z3, 0, 1))
    two = with_generator(new, {"view_generator": 2})
    z2 = numpy_gaussian_field("gaussian_noise-2", [3, 4], 192).reshape(2, 3, 8, 8)
    assert np.array_equal(two.apply_batch(crops, [3, 4]).numpy(), np.clip(x + np.float32(0.12) * z2, 0, 1))
    assert with_generator(new, {"name": "gaussian_noise-2"}).generator == 1  # records none: made before 2
    with pytest.raises(FeatstoreError, match="view generator 4"):
        with_generator(new, {"view_generator": 4})


def _noisy_logits(fs: FeatureStore, jpegs, rows: range, noise: np.ndarray) -> np.ndarray:
    """resnet18 (the build's random init) on the clean crops of `rows` plus 0.08 `noise`, written independently."""
    images = fs.image_table()
    prep = fs.model_attrs("resnet18")["config"]["preprocessing"]
    clean = reference_batch([jpegs / images["path"][r] for r in rows], {**prep, "mean": [0] * 3, "std": [1] * 3})
    mean, std = (torch.tensor(prep[k]).view(1, 3, 1, 1) for k in ("mean", "std"))
    noisy = ((clean + 0.08 * torch.from_numpy(noise).view_as(clean)).clamp(0, 1) - mean) / std
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    with torch.no_grad():
        return torch.cat([model(part) for part in noisy.split(2)]).numpy()


def test_a_build_draws_generator_three_and_resumes_a_generator_two_view_with_generator_two(tmp_path):
    """A new noise view records generator 3 and holds its draws; once its attrs say 2 (a store made before 3), a
    rebuilt chunk holds generator 2's draws (the numpy rewrite of test_gpu_input) and the view still says 2."""
    jpegs = make_image_folder(tmp_path / "jpegs", n_classes=3, per_class=4, size=(60, 45))
    store = tmp_path / "s.zarr"
    args = ["--data", jpegs, "--store", store, "--views", "clean,gaussian_noise-1", "--workers", "0", *SMALL]
    run_cli("build", *args)
    fs = FeatureStore(store)
    ids = [int(i) for i in fs.image_table()["image_id"][4:8]]
    assert fs.view_group("resnet18", "gaussian_noise-1").attrs["view_generator"] == 3
    three = numpy_gaussian_field32("gaussian_noise-1", ids, 3 * 32 * 32)
    made_by_three = fs.read_logits("resnet18", "gaussian_noise-1")
    assert_fp16_close(made_by_three[4:8], _noisy_logits(fs, jpegs, range(4, 8), three), "generator 3's chunk")
    group = zarr.open_group(str(store), mode="a")["resnet18"]["gaussian_noise-1"]
    group.attrs.put({**dict(group.attrs), "view_generator": 2})
    group["done"][1] = False
    assert "1 chunk(s) written" in run_cli("build", *args).output
    fs = FeatureStore(store)
    assert fs.view_group("resnet18", "gaussian_noise-1").attrs["view_generator"] == 2
    stored = fs.read_logits("resnet18", "gaussian_noise-1")
    two = numpy_gaussian_field("gaussian_noise-1", ids, 3 * 32 * 32)
    assert_fp16_close(stored[4:8], _noisy_logits(fs, jpegs, range(4, 8), two), "generator 2's chunk")
    assert not np.array_equal(stored[4:8], made_by_three[4:8])
    assert np.array_equal(np.delete(stored, range(4, 8), 0), np.delete(made_by_three, range(4, 8), 0))
