"""Corruption views (ImageNet-C parameters), deterministic per image id.

A view is `clean` or `<corruption>-<severity>`. Each acts on the cropped image in [0,1] before
normalisation, where the crop is (the build's device): `View.apply_batch` takes a batch on any device,
`View.apply` one image through the same code.

Gaussian noise comes from a counter-based generator (`VIEW_GENERATOR` 3): each value is a function of the view's
name, the image id and the value's index in the [3, H, W] crop alone. Value i of an image hashes i with 32-bit
integer hashing (lowbias32 twice, keyed by the two halves of a 64-bit blake2b of view and id); its bits pick a side
of the median, and, read as a float32's exponent and top mantissa bits, one of 3,968 intervals of probability (128
per octave towards the tail), the normal's quantile function linear in each: the standard normal within 1.003e-6 in
probability, cut at +-6.23 (a share of 5e-10 of normal draws lies beyond). It works in cache-sized blocks with
in-place 32-bit operations over a 32 KB table. Every step is an integer operation or a correctly rounded IEEE one
(no fused multiply-add), so a view is bit-identical whatever the batch, worker count, chunk, resume point, thread
count or device (CPU or CUDA), and only the crop's bytes cross to the device. A store's views keep the generator
they were made with (the build reads the version a view records): 2 (SplitMix64 over int64 and a 2^20-knot table:
about 6x the CPU time of 3) or 1 (views that record none: per-image draws of torch's CPU generator).
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from featstore.errors import FeatstoreError, Name
from featstore.schema import comma_list

if TYPE_CHECKING:
    import torch

VIEW_GENERATOR = 3  # how new views are made (recorded per view): 3 draws noise with 32-bit hashing, 2 with
VIEW_GENERATORS = (1, 2, 3)  # SplitMix64; 1 (views made before 2, which record none) from torch.Generator draws
QUANTILE_BITS = 20  # the table's index bits: knots at Phi^-1(j / 2^20), the tails cut at Phi^-1(0.5 / 2^20) = 4.9
QUANTILE_DIGEST = "0020e711b86a8b6b"  # blake2b of the knots this code computes: another table would be other noise
# (each float64 knot lies >= 380 of its ulps from a float32 rounding tie, so any sound ndtri gives these bits)

# ImageNet-C severities 1..5 (Hendrycks & Dietterich 2019).
SEVERITIES: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),
    "gaussian_blur": (1.0, 2.0, 3.0, 4.0, 6.0),
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),
}


@dataclass(frozen=True)
class View:
    """One way of presenting every image to the model. `generator` says how it is made (for gaussian noise, how the
    draws are): a store's view keeps the one it was made with."""

    name: str
    corruption: str | None = None
    severity: int = 0
    generator: int = VIEW_GENERATOR

    @property
    def parameter(self) -> float | None:
        return None if self.corruption is None else SEVERITIES[self.corruption][self.severity - 1]

    def to_dict(self) -> dict:
        return {"name": self.name, "corruption": self.corruption, "severity": self.severity,
                "parameter": self.parameter, "view_generator": self.generator}

    def apply(self, image: torch.Tensor, image_id: int) -> torch.Tensor:
        """uint8 [3,H,W] -> the view of it: uint8 for clean (exact), float32 in [0,1] otherwise."""
        if self.corruption is None:
            return image
        return self.apply_batch(image[None], [image_id])[0]

    def apply_batch(self, images: torch.Tensor, image_ids: list[int]) -> torch.Tensor:
        """uint8 [B,3,H,W] on any device -> the view of each image, computed on that device."""
        import torch

        if self.corruption is None:
            return images
        noise = None
        if self.corruption == "gaussian_noise":
            if self.generator == 1:  # stores made before generator 2: their draws, on the CPU, then copied
                noise = torch.stack([self.noise(i, tuple(images.shape[1:])) for i in image_ids]).to(images.device)
            elif self.generator == 2:
                noise = gaussian_field(self.name, image_ids, tuple(images.shape[1:]), images.device)
            else:
                noise = gaussian_field32(self.name, image_ids, tuple(images.shape[1:]), images.device)
        return self._corrupt(images.float().div_(255), noise)

    def noise(self, image_id: int, shape: tuple[int, ...]) -> torch.Tensor:
        """Generator 1's standard normal draw: a CPU generator seeded by (view, image id)."""
        import torch

        gen = torch.Generator().manual_seed(zlib.crc32(f"{self.name}:{image_id}".encode()))
        return torch.randn(shape, generator=gen)

    def _corrupt(self, x: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """[...,3,H,W] in [0,1] -> the corrupted image(s), clamped to [0,1]."""
        p = self.parameter
        if self.corruption == "gaussian_noise":
            x = x + p * noise
        elif self.corruption == "gaussian_blur":
            x = _gaussian_blur(x, p)
        elif self.corruption == "brightness":
            x = _add_hsv_value(x, p)
        return x.clamp_(0.0, 1.0)


# -- generator 2: counter-based normal draws -------------------------------------------------------------------

_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's stream increment (the golden ratio in 64 bits)


def _int64(value: int) -> int:
    """An unsigned 64-bit constant as the signed int64 with the same bits (torch's integer type)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's >> is arithmetic: the sign bits are masked off)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser: 64 well-mixed bits from a counter (products wrap, as two's complement does)."""
    z = (z ^ _shr(z, 30)) * _int64(0xBF58476D1CE4E5B9)
    z = (z ^ _shr(z, 27)) * _int64(0x94D049BB133111EB)
    return z ^ _shr(z, 31)


@cache
def _quantile_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 knots Phi^-1(j / 2^20) (j = 0 at 0.5 / 2^20) for j < 2^20, and each knot's step to the next; made
    once on the CPU in float64, symmetric about 0, then checked against the digest this code was written with."""
    import torch

    n = 1 << QUANTILE_BITS
    u = (torch.arange(n // 2 + 1, dtype=torch.float64) / n).clamp_(min=0.5 / n)
    lower = torch.special.ndtri(u)
    lower[-1] = 0.0
    knots = torch.cat([lower, -lower[:-1].flip(0)]).float()  # n + 1 knots, the last Phi^-1(1 - 0.5 / n)
    steps = knots[1:] - knots[:-1]
    digest = hashlib.blake2b(knots.numpy().tobytes(), digest_size=8).hexdigest()
    if digest != QUANTILE_DIGEST:
        raise FeatstoreError(f"this torch ({torch.__version__}) computes another normal quantile table ({digest}, "
                             f"expected {QUANTILE_DIGEST}), so its gaussian_noise views would differ from featstore's; "
                             f"build noise views with another torch version")
    return knots[:-1].to(device), steps.to(device)


def gaussian_field(view: str, image_ids: list[int], shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """float32 [B, *shape] standard normal values (generator 2), each a function of (view, image id, index) only.

    Value i of image `id` hashes the counter key(view, id) + i * gamma with SplitMix64; its top 20 bits pick a
    quantile interval, the next 24 where in it (linear between the knots): the normal distribution within 1e-6 in
    probability, cut at +-4.9 (a share of 1e-6 of a normal draw lies beyond)."""
    import torch

    view_key = int.from_bytes(hashlib.blake2b(f"featstore-noise:{view}".encode(), digest_size=8).digest(), "little")
    ids = torch.tensor(image_ids, dtype=torch.int64, device=device)
    keys = _mix64(ids * _int64(_GAMMA) ^ _int64(view_key))
    count = 1
    for side in shape:
        count *= side
    counters = torch.arange(count, dtype=torch.int64, device=device) * _int64(_GAMMA)
    bits = _mix64(keys[:, None] + counters[None, :])
    knots, steps = _quantile_tables(torch.device(device))
    index = _shr(bits, 64 - QUANTILE_BITS)
    within = (_shr(bits, 40 - QUANTILE_BITS) & 0xFFFFFF).float().mul_(2.0**-24)
    return (knots[index] + within.mul_(steps[index])).view(len(image_ids), *shape)


# -- generator 3: counter-based normal draws with 32-bit hashing --------------------------------------------------

OCTAVE_BITS = 7  # intervals per octave of probability: 2^7, so the table has 31 * 128 + 1 knots
FRACTION_BITS = 23 - OCTAVE_BITS  # the float32 mantissa bits below the interval's: where in it the value lies
QUANTILE32_DIGEST = "e6d31a82f6ddf412"  # blake2b of the knots and steps this code computes: another table is other
# noise (each float64 knot lies >= 71,000 of its ulps from a float32 rounding tie, so any sound ndtri gives these bits)
NOISE_BLOCK = 1 << 18  # values per block on a CPU (a 224 px crop in one): its five 32-bit buffers stay in L3
NOISE_BLOCK_ACCELERATOR = 1 << 24  # on a GPU: a batch of 111 such crops in one set of kernels
_LOWBIAS32 = ((16, 0x7FEB352D), (15, 0x846CA68B), (16, None))  # Wellons' lowbias32: (xorshift, multiply) steps


def _int32(value: int) -> int:
    """An unsigned 32-bit constant as the signed int32 with the same bits (torch's 32-bit integer type)."""
    return value - (1 << 32) if value >= 1 << 31 else value


def _lowbias32_(x: torch.Tensor, scratch: torch.Tensor) -> None:
    """x <- lowbias32(x), in place over int32 (products wrap; each right shift is made logical by its mask)."""
    import torch

    for shift, multiplier in _LOWBIAS32:
        torch.bitwise_right_shift(x, shift, out=scratch)
        x.bitwise_xor_(scratch.bitwise_and_((1 << (32 - shift)) - 1))
        if multiplier is not None:
            x.mul_(_int32(multiplier))


@cache
def _quantile32_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 knots Phi^-1(v / 2^32) at v = 2^e (1 + j / 128) (octave e = 0..30, j = 0..127; the last, v = 2^31,
    is 0), and each knot's step to the next scaled by 2^-16 (a whole fraction's weight): made once on the CPU in
    float64, then checked against the digest this code was written with."""
    import torch

    k = torch.arange((31 << OCTAVE_BITS) + 1, dtype=torch.float64)
    octave = torch.div(k, 1 << OCTAVE_BITS, rounding_mode="floor")
    v = torch.exp2(octave) * (1 + (k - octave * (1 << OCTAVE_BITS)) / (1 << OCTAVE_BITS))  # exact in float64
    knots = torch.special.ndtri(v / 2.0**32)
    knots[-1] = 0.0
    knots = knots.float()
    steps = torch.zeros_like(knots)
    steps[:-1] = (knots[1:] - knots[:-1]).mul_(2.0**-FRACTION_BITS)
    digest = hashlib.blake2b(knots.numpy().tobytes() + steps.numpy().tobytes(), digest_size=8).hexdigest()
    if digest != QUANTILE32_DIGEST:
        raise FeatstoreError(f"this torch ({torch.__version__}) computes another normal quantile table ({digest}, "
                             f"expected {QUANTILE32_DIGEST}), so its gaussian_noise views would differ from "
                             f"featstore's; build noise views with another torch version")
    return knots.to(device), steps.to(device)


def image_keys32(view: str, image_id: int) -> tuple[int, int]:
    """The two 32-bit keys (as int32) of an image's noise in a view: the halves of a 64-bit blake2b of both."""
    digest = hashlib.blake2b(f"featstore-noise-3:{view}:{image_id}".encode(), digest_size=8).digest()
    return _int32(int.from_bytes(digest[:4], "little")), _int32(int.from_bytes(digest[4:], "little"))


def normal_from_bits_(bits: torch.Tensor, out: torch.Tensor, index: torch.Tensor, values: torch.Tensor,
                      fraction: torch.Tensor) -> None:
    """int32 hashes -> standard normal float32 values in `out`, through three same-size buffers (`bits` consumed).

    Bit 31 is the side of the median; v = bits 1..30 with bit 0 set (odd, 1 <= v < 2^31) is the distance to the
    tail, v / 2^32 in probability. float32(v) (correctly rounded) has exponent e and mantissa m: the top 7 bits of
    m pick the interval [2^e (1 + j/128), 2^e (1 + (j+1)/128)), the 16 below them where in it (linear)."""
    import torch

    torch.bitwise_or(bits, 1, out=index).bitwise_and_(0x7FFFFFFF)
    values.copy_(index)  # int32 -> float32, rounded to nearest even
    float_bits = values.view(torch.int32)
    torch.bitwise_right_shift(float_bits, FRACTION_BITS, out=index).sub_(127 << OCTAVE_BITS)  # the interval
    fraction.copy_(float_bits.bitwise_and_((1 << FRACTION_BITS) - 1))
    knots, steps = _quantile32_tables(out.device)
    torch.index_select(steps, 0, index, out=values)
    values.mul_(fraction)  # a separate product and sum: never a fused multiply-add, whose rounding is another
    torch.index_select(knots, 0, index, out=out)
    out.add_(values)
    out.view(torch.int32).bitwise_xor_(bits.bitwise_and_(_int32(1 << 31)))  # the upper side: the sign flipped


def gaussian_field32(view: str, image_ids: list[int], shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """float32 [B, *shape] standard normal values (generator 3), each a function of (view, image id, index) only:
    value i of an image is the normal transform of lowbias32(lowbias32(i ^ k0) ^ k1), (k0, k1) its keys. Made in
    blocks of whole images (or of one image's values, where it is larger than a block) with in-place ops."""
    import torch

    count = 1
    for side in shape:
        count *= side
    out = torch.empty((len(image_ids), count), dtype=torch.float32, device=device)
    block = NOISE_BLOCK if device.type == "cpu" else NOISE_BLOCK_ACCELERATOR
    width = max(1, min(count, block))
    rows = max(1, block // width)
    keys = torch.tensor([image_keys32(view, i) for i in image_ids], dtype=torch.int32).view(-1, 2).to(device)
    bits, index = (torch.empty(rows * width, dtype=torch.int32, device=device) for _ in range(2))
    values, fraction = (torch.empty(rows * width, dtype=torch.float32, device=device) for _ in range(2))
    for first in range(0, len(image_ids), rows):
        block_keys = keys[first:first + rows]
        for start in range(0, count, width):
            n = block_keys.shape[0] * min(width, count - start)  # whole rows, or part of one
            x = bits[:n].view(block_keys.shape[0], -1)
            x.copy_(torch.arange(start, start + x.shape[1], dtype=torch.int32, device=device).expand_as(x))
            _lowbias32_(x.bitwise_xor_(block_keys[:, :1]), index[:n].view_as(x))
            _lowbias32_(x.bitwise_xor_(block_keys[:, 1:]), index[:n].view_as(x))
            target = out[first:first + rows, start:start + x.shape[1]].view(-1)  # whole rows or part of one
            normal_from_bits_(bits[:n], target, index[:n], values[:n], fraction[:n])
    return out.view(len(image_ids), *shape)


def _gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian, truncated at 4 sigma, edges replicated: what ImageNet-C's skimage call does."""
    import torch

    radius = int(4.0 * sigma + 0.5)
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-0.5 * (t / sigma) ** 2)
    kernel = (kernel / kernel.sum()).to(x.device, x.dtype)
    c = x.shape[-3]
    y = torch.nn.functional.pad(x.reshape(-1, *x.shape[-3:]), (radius, radius, radius, radius), mode="replicate")
    y = torch.nn.functional.conv2d(y, kernel.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    y = torch.nn.functional.conv2d(y, kernel.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)
    return y.reshape(x.shape)


def _add_hsv_value(x: torch.Tensor, delta: float) -> torch.Tensor:
    """Add `delta` to HSV value keeping hue and saturation: RGB scales linearly with V at fixed H, S."""
    import torch

    value = x.amax(dim=-3, keepdim=True)
    new_value = (value + delta).clamp(0.0, 1.0)
    scaled = x * (new_value / value.clamp_min(1e-12))
    return torch.where(value > 0, scaled, new_value.expand_as(x))


def with_generator(view: View, recorded: dict) -> View:
    """`view` as a store recorded it: a view made before generator 2 (its attrs name none) keeps generator 1 (for
    noise views, generator 1's draws); one made by a newer featstore's generator is refused, never mixed with this
    one's."""
    generator = recorded.get("view_generator", 1)
    if isinstance(generator, bool) or not isinstance(generator, int) or generator not in VIEW_GENERATORS:
        raise FeatstoreError(f"view {view.name!r} was made with view generator {generator!r}, which this featstore "
                             f"does not have; build it with that featstore's version, or under another ", Name("name"))
    return View(view.name, view.corruption, view.severity, generator)


def parse_view(name: str) -> View:
    if name == "clean":
        return View("clean")
    corruption, _, severity = name.rpartition("-")
    if corruption not in SEVERITIES or not severity.isdigit() or not 1 <= int(severity) <= 5:
        known = ", ".join(f"{c}-1..5" for c in SEVERITIES)
        raise FeatstoreError(f"unknown view {name!r}: use clean or one of {known}")
    return View(name, corruption, int(severity))


def parse_views(spec: str) -> list[View]:
    """'clean,gaussian_noise-1' -> views in the given order, without repeats."""
    names = comma_list(spec)
    if not names:
        raise FeatstoreError(Name("views"), " is empty: give e.g. clean or clean,gaussian_noise-1")
    return [parse_view(n) for n in dict.fromkeys(names)]
