"""Generated image sets with class structure, for tests, benchmarks and the offline demo.

Each class has its own hue, stripe frequency and orientation; each image adds random placement and noise.
Files are real JPEGs (or PNGs) in an ImageFolder tree, so they go through the same loading code as ImageNet.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def class_image(label: int, n_classes: int, rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    angle = np.pi * label / n_classes + rng.normal(0, 0.05)
    freq = 0.02 + 0.08 * ((label * 7) % n_classes) / max(1, n_classes - 1)
    phase = rng.uniform(0, 2 * np.pi)
    stripes = 0.5 + 0.5 * np.sin(freq * (xx * np.cos(angle) + yy * np.sin(angle)) + phase)
    hue = np.array([np.cos(2 * np.pi * label / n_classes), np.cos(2 * np.pi * label / n_classes + 2.1),
                    np.cos(2 * np.pi * label / n_classes + 4.2)], dtype=np.float32) * 0.35 + 0.5
    img = stripes[..., None] * hue[None, None, :] + rng.normal(0, 0.08, (h, w, 3)).astype(np.float32)
    cy, cx, r = rng.uniform(0.3, 0.7) * h, rng.uniform(0.3, 0.7) * w, rng.uniform(0.1, 0.25) * min(w, h)
    blob = ((yy - cy) ** 2 + (xx - cx) ** 2) < r**2
    img[blob] = 1.0 - hue
    return Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8))


def make_image_folder(root: str | Path, n_classes: int = 4, per_class: int = 8, size: tuple[int, int] = (64, 48),
                      seed: int = 0, fmt: str = "JPEG") -> Path:
    """Write root/class_XX/img_YYYY.jpg and return root; same arguments give the same files."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    ext = ".jpg" if fmt.upper() == "JPEG" else f".{fmt.lower()}"
    for label in range(n_classes):
        folder = root / f"class_{label:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for j in range(per_class):
            class_image(label, n_classes, rng, size).save(folder / f"img_{j:04d}{ext}", fmt, quality=90)
    return root
