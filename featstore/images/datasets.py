"""Image sets: an ImageFolder tree, or a flat folder plus a labels file (a filename,label CSV, or ImageNet's val
labels as they ship: `imagenet_val`), with stable image ids.

`image_id` is an image's rank in the sorted relative paths of the whole set, so ids stay the same when
`--limit` takes a subset. When every class (folder or labels-file name) is an ImageNet-1k WNID, labels are the
standard ImageNet-1k indices whatever subset of classes is present, so that they mean what a 1000-way head
predicts; `ImageSet.with_folder_ranks` gives the 0..n-1 ranks for a model with another head. Loading returns an
error string instead of raising, so that a corrupt file can be reported as one line (or skipped) by the main
process rather than as a worker traceback.
"""

from __future__ import annotations

import csv
import hashlib
import io
import posixpath
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from featstore.errors import FeatstoreError, FeatstoreWarning, Name
from featstore.images.files import IMAGE_EXTENSIONS
from featstore.images.imagenet_val import (
    DEVKIT_FILE,
    KAGGLE_FILE,
    devkit_labels,
    foreign_wnid,
    imagenet_wnids,
    kaggle_labels,
    labels_format,
    match_files,
)
from featstore.images.preprocessing import Preprocessing
from featstore.images.views import View

IMAGENET_CLASSES = 1000
_WNID = re.compile(r"n\d{8}")


@dataclass
class ImageSet:
    """The images of one dataset, sorted by image_id; labels index `class_names`."""

    root: Path
    image_ids: np.ndarray  # int64
    paths: list[str]  # relative to root, '/'-separated
    labels: np.ndarray  # int64
    class_names: list[str]
    source: str
    label_space: str = "folder-rank"  # or "imagenet-1k": labels are ImageNet-1k indices, class_names its WNIDs
    folder_classes: list[str] | None = None  # imagenet-1k: the sorted class names found, for `with_folder_ranks`

    def __len__(self) -> int:
        return len(self.paths)

    def fingerprint(self) -> str:
        """Identifies the image list: the same ids, paths and labels give the same string."""
        h = hashlib.sha256()
        for i, p, y in zip(self.image_ids.tolist(), self.paths, self.labels.tolist(), strict=True):
            h.update(f"{i}\t{p}\t{y}\n".encode())
        return h.hexdigest()[:32]

    def with_folder_ranks(self) -> ImageSet:
        """The same images labelled 0..n-1 by sorted class name (for a head that is not ImageNet-1k's)."""
        if self.folder_classes is None:
            return self
        rank = {name: i for i, name in enumerate(self.folder_classes)}
        to_rank = np.asarray([rank.get(name, -1) for name in self.class_names], dtype=np.int64)
        return ImageSet(self.root, self.image_ids, self.paths, to_rank[self.labels], self.folder_classes, self.source)


def imagenet_indices(class_names: Sequence[str]) -> list[int] | None:
    """Each name's ImageNet-1k index when every name is an ImageNet-1k WNID (timm ships the list), else None."""
    if not class_names or not all(_WNID.fullmatch(c) for c in class_names):
        return None
    index = {wnid: i for i, wnid in enumerate(imagenet_wnids())}
    if not all(c in index for c in class_names):
        return None
    return [index[c] for c in class_names]


def _to_imagenet(images: ImageSet) -> ImageSet:
    """WNID-named classes -> labels are ImageNet-1k indices and class_names the 1000 WNIDs."""
    indices = imagenet_indices(images.class_names)
    if indices is None:
        return images
    labels = np.asarray(indices, dtype=np.int64)[images.labels]
    return ImageSet(images.root, images.image_ids, images.paths, labels, list(imagenet_wnids()),
                    images.source, "imagenet-1k", images.class_names)


