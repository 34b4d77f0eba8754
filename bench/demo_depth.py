"""Where a small ResNet-18 settles the demo's uncued images, per candidate image design.

The demo wants a late mode: >= 20% of held-out images whose l*(2) falls in the last 30% of the anchors (layer4
of the resnet18 preset). This script measures, for each design, at which anchor a linear probe first reads the
class of the images without the colour cue. Each design is generated in memory with a fixed seed, a torchvision
resnet18 is trained from scratch on 70% of it with the demo's own recipe (`fit_resnet18`), the preset's 12
anchors are tapped with featstore's `Tapper`, and one scikit-learn LogisticRegression (C=1, standardised
features) per anchor is fitted on the same 70% and scored on the other 30%. Printed per design: probe
accuracy per anchor on cued and uncued test images, the l*(2) histogram and the early/late shares.

    python bench/demo_depth.py [--designs layouts32,strip288]

Designs (half of the images of each wear their class colour, readable at the stem):
- layouts32: the shipped demo set (`featstore.workflows.layouts`, 32 px), three dots among look-alike clutter dots;
- layouts64: the same design at twice the size (64 px: layer3's map is 4x4, layer4's 2x2);
- spread64: 64 px layouts whose dots are 18-24 px apart, so they span most of the image;
- pointer32: four glyphs, one per quadrant, and a pointer from the centre; the class is the pointed glyph;
- strip288: three distinct glyphs 100-110 px apart on a 32x288 strip; the class is their left-to-right order
  (every image holds the same glyphs, so nothing short of relating two glyphs 100 px apart names the class).
"""

from __future__ import annotations

import argparse
import itertools
import time
import warnings
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from featstore.nets.anchors import PRESETS, resolve_anchors
from featstore.nets.extraction import Tapper
from featstore.nets.models import load_model
from featstore.workflows.demo import fit_resnet18
from featstore.workflows.layouts import CUE_COLOURS, LAYOUTS, LayoutConfig, draw_layouts

