"""ImageNet's validation labels as they ship, read into one WNID per image.

- The devkit's `ILSVRC2012_validation_ground_truth.txt`: line i holds the ILSVRC2012_ID of image
  `ILSVRC2012_val_<i, 8 digits>`; the ids follow the devkit's own class order, which its `meta.mat` (read from
  beside the file) maps to WNIDs: the synsets with no children, ILSVRC2012_ID 1..1000.
- Kaggle's `LOC_val_solution.csv`: `ImageId,PredictionString`, the string a WNID and a box (`x y x y`) per
  object, every object of a val image of its one class.

The WNIDs then become the ImageNet-1k indices of torchvision's and timm's 1,000-way heads (sorted-WNID order,
`datasets._to_imagenet`), never the devkit's ids: a devkit id written into a `filename,label` CSV labels every
image wrongly. Which format a file is comes from its content; a file named as one format that reads as another,
and anything that could mean two labels, is refused in one line before anything is written.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import io
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featstore.errors import FeatstoreError, Name
from featstore.images.files import IMAGE_EXTENSIONS

DEVKIT_FILE = "ILSVRC2012_validation_ground_truth.txt"
KAGGLE_FILE = "LOC_val_solution.csv"
META_FILE = "meta.mat"
KAGGLE_HEADER = ["imageid", "predictionstring"]
FORMATS = {"csv": "a filename,label CSV", "devkit": f"the devkit's {DEVKIT_FILE}", "kaggle": f"Kaggle's {KAGGLE_FILE}"}
_ID = re.compile(r"[0-9]+", re.ASCII)
_WNID = re.compile(r"n\d{8}", re.ASCII)
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


@functools.cache
def imagenet_wnids() -> tuple[str, ...]:
    """The 1,000 WNIDs of ImageNet-1k in the order of torchvision's and timm's heads (sorted), from the list timm
    ships, read as a file so that `featstore info` (which checks a store's labels against it) loads no torch."""
    spec = importlib.util.find_spec("timm")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        listed = Path(folder) / "data" / "_info" / "imagenet_synsets.txt"
        if listed.is_file():
            return tuple(listed.read_text().split())
    from timm.data import ImageNetInfo  # a timm that keeps the list elsewhere

    return tuple(ImageNetInfo().label_names())


@functools.cache
def _imagenet_classes() -> frozenset[str]:
    return frozenset(imagenet_wnids())


def check_imagenet_wnid(labels: Path, line: int, wnid: str, where: str = "") -> None:
    """A label file ImageNet ships names ImageNet-1k classes only: any other WNID (a typo) is refused with its line,
    or every label would become a rank among the WNIDs present, which a 1000-way head does not predict."""
    if wnid not in _imagenet_classes():
        raise FeatstoreError(f"labels file {labels} line {line}: WNID {wnid}{where} is no ImageNet-1k class (none of "
                             f"the 1,000 a 1000-way head predicts); fix the line")


def foreign_wnid(class_names: Sequence[str]) -> str | None:
    """The first class name that is no ImageNet-1k WNID, where every name is a WNID and some are ImageNet-1k's: a
    set of ImageNet classes with a typo among them (`n00000001`), whose labels, as ranks among the names present,
    would be scored against a 1000-way head that predicts ImageNet-1k indices; None otherwise."""
    names = list(class_names)
    if not names or not all(_WNID.fullmatch(c) for c in names):
        return None
    foreign = [c for c in names if c not in _imagenet_classes()]
    return foreign[0] if foreign and len(foreign) < len(names) else None


@dataclass(frozen=True)
class ListedLabel:
    """One image a shipped labels file lists: its WNID, and the file's line that says so (named in errors)."""

    wnid: str
    line: int


def labels_format(labels: Path, text: str) -> str:
    """'kaggle' (header ImageId,PredictionString), 'devkit' (one whole number per line) or 'csv' (anything else:
    the filename,label reader judges it), from the content; a file named as one of ImageNet's that reads as
    another format is refused."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and [c.strip().lower() for c in lines[0].split(",")] == KAGGLE_HEADER:
        kind = "kaggle"
    elif lines and all(_ID.fullmatch(line) for line in lines):
        kind = "devkit"
    else:
        kind = "csv"
    named = {DEVKIT_FILE.lower(): "devkit", KAGGLE_FILE.lower(): "kaggle"}.get(labels.name.lower())
    if named is not None and named != kind:
        raise FeatstoreError(f"labels file {labels} is named as {FORMATS[named]} but reads as {FORMATS[kind]}: "
                             f"pass the file ImageNet ships, or rename this one")
    return kind


def devkit_labels(labels: Path, text: str) -> dict[str, ListedLabel]:
    """Image name (without extension) -> its WNID, from the devkit's ground truth and the meta.mat beside it."""
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    wnid_of = meta_wnids(labels.parent / META_FILE, labels)
    listed: dict[str, ListedLabel] = {}
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            raise FeatstoreError(f"labels file {labels} line {number} is empty: line i holds image i's id, so a "
                                 f"missing line would shift every label after it; restore the devkit's file")
        ident = int(raw.strip())
        if ident not in wnid_of:
            raise FeatstoreError(f"labels file {labels} line {number}: ILSVRC2012_ID {ident} is no class of "
                                 f"{labels.parent / META_FILE} (its classes: ids {min(wnid_of)}..{max(wnid_of)}); "
                                 f"use the meta.mat of the same devkit")
        check_imagenet_wnid(labels, number, wnid_of[ident], f" (ILSVRC2012_ID {ident} in {labels.parent / META_FILE})")
        listed[f"ILSVRC2012_val_{number:08d}"] = ListedLabel(wnid_of[ident], number)
    return listed


def meta_wnids(meta: Path, labels: Path) -> dict[int, str]:
    """ILSVRC2012_ID -> WNID of the devkit's classes (its synsets without children), read with scipy."""
    if not meta.is_file():
        raise FeatstoreError(f"labels file {labels} is the devkit's ground truth, whose ids follow the devkit's own "
                             f"class order: put the devkit's {META_FILE} beside it ({meta}; the devkit's data/ "
                             f"folder holds both), which maps them to WNIDs")
    try:
        from scipy.io import loadmat
    except ImportError:
        raise FeatstoreError(f"reading {meta} needs scipy: pip install scipy") from None
    try:
        synsets = np.atleast_1d(loadmat(str(meta), squeeze_me=True)["synsets"])
    except Exception as e:  # scipy raises many types for a file that is not MATLAB's
        raise FeatstoreError(f"{meta} is not the devkit's meta.mat ({type(e).__name__}: {str(e)[:120]}); use "
                             f"ILSVRC2012_devkit_t12/data/meta.mat") from None
    fields = {"ILSVRC2012_ID", "WNID", "num_children"}
    if not fields <= set(synsets.dtype.names or ()):
        raise FeatstoreError(f"{meta}: its synsets lack {', '.join(sorted(fields - set(synsets.dtype.names or ())))}; "
                             f"use the devkit's meta.mat")
    wnid_of: dict[int, str] = {}
    for synset in synsets:
        if int(synset["num_children"]) != 0:
            continue  # an inner node of the hierarchy, no class
        ident, wnid = int(synset["ILSVRC2012_ID"]), str(synset["WNID"])
        if not _WNID.fullmatch(wnid) or ident in wnid_of or wnid in wnid_of.values():
            raise FeatstoreError(f"{meta}: synset ILSVRC2012_ID {ident}, WNID {wnid!r} is malformed or given "
                                 f"twice; use the devkit's meta.mat")
        wnid_of[ident] = wnid
    if not wnid_of:
        raise FeatstoreError(f"{meta} holds no class (no synset without children); use the devkit's meta.mat")
    return wnid_of


def kaggle_labels(labels: Path, text: str) -> dict[str, ListedLabel]:
    """ImageId -> its WNID, from Kaggle's LOC_val_solution.csv; an image whose boxes name two classes is refused."""
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise FeatstoreError(f"labels file {labels} is not a readable CSV ({e}); pass Kaggle's {KAGGLE_FILE}") from e
    listed: dict[str, ListedLabel] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        image, objects = _image_name(row[0].strip()), (row[1].split() if len(row) == 2 else [])
        if not image or not _boxes(objects):
            raise FeatstoreError(f"labels file {labels} line {line}: write ImageId,PredictionString with a WNID and "
                                 f"four box coordinates per object ('n01751748 12 30 200 180'), not {','.join(row)!r}")
        wnids = sorted(set(objects[::5]))
        if len(wnids) > 1:
            raise FeatstoreError(f"labels file {labels} line {line}: image {image} has boxes of {len(wnids)} classes "
                                 f"({', '.join(wnids)}), so its label is ambiguous; keep one class per image")
        check_imagenet_wnid(labels, line, wnids[0])
        if image in listed:
            raise FeatstoreError(f"labels file {labels} line {line} lists {image} a second time (first on line "
                                 f"{listed[image].line}); keep one line")
        listed[image] = ListedLabel(wnids[0], line)
    if not listed:
        raise FeatstoreError(f"labels file {labels} lists no images; add lines ImageId,PredictionString")
    return listed


def _image_name(image_id: str) -> str:
    """An ImageId as Kaggle ships it (`ILSVRC2012_val_00000001`), or with its file's extension
    (`ILSVRC2012_val_00000001.JPEG`): the image's name without the extension, as files are matched by."""
    stem, extension = posixpath.splitext(image_id)
    return stem if stem and extension.lower() in IMAGE_EXTENSIONS else image_id


def _boxes(objects: list[str]) -> bool:
    """Whether a PredictionString's words are objects of five: a WNID, then four numbers (x y x y)."""
    return bool(objects) and len(objects) % 5 == 0 and all(
        _WNID.fullmatch(objects[i]) and all(_NUMBER.fullmatch(v) for v in objects[i + 1: i + 5])
        for i in range(0, len(objects), 5))


def match_files(root: Path, labels: Path, listed: dict[str, ListedLabel], files: list[str]) -> dict[str, str]:
    """Image name -> its file under `root` (relative, '/'-separated), for the listed names that have a file; two
    files of one listed name (a.JPEG and a.png) are refused, as are lists of which no file is there."""
    found: dict[str, str] = {}
    for path in files:
        name = posixpath.splitext(posixpath.basename(path))[0]
        if name not in listed:
            continue
        if name in found:
            raise FeatstoreError(f"{root} holds {found[name]!r} and {path!r}, both image {name} of labels file "
                                 f"{labels}: which one it labels is ambiguous; keep one")
        found[name] = path
    if not found:
        example = next(iter(listed))
        raise FeatstoreError(f"labels file {labels} lists {len(listed):,} images and none of them is in {root} "
                             f"(e.g. {example}.JPEG); pass the folder that holds them as ", Name("data"))
    return found