def _is_image(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS


def discover(root: str | Path, labels: str | Path | None = None, limit: int | None = None,
             seed: int = 0) -> ImageSet:
    """Find the images under `root` (an ImageFolder tree, or flat with a labels CSV)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FeatstoreError(f"image folder {root} does not exist; pass ",
                             Name("data"), " (an ImageFolder root or a flat folder)")
    if labels is not None:
        paths, ys, classes = _from_labels(root, Path(labels).expanduser())
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
            raise FeatstoreError("give a positive number of images", field="limit", value=limit)
        if limit < len(paths):
            keep = np.sort(np.random.default_rng(seed).choice(len(paths), size=limit, replace=False))
            ids, ys_arr = ids[keep], ys_arr[keep]
            paths = [paths[i] for i in keep]
    return _to_imagenet(ImageSet(root, ids, paths, ys_arr, classes, source))


def _from_tree(root: Path) -> tuple[list[str], list[int], list[str]]:
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise FeatstoreError(f"{root} has no class folders; give an ImageFolder tree (root/<class>/<image>) "
                             f"or a flat folder with ", Name("labels", "labels.csv"))
    paths: list[str] = []
    ys: list[int] = []
    for index, name in enumerate(classes):
        entries = sorted((root / name).rglob("*"))
        _check_symlinks(entries)
        files = [p for p in entries if _is_image(p)]
        if not files:
            raise FeatstoreError(f"class folder {root / name} has no images ({'/'.join(IMAGE_EXTENSIONS)}); "
                                 f"add images or remove the folder (class indices follow sorted folder order)")
        paths.extend(p.relative_to(root).as_posix() for p in files)
        ys.extend([index] * len(files))
    return paths, ys, classes


def _check_symlinks(entries: Sequence[Path]) -> None:
    """A symlink that loops or points nowhere would silently drop images: name it instead."""
    for p in entries:
        if not p.is_symlink():
            continue
        try:
            target = p.resolve(strict=True)
        except (OSError, RuntimeError) as e:  # RuntimeError: a loop, before Python 3.13
            if p.suffix.lower() in IMAGE_EXTENSIONS or "loop" in str(e).lower():
                raise FeatstoreError(f"{p} is a symlink that loops or points nowhere; remove it or point it at "
                                     f"an image") from e
            continue
        if target.is_dir() and (target == p.parent or target in p.parents):
            raise FeatstoreError(f"{p} is a symlink loop (it points at {target}, a folder above it); remove it")


_INDEX = re.compile(r"[+-]?[0-9]+", re.ASCII)
MAX_CLASSES = 100_000  # above any image classifier's head (ImageNet-21k: 21,843): a typo, not a class


def _read_labels_text(labels: Path) -> str:
    """UTF-8, with or without the byte-order mark that Excel writes; any other encoding is refused."""
    data = labels.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise FeatstoreError(f"labels file {labels} is not UTF-8 (byte 0x{data[e.start]:02x} on line {line}); "
                             f"save it as UTF-8 (CSV UTF-8 in Excel)") from e


def _normalised(labels: Path, line: int, name: str) -> str:
    """'./a.png', 'sub//a.png' -> the same relative posix path as the tree walk gives; outside paths refused."""
    norm = posixpath.normpath(name.replace("\\", "/"))
    if norm.startswith("/") or norm == ".." or norm.startswith("../"):
        raise FeatstoreError(f"labels file {labels} line {line}: {name!r} is outside the ", Name("data"),
                             " folder; give "
                             "paths relative to it")
    return norm


def _label_kind(labels: Path, body: list, raw: list[str]) -> bool:
    """True when the label column holds class indices, False for class names; a mix is refused."""
    is_index = [bool(_INDEX.fullmatch(v)) for v in raw]
    for (line, row), label, index in zip(body, raw, is_index, strict=True):
        if not label:
            raise FeatstoreError(f"labels file {labels} line {line}: no label for {row[0].strip()!r}; "
                                 f"write filename,label (an index or a class name such as a WNID)")
        if index != is_index[0]:
            first = body[0][0]
            raise FeatstoreError(
                f"labels file {labels} line {line} has label {label!r} but line {first} has {raw[0]!r}: the label "
                f"column must be all class indices (0, 1, ...) or all class names, not a mix")
    return is_index[0]


def _from_labels(root: Path, labels: Path) -> tuple[list[str], list[int], list[str]]:
    """A labels file of any format `--labels` takes: a filename,label CSV, or ImageNet's val labels as they ship
    (`featstore.images.imagenet_val`), told apart by content."""
    if not labels.is_file():
        raise FeatstoreError(f"labels file {labels} does not exist; pass a CSV with header filename,label (or "
                             f"ImageNet's {DEVKIT_FILE} or {KAGGLE_FILE})")
    text = _read_labels_text(labels)
    kind = labels_format(labels, text)
    if kind == "csv":
        return _from_csv(root, labels, text)
    listed = devkit_labels(labels, text) if kind == "devkit" else kaggle_labels(labels, text)
    found = match_files(root, labels, listed, _image_files(root))
    absent = [name for name in listed if name not in found]
    if absent:
        warnings.warn(MissingImages(f"lists {len(listed):,} images; {len(absent):,} of them are not in {root} (e.g. "
                                    f"{absent[0]!r}): the set is the {len(found):,} that are", field="labels",
                                    value=labels), stacklevel=4)
    names = [name for name in listed if name in found]
    classes = sorted({listed[name].wnid for name in names})
    index = {wnid: i for i, wnid in enumerate(classes)}
    paths = [found[name] for name in names]
    _left_out(root, labels, dict.fromkeys(paths, 0))
    return paths, [index[listed[name].wnid] for name in names], classes


def _image_files(root: Path) -> list[str]:
    """Every image file under `root`, relative and '/'-separated."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if _is_image(p))


def _from_csv(root: Path, labels: Path, text: str) -> tuple[list[str], list[int], list[str]]:
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise FeatstoreError(f"labels file {labels} is not a readable CSV ({e}); write lines filename,label") from e
    if not rows or [c.strip().lower() for c in rows[0][:2]] != ["filename", "label"]:
        raise FeatstoreError(f"labels file {labels} must start with the header line filename,label (or be "
                             f"ImageNet's {DEVKIT_FILE}, one class id per line, or {KAGGLE_FILE})")
    body = [(n, r) for n, r in enumerate(rows[1:], start=2) if r]
    if not body:
        raise FeatstoreError(f"labels file {labels} lists no images; add lines filename,label")
    raw = [r[1].strip() if len(r) > 1 else "" for _, r in body]
    if _label_kind(labels, body, raw):
        values = [int(v) for v in raw]
        for (line, _), value in zip(body, values, strict=True):
            if not 0 <= value < MAX_CLASSES:
                raise FeatstoreError(f"labels file {labels} line {line}: label {value} is not a class index "
                                     f"(0 <= index < {MAX_CLASSES:,}); fix the line")
        classes = [str(i) for i in range(max(values) + 1)]
    else:
        classes = sorted(set(raw))
        lookup = {name: i for i, name in enumerate(classes)}
        values = [lookup[v] for v in raw]
    paths: list[str] = []
    seen: dict[str, int] = {}
    for (line, row), _ in zip(body, raw, strict=True):
        name = _normalised(labels, line, row[0].strip())
        if not (root / name).is_file():
            raise FeatstoreError(f"labels file {labels} line {line} names {row[0].strip()!r}, which is not in "
                                 f"{root}; fix the line or add the file")
        if name in seen:
            raise FeatstoreError(f"labels file {labels} line {line} lists {name!r} a second time (first on line "
                                 f"{seen[name]}); keep one line")
        seen[name] = line
        paths.append(name)
    _left_out(root, labels, seen)
    return paths, values, classes


def labels_for_head(images: ImageSet, num_classes: int) -> ImageSet:
    """The one label rule of every command that scores images against a model's head (build, and through its
    store probe, cost and study; circuits; zoo): WNID classes keep their ImageNet-1k indices for a 1000-wide head
    and become the folder ranks 0..n-1 for any other head; WNID classes of which one is no ImageNet-1k class (a
    typo) are refused for a 1000-wide head, whose ranks would be read as ImageNet-1k indices; then every label must
    index the head, or the command refuses in one line (`check_labels`). The same images so always carry the same
    labels for the same head."""
    labelled = images if num_classes == IMAGENET_CLASSES else images.with_folder_ranks()
    foreign = foreign_wnid(labelled.class_names) if num_classes == IMAGENET_CLASSES else None
    if foreign is not None and labelled.label_space != "imagenet-1k":
        first = images.paths[int(np.argmax(np.asarray(images.class_names)[images.labels] == foreign))]
        raise FeatstoreError(f"class {foreign} (of {first}, {images.source}) is no ImageNet-1k class while the others "
                             f"are, so no label would be the ImageNet-1k index a 1000-way head predicts; fix its "
                             f"name (a typo?) or leave its images out")
    check_labels(labelled, num_classes)
    return labelled


class UnlabelledImages(FeatstoreWarning):
    """Image files of the --data folder that its labels file does not list: they are left out of the set."""


class MissingImages(FeatstoreWarning):
    """Images ImageNet's val labels list (all 50,000) that the --data folder does not hold: the set is those it
    holds (a subset of the val images is a set of its own)."""


def _left_out(root: Path, labels: Path, listed: dict[str, int]) -> None:
    """Say how many images of `root` the labels file leaves out (naming one): a labels file may select a subset,
    but a silently shorter image set looks like a complete one."""
    unlisted = [path for path in _image_files(root) if path not in listed]
    if unlisted:
        warnings.warn(UnlabelledImages(f"lists {len(listed)} images; {len(unlisted)} other image file(s) in {root} "
                                       f"are left out (e.g. {unlisted[0]!r}); add them to the file if they belong to "
                                       f"the set", field="labels", value=labels), stacklevel=4)


def check_labels(images: ImageSet, num_classes: int) -> None:
    """Labels must index the model's classes, or probe accuracy and 'correct' mean nothing."""
    if num_classes and len(images) and int(images.labels.max()) >= num_classes:
        bad = int(np.argmax(images.labels >= num_classes))
        raise FeatstoreError(
            f"{images.paths[bad]} has label {int(images.labels[bad])} but the model has {num_classes} classes "
            f"({images.source}); fix the labels or use a model with that many classes")


def integer_range(im: Image.Image) -> int | None:
    """The largest value an integer-mode image's file can hold, from the bits it declares per sample: 65535 for
    16-bit files (PNG, and PGM/PPM, which PIL scales to 16 bits), 2**bits - 1 for 8- and 16-bit TIFFs; None where
    the file does not say (a 32-bit integer TIFF without a MaxSampleValue tag: whether 0..255, 0..4095 or the full
    32 bits are meant is unknown)."""
    if im.mode.startswith("I;16"):
        return 65535
    if im.format in ("PNG", "PPM"):  # PIL reads 16-bit PNGs (before Pillow 10.?) and PGMs as mode I
        return 65535
    if im.format == "TIFF":
        tags = getattr(im, "tag_v2", {})
        declared = tags.get(281) or tags.get(341)  # MaxSampleValue, SMaxSampleValue: a range the file states
        declared = max(declared) if isinstance(declared, tuple) and declared else declared
        if isinstance(declared, int | float) and declared >= 1:
            return int(declared)
        bits = tags.get(258)
        bits = max(bits) if isinstance(bits, tuple) and bits else bits
        if bits in (8, 16):
            return 2**bits - 1
    return None


def to_rgb(im: Image.Image) -> Image.Image:
    """8-bit RGB from the image's real range: PIL's own convert("RGB") clips 16-bit values at 255 (a 16-bit
    grey PNG turns white) and truncates floats in [0, 1] to 0 (black); integer images are scaled by the range
    their file declares (`integer_range`), never by a guess. Ranges that cannot be known are refused."""
    if im.mode.startswith("I;16") or im.mode == "I":
        pixels = np.asarray(im).astype(np.int64)
        top = integer_range(im)
        shown = f"values {pixels.min()}..{pixels.max()}" if pixels.size else "no pixels"
        if top is None:
            bits = getattr(im, "tag_v2", {}).get(258)
            raise ValueError(f"{im.format or ''} {im.mode} image of {bits[0] if isinstance(bits, tuple) else 32}-bit "
                             f"integers ({shown}): its range is unknown; convert it to 8- or 16-bit".lstrip())
        if pixels.size and (pixels.min() < 0 or pixels.max() > top):
            raise ValueError(f"{im.mode} image with {shown} outside the 0..{top} its file declares; convert it to "
                             f"8- or 16-bit")
        return Image.fromarray(np.round(pixels / (top / 255.0)).astype(np.uint8)).convert("RGB")
    if im.mode == "F":
        pixels = np.asarray(im, dtype=np.float64)
        if pixels.size and not (np.isfinite(pixels).all() and pixels.min() >= 0 and pixels.max() <= 1):
            raise ValueError(f"float image with values {np.nanmin(pixels):.4g}..{np.nanmax(pixels):.4g} outside "
                             f"[0, 1]; its range is unknown: convert it to 8-bit")
        return Image.fromarray(np.round(pixels * 255.0).astype(np.uint8)).convert("RGB")
    return im.convert("RGB")


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
                cropped = self.prep.crop_uint8(to_rgb(im))
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