Design = Callable[[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]  # (images, seed) -> X, y, cued


def layouts(cfg: LayoutConfig) -> Design:
    """featstore.layouts' own seeded draw, so that `layouts32` is the very set the demo writes."""
    def make(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        labels, cued, images = zip(*draw_layouts(replace(cfg, per_class=n // len(LAYOUTS), seed=seed)), strict=True)
        return np.stack(images), np.array(labels), np.array(cued)
    return make


def glyph(yy: np.ndarray, xx: np.ndarray, cy: float, cx: float, kind: int, h: float) -> np.ndarray:
    """Mask of one small glyph: plus, x, ring, square outline, disc, bar, upright bar, triangle."""
    dy, dx = yy - cy, xx - cx
    ay, ax, d = np.abs(dy), np.abs(dx), np.hypot(dy, dx)
    return [((ay <= 0.9) & (ax <= h)) | ((ax <= 0.9) & (ay <= h)), (np.abs(ay - ax) <= 0.9) & (ay <= h),
            np.abs(d - h + 0.8) <= 0.9, (np.maximum(ay, ax) <= h) & (np.maximum(ay, ax) >= h - 1.6), d <= h * 0.8,
            (ay <= 1.3) & (ax <= h), (ax <= 1.3) & (ay <= h),
            (dy <= h * 0.8) & (dy >= -h) & (ax <= (dy + h) * 0.5)][kind]


def canvas(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    return np.full((h, w, 3), 0.15, np.float32) + rng.normal(0, 0.06, (h, w, 3)).astype(np.float32)


def grey(rng: np.random.Generator) -> np.ndarray:
    return np.full(3, rng.uniform(0.55, 0.9), np.float32)


def pointer32(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    size, kinds = 32, 8
    y = rng.permutation(np.arange(n) % kinds)
    cued = rng.random(n) < 0.5
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    centres = [(8.0, 8.0), (8.0, 24.0), (24.0, 8.0), (24.0, 24.0)]
    out = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        c = canvas(rng, size, size)
        target = int(rng.integers(4))
        kinds_here = list(rng.permutation([k for k in range(kinds) if k != y[i]])[:3])
        kinds_here.insert(target, y[i])
        for j, ((cy, cx), k) in enumerate(zip(centres, kinds_here, strict=True)):
            c[glyph(yy, xx, cy + rng.uniform(-1, 1), cx + rng.uniform(-1, 1), int(k), 3.5)] = (
                CUE_COLOURS[y[i]] if cued[i] and j == target else grey(rng))
        ty, tx = centres[target][0] - 16, centres[target][1] - 16  # a white segment from the centre towards it
        t = np.clip(((yy - 16) * ty + (xx - 16) * tx) / (ty * ty + tx * tx), 0, 0.45)
        c[np.hypot(yy - 16 - t * ty, xx - 16 - t * tx) <= 1.0] = 1.0
        out[i] = (np.clip(c, 0, 1) * 255).round()
    return out, y, cued


def strip288(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, w = 32, 288
    orders = list(itertools.permutations((2, 3, 4)))  # ring, square, disc
    y = rng.permutation(np.arange(n) % len(orders))
    cued = rng.random(n) < 0.5
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    out = np.empty((n, h, w, 3), np.uint8)
    for i in range(n):
        c = canvas(rng, h, w)
        spacing = rng.uniform(100, 110)
        x0 = rng.uniform(6, w - 7 - 2 * spacing)
        for j, k in enumerate(orders[y[i]]):
            c[glyph(yy, xx, h / 2 + rng.uniform(-6, 6), x0 + j * spacing + rng.uniform(-2, 2), k, 3.5)] = (
                CUE_COLOURS[y[i]] if cued[i] else grey(rng))
        out[i] = (np.clip(c, 0, 1) * 255).round()
    return out, y, cued


# name -> (design, images, epochs)
DESIGNS: dict[str, tuple[Design, int, int]] = {
    "layouts32": (layouts(LayoutConfig()), 1200, 5),
    "layouts64": (layouts(LayoutConfig(size=64, spacing=(12.0, 18.0), radius=4.0, jitter=1.6)), 1200, 6),
    "spread64": (layouts(LayoutConfig(size=64, spacing=(18.0, 24.0), radius=3.0, jitter=1.5)), 1600, 6),
    "pointer32": (pointer32, 1600, 6),
    "strip288": (strip288, 1200, 6),
}


def decision_layers(preds: np.ndarray, k: int) -> np.ndarray:
    """l*(k) per row by the definition (docs/design.md §7), a plain loop."""
    t = preds.shape[1] - 1
    return np.array([next((a for a in range(t - k + 1) if (row[a : a + k + 1] == row[a]).all()), t) for row in preds])


def measure(name: str, seed: int = 0) -> None:
    design, n, epochs = DESIGNS[name]
    start = time.perf_counter()
    images, y, cued = design(n, seed)
    prep = load_model("resnet18", weights="none", seed=seed).preprocessing  # seeds torch, as the demo does
    x = prep.normalize(torch.from_numpy(images).permute(0, 3, 1, 2).contiguous())
    order = np.random.default_rng(seed + 1).permutation(n)
    train, test = np.sort(order[: int(0.7 * n)]), np.sort(order[int(0.7 * n) :])
    model = fit_resnet18(x, torch.from_numpy(y).long(), torch.from_numpy(train), int(y.max()) + 1, epochs, seed,
                         progress=False)
    trained = time.perf_counter() - start
    with Tapper(model, resolve_anchors(model, PRESETS["resnet18"])) as tapper, torch.inference_mode():
        parts = [tapper.forward(x[i : i + 256]) for i in range(0, n, 256)]
    feats = [torch.cat([p[0][a] for p in parts]).numpy() for a in range(len(PRESETS["resnet18"]))]
    net = torch.cat([p[1] for p in parts]).argmax(1).numpy()
    preds = []
    for f in feats:
        scaler = StandardScaler().fit(f[train])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a capped lbfgs changes the last digit, not the picture
            clf = LogisticRegression(C=1.0, max_iter=200).fit(scaler.transform(f[train]), y[train])
        preds.append(clf.predict(scaler.transform(f[test])))
    p, yt, ct = np.stack(preds, 1), y[test], cued[test]
    lstar = decision_layers(p, 2)
    t = p.shape[1] - 1
    print(f"\n{name}: {n} images {images.shape[1]}x{images.shape[2]} px, {epochs} epochs, trained in {trained:.0f} s; "
          f"network test accuracy {np.mean(net[test] == yt):.3f}")
    print("  probe accuracy per anchor  " + " ".join(f"{a:>4d}" for a in range(t + 1)))
    for label, rows in (("cued", ct), ("uncued", ~ct)):
        print(f"  {label:<25s} " + " ".join(f"{v:.2f}" for v in (p[rows] == yt[rows, None]).mean(0)))
    for label, rows in (("all", np.ones_like(ct)), ("uncued", ~ct)):
        share = lstar[rows]
        print(f"  l*(2) {label:<7s} early {np.mean(share < 0.3 * t):.2f} late {np.mean(share >= 0.7 * t):.2f} "
              f"histogram {np.bincount(share, minlength=t + 1).tolist()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--designs", default=",".join(DESIGNS), help="comma-separated names")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name in args.designs.split(","):
        if name not in DESIGNS:
            parser.error(f"--designs: unknown {name!r}; use {', '.join(DESIGNS)}")
        measure(name, args.seed)


if __name__ == "__main__":
    main()
