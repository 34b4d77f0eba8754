"""The demo's image set: classes told apart by layout, with a colour cue for part of the images only.

Every image holds three dots whose arrangement is the class (a line in one of four directions, or a corner in
one of four orientations), among grey clutter dots that look exactly like them, so a dot's local look says
nothing and only units that combine several dots can name the class. In a share of the images (`cue_share`)
the three dots also wear the class's own colour, a cue that the very first layer can read after global
pooling; in the rest they are grey like the clutter. A network therefore settles the coloured images at its
stem and the grey ones later. Generated with a fixed seed: the same arguments write the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

# Offsets of the three dots in units of the spacing (row, column), one arrangement per class.
LAYOUTS: dict[str, tuple[tuple[int, int], ...]] = {
    "row": ((0, -1), (0, 0), (0, 1)),
    "column": ((-1, 0), (0, 0), (1, 0)),
    "diag-dn": ((-1, -1), (0, 0), (1, 1)),
    "diag-up": ((-1, 1), (0, 0), (1, -1)),
    "crnr-tl": ((-1, -1), (-1, 1), (1, -1)),
    "crnr-tr": ((-1, -1), (-1, 1), (1, 1)),
    "crnr-bl": ((-1, -1), (1, -1), (1, 1)),
    "crnr-br": ((-1, 1), (1, -1), (1, 1)),
}

# Well separated hues, one per class (RGB in [0, 1]).
CUE_COLOURS = np.array([[0.95, 0.25, 0.25], [0.25, 0.55, 1.0], [0.3, 0.9, 0.3], [1.0, 0.85, 0.2],
                        [0.85, 0.3, 0.95], [0.2, 0.9, 0.9], [1.0, 0.55, 0.1], [0.6, 0.45, 0.25]], dtype=np.float32)


@dataclass(frozen=True)
class LayoutConfig:
    """What the generator draws; the defaults are the demo's measured design."""

    size: int = 32
    per_class: int = 150
    cue_share: float = 0.5  # images whose dots wear the class colour
    spacing: tuple[float, float] = (6.0, 9.0)  # pixels between neighbouring dots of a layout
    clutter: tuple[int, int] = (2, 5)  # grey distractor dots per image (inclusive range), like uncued dots
    radius: float = 2.0
    noise: float = 0.08
    jitter: float = 0.8  # pixels of random offset of every dot from its place in the layout
    seed: int = 0


def _dot(canvas: np.ndarray, yy: np.ndarray, xx: np.ndarray, cy: float, cx: float, r: float,
         colour: np.ndarray) -> None:
    """Paint an anti-aliased disc (coverage from the distance to the rim)."""
    cover = np.clip(r + 0.5 - np.sqrt((yy - cy) ** 2 + (xx - cx) ** 2), 0, 1)[..., None]
    canvas *= 1 - cover
    canvas += cover * colour


def layout_image(label: int, cued: bool, rng: np.random.Generator, cfg: LayoutConfig) -> np.ndarray:
    """One image as uint8 [size, size, 3]."""
    s = cfg.size
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32)
    canvas = np.full((s, s, 3), 0.15, np.float32) + rng.normal(0, cfg.noise, (s, s, 3)).astype(np.float32)
    spacing = rng.uniform(*cfg.spacing)
    margin = spacing + 4 + cfg.radius  # the whole layout stays inside the centre crop
    cy, cx = rng.uniform(margin, s - margin, 2)
    for _ in range(rng.integers(cfg.clutter[0], cfg.clutter[1] + 1)):
        grey = np.full(3, rng.uniform(0.5, 0.9), np.float32)
        _dot(canvas, yy, xx, *rng.uniform(4, s - 4, 2), cfg.radius, grey)
    colour = CUE_COLOURS[label] if cued else np.full(3, rng.uniform(0.5, 0.9), np.float32)
    for dy, dx in list(LAYOUTS.values())[label]:
        _dot(canvas, yy, xx, cy + dy * spacing + rng.normal(0, cfg.jitter),
             cx + dx * spacing + rng.normal(0, cfg.jitter),
             cfg.radius, colour)
    return (np.clip(canvas, 0, 1) * 255).round().astype(np.uint8)


def draw_layouts(cfg: LayoutConfig = LayoutConfig()) -> Iterator[tuple[int, bool, np.ndarray]]:
    """The whole seeded set in order, as (label, cued, image): what `layout_image_folder` writes, in memory."""
    rng = np.random.default_rng(cfg.seed)
    labels = np.repeat(np.arange(len(LAYOUTS)), cfg.per_class)
    rng.shuffle(labels)
    cued = rng.random(len(labels)) < cfg.cue_share
    for label, cue in zip(labels, cued, strict=True):
        yield int(label), bool(cue), layout_image(int(label), bool(cue), rng, cfg)


def layout_image_folder(root: str | Path, cfg: LayoutConfig = LayoutConfig()) -> Path:
    """Write root/<layout>/<nnnn>.png (cued and uncued images interleaved by the seeded draw); same config,
    same bytes."""
    root = Path(root)
    names = list(LAYOUTS)
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
    for i, (label, _, image) in enumerate(draw_layouts(cfg)):
        Image.fromarray(image).save(root / names[label] / f"{i:04d}.png")
    return root
