"""Image sets: an ImageFolder tree or a flat folder plus a labels CSV, with stable image ids.

`image_id` is an image's rank in the sorted relative paths of the whole set, so ids stay the same when
`--limit` takes a subset. Loading returns an error string instead of raising, so that a corrupt file can be
reported as one line (or skipped) by the main process rather than as a worker traceback.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from featstore.errors import FeatstoreError
from featstore.preprocessing import Preprocessing
from featstore.views import View

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass
class ImageSet:
    """The images of one dataset, sorted by image_id; labels index `class_names`."""

    root: Path
    image_ids: np.ndarray  # int64
    paths: list[str]  # relative to root, '/'-separated
    labels: np.ndarray  # int64
    class_names: list[str]
    source: str

    def __len__(self) -> int:
        return len(self.paths)

    def fingerprint(self) -> str:
        """Identifies the image list: the same ids, paths and labels give the same string."""
        h = hashlib.sha256()
        for i, p, y in zip(self.image_ids.tolist(), self.paths, self.labels.tolist(), strict=True):
            h.update(f"{i}\t{p}\t{y}\n".encode())
        return h.hexdigest()[:32]


def _is_image(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS


def discover(root: str | Path, labels: str | Path | None = None, limit: int | None = None,
             seed: int = 0) -> ImageSet:
    """Find the images under `root` (an ImageFolder tree, or flat with a labels CSV)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FeatstoreError(f"image folder {root} does not exist; pass --data <ImageFolder root or flat folder>")
    if labels is not None:
        paths, ys, classes = _from_csv(root, Path(labels).expanduser())
        source = f"flat folder {root} with labels {labels}"
    else:
        paths, ys, classes = _from_tree(root)
        source = f"ImageFolder {root}"
    order = sorted(range(len(paths)), key=paths.__getitem__)
    ids = np.arange(len(paths), dtype=np.int64)
    paths = [paths[i] for i in order]
    ys_arr = np.asarray([ys[i] for i in order], dtype=np.int64)
    if limit is not None:
        if limit <= 0:
            raise FeatstoreError(f"--limit {limit}: give a positive number of images")
        if limit < len(paths):
            keep = np.sort(np.random.default_rng(seed).choice(len(paths), size=limit, replace=False))
            ids, ys_arr = ids[keep], ys_arr[keep]
            paths = [paths[i] for i in keep]
    return ImageSet(root, ids, paths, ys_arr, classes, source)


def _from_tree(root: Path) -> tuple[list[str], list[int], list[str]]:
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise FeatstoreError(f"{root} has no class folders; give an ImageFolder tree (root/<class>/<image>) "
                             f"or a flat folder with --labels labels.csv")
    paths: list[str] = []
    ys: list[int] = []
    for index, name in enumerate(classes):
        files = sorted(p for p in (root / name).rglob("*") if _is_image(p))
        if not files:
            raise FeatstoreError(f"class folder {root / name} has no images ({'/'.join(IMAGE_EXTENSIONS)}); "
                                 f"add images or remove the folder (class indices follow sorted folder order)")
        paths.extend(p.relative_to(root).as_posix() for p in files)
        ys.extend([index] * len(files))
    return paths, ys, classes


def _from_csv(root: Path, labels: Path) -> tuple[list[str], list[int], list[str]]:
    if not labels.is_file():
        raise FeatstoreError(f"labels file {labels} does not exist; pass a CSV with header filename,label")
    with labels.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows or [c.strip().lower() for c in rows[0][:2]] != ["filename", "label"]:
        raise FeatstoreError(f"labels file {labels} must start with the header line filename,label")
    body = [(n, r) for n, r in enumerate(rows[1:], start=2) if r]
    if not body:
        raise FeatstoreError(f"labels file {labels} lists no images; add lines filename,label")
    raw = [r[1].strip() if len(r) > 1 else "" for _, r in body]
    as_index = all(v.isdigit() for v in raw)
    classes = sorted(set(raw), key=int) if as_index else sorted(set(raw))
    if as_index:
        classes = [str(i) for i in range(int(classes[-1]) + 1)]
    lookup = {name: i for i, name in enumerate(classes)}
    paths: list[str] = []
    ys: list[int] = []
    seen: set[str] = set()
    for (line, row), label in zip(body, raw, strict=True):
        name = row[0].strip()
        if not label:
            raise FeatstoreError(f"labels file {labels} line {line}: no label for {name!r}; "
                                 f"write filename,label (an index or a class name such as a WNID)")
        if not (root / name).is_file():
            raise FeatstoreError(f"labels file {labels} line {line} names {name!r}, which is not in {root}; "
                                 f"fix the line or add the file")
        if name in seen:
            raise FeatstoreError(f"labels file {labels} line {line} lists {name!r} a second time; keep one line")
        seen.add(name)
        paths.append(Path(name).as_posix())
        ys.append(lookup[label])
    return paths, ys, classes


def check_labels(images: ImageSet, num_classes: int) -> None:
    """Labels must index the model's classes, or probe accuracy and 'correct' mean nothing."""
    if num_classes and len(images) and int(images.labels.max()) >= num_classes:
        bad = int(np.argmax(images.labels >= num_classes))
        raise FeatstoreError(
            f"{images.paths[bad]} has label {int(images.labels[bad])} but the model has {num_classes} classes "
            f"({images.source}); fix the labels or use a model with that many classes")


class ViewDataset(torch.utils.data.Dataset):
    """Decodes each image once and returns every requested view of it."""

    def __init__(self, images: ImageSet, prep: Preprocessing, views: Sequence[View]):
        self.images, self.prep, self.views = images, prep, list(views)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, row: int) -> tuple[int, list[torch.Tensor] | None, str | None]:
        path = self.images.root / self.images.paths[row]
        try:
            with Image.open(path) as im:
                cropped = self.prep.crop_uint8(im.convert("RGB"))
        except Exception as e:  # PIL raises many types for bad files
            return row, None, f"{type(e).__name__}: {e}"
        image_id = int(self.images.image_ids[row])
        return row, [v.apply(cropped, image_id) for v in self.views], None


def collate(items: list) -> tuple[list[int], list[torch.Tensor | None], list[str | None]]:
    """Stack views across images; a failed image becomes a zero image plus its error string."""
    rows = [r for r, _, _ in items]
    errors = [e for _, _, e in items]
    good = next((v for _, v, _ in items if v is not None), None)
    if good is None:
        return rows, [None], errors
    stacked = []
    for k, ref in enumerate(good):
        stacked.append(torch.stack([v[k] if v is not None else torch.zeros_like(ref) for _, v, _ in items]))
    return rows, stacked, errors
