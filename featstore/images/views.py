"""Corruption views (ImageNet-C parameters), deterministic per image id.

A view is `clean` or `<corruption>-<severity>`. Each acts on the cropped image in [0,1] before
normalisation; random ones draw from a generator seeded by (view, image id), so any chunk can be rebuilt
alone, on any rank, and comes out bit-identical. `View.apply` takes one image (the PIL input path),
`View.apply_batch` a batch on any device (the tensor input path): the same operations, so on the CPU the two
agree bit for bit.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from featstore.errors import FeatstoreError

# ImageNet-C severities 1..5 (Hendrycks & Dietterich 2019).
SEVERITIES: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),
    "gaussian_blur": (1.0, 2.0, 3.0, 4.0, 6.0),
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),
}


@dataclass(frozen=True)
class View:
    """One way of presenting every image to the model."""

    name: str
    corruption: str | None = None
    severity: int = 0

    @property
    def parameter(self) -> float | None:
        return None if self.corruption is None else SEVERITIES[self.corruption][self.severity - 1]

    def to_dict(self) -> dict:
        return {"name": self.name, "corruption": self.corruption, "severity": self.severity,
                "parameter": self.parameter}

    def apply(self, image: torch.Tensor, image_id: int) -> torch.Tensor:
        """uint8 [3,H,W] -> the view of it: uint8 for clean (exact), float32 in [0,1] otherwise."""
        if self.corruption is None:
            return image
        noise = self.noise(image_id, tuple(image.shape)) if self.corruption == "gaussian_noise" else None
        return self._corrupt(image.float().div_(255), noise)

    def apply_batch(self, images: torch.Tensor, image_ids: list[int],
                    noise: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 [B,3,H,W] on any device -> the view of each image, as `apply` gives it per image.

        `noise` is the stacked `noise(image_id)` of the batch when the caller made it ahead (the loader's
        workers do); otherwise it is drawn here, on the CPU, from the same per-image generators."""
        if self.corruption is None:
            return images
        if self.corruption == "gaussian_noise" and noise is None:
            noise = torch.stack([self.noise(i, tuple(images.shape[1:])) for i in image_ids])
        if noise is not None:
            noise = noise.to(images.device, non_blocking=True)
        return self._corrupt(images.float().div_(255), noise)

    def noise(self, image_id: int, shape: tuple[int, ...]) -> torch.Tensor:
        """The standard normal draw of `gaussian_noise` views: CPU generator seeded by (view, image id)."""
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


def _gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian, truncated at 4 sigma, edges replicated: what ImageNet-C's skimage call does."""
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
    value = x.amax(dim=-3, keepdim=True)
    new_value = (value + delta).clamp(0.0, 1.0)
    scaled = x * (new_value / value.clamp_min(1e-12))
    return torch.where(value > 0, scaled, new_value.expand_as(x))


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
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise FeatstoreError("--views is empty: give e.g. clean or clean,gaussian_noise-1")
    return [parse_view(n) for n in dict.fromkeys(names)]
