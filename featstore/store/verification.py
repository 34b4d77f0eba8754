"""The store's integrity rules (`featstore verify`, `featstore info`'s damage marks): what the reader
(`featstore.store.reader.FeatureStore.verify`, `check_view`, `check_view_arrays`) has opened of a store is judged
here: each view's arrays against its model's config, every chunk marked done against the checksums its commit
recorded, the image labels against the head. The reader calls these functions with what it read; they read chunk
values from the Zarr arrays they are given, never call back into the reader, and write nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import zarr

from featstore.images.imagenet_val import foreign_wnid
from featstore.store.config import StoreConfig
from featstore.store.integrity import CHANGED, NO_CHECKSUM, UNREADABLE, Damage, brief, checksum
from featstore.store.rows import read_rows

REMAKE_VIEW = "featstore build makes the view again"


@dataclass(frozen=True)
class ChunkProblem:
    """Why one done chunk of one array cannot be trusted."""

    model: str
    view: str
    array: str
    chunk: int
    what: str

    def __str__(self) -> str:
        return f"{self.model}/{self.view}/{self.array} chunk {self.chunk}: {self.what}"


@dataclass(frozen=True)
class OpenedView:
    """What the reader opened of one view for the chunk check: the checksummed arrays by name (anchors, then
    logits), the `skipped` array (and its rows, None where they cannot all be read at once), the done bitmap, the
    keys listed under the view, the chunking, and the recorded checksums (None: not read, or none recorded)."""

    key: str
    view: str
    arrays: list[tuple[str, zarr.Array]]
    skipped: zarr.Array
    skipped_rows: np.ndarray | None
    done: np.ndarray
    listed: set[str]
    chunk_rows: int
    num_images: int
    checksums: np.ndarray | None


def chunk_problems(opened: OpenedView, deep: bool = True) -> list[ChunkProblem]:
    """Done chunks that cannot be trusted: a file missing, undecodable, values that differ from those its commit
    wrote (the chunk's checksums), or non-finite values in rows not marked skipped.

    `deep=False` only looks for missing files (in the listing the reader made); `deep=True` also reads every done
    chunk once (a chunk's arrays all at once). Chunks not marked done are not looked at: a build writes them
    anyway."""
    key, view, rows, n = opened.key, opened.view, opened.chunk_rows, opened.num_images
    present = {arr.path: {k for k in opened.listed if k.startswith(f"{arr.path}/")} for _, arr in opened.arrays}
    problems: list[ChunkProblem] = []
    for chunk in np.flatnonzero(opened.done).tolist():
        start, stop = chunk * rows, min(n, (chunk + 1) * rows)
        recorded = opened.checksums[chunk] if opened.checksums is not None else None
        try:
            skipped = (opened.skipped_rows[start:stop] if opened.skipped_rows is not None
                       else np.asarray(opened.skipped[start:stop], dtype=bool))
        except Exception as e:
            problems.append(ChunkProblem(key, view, "skipped", chunk, f"cannot be decoded ({brief(e)})"))
            continue
        if recorded is not None and recorded[-1] == UNREADABLE:
            problems.append(ChunkProblem(key, view, "checksums", chunk, "cannot be decoded"))
            continue
        if recorded is not None and NO_CHECKSUM != recorded[-1] != checksum(skipped):
            problems.append(ChunkProblem(key, view, "skipped", chunk, CHANGED))
            continue
        there = []
        for column, (name, arr) in enumerate(opened.arrays):
            if f"{arr.path}/{arr.metadata.encode_chunk_key((chunk, 0))}" in present[arr.path]:
                there.append((column, name, arr))
            elif not skipped.all():  # an all-skipped chunk equals the NaN fill value: zarr writes no file
                problems.append(ChunkProblem(key, view, name, chunk, "file missing"))
        if not deep:
            continue
        blocks = read_rows([arr for _, _, arr in there], start, stop, errors=True)
        changed, agreed = [], []
        for (column, name, _), block in zip(there, blocks, strict=True):
            if isinstance(block, BaseException):
                problems.append(ChunkProblem(key, view, name, chunk, f"cannot be decoded ({brief(block)})"))
                continue
            if recorded is not None and NO_CHECKSUM != recorded[column]:
                if recorded[column] != checksum(block):
                    changed.append(name)
                    continue
                agreed.append(name)
            bad_rows = np.flatnonzero(~np.isfinite(block).all(axis=1) & ~skipped)
            if len(bad_rows):
                problems.append(ChunkProblem(key, view, name, chunk, f"NaN or infinity in {len(bad_rows)} row(s) "
                                             f"not marked skipped (first: row {start + int(bad_rows[0])})"))
        problems += _blame(key, view, chunk, changed, agreed)
    return problems


def recorded_checksums(g: zarr.Group, columns: int) -> np.ndarray | None:
    """A view's recorded checksums, uint64 [n_chunks, columns] (UNREADABLE throughout a row that cannot be decoded
    or a table of the wrong shape), or None for a view written before checksums."""
    if "checksums" not in g:
        return None
    arr = g["checksums"]
    try:
        values = np.asarray(arr[:], dtype=np.uint64)
    except Exception:  # a damaged row: read them one by one
        values = np.zeros(arr.shape, dtype=np.uint64)
        for c in range(arr.shape[0]):
            try:
                values[c] = arr[c]
            except Exception:
                values[c] = UNREADABLE
    if values.shape[1:] != (columns,):
        return np.full((values.shape[0], columns), UNREADABLE, dtype=np.uint64)
    return values


def expected_arrays(cfg: StoreConfig, num_images: int, listed: list[str]) -> dict[str, tuple[tuple, tuple]]:
    """(shape, chunks) of every array a view of this config holds, by name; the checksums and image contents only
    where the view lists them (views made before they were recorded have none)."""
    n, rows, classes = num_images, cfg.chunk_rows, max(cfg.num_classes, 1)
    n_chunks = math.ceil(n / rows)
    expected = {f"anchors/{a.name}": ((n, a.dim), (rows, a.dim)) for a in cfg.anchors}
    expected |= {"logits": ((n, classes), (rows, classes)), "skipped": ((n,), (rows,)), "done": ((n_chunks,), (1,))}
    if "checksums" in listed:
        columns = len(cfg.anchors) + 2
        expected["checksums"] = ((n_chunks, columns), (1, columns))
    if "image_content" in listed:
        expected["image_content"] = ((n,), (rows,))
    return expected


def array_damage(base: str, expected: dict[str, tuple[tuple, tuple]],
                 opened: dict[str, zarr.Array | Exception]) -> list[Damage]:
    """The arrays of view `base` that are missing, unreadable, or of another shape or chunking than `expected`,
    given each as the reader opened it (or the exception opening it raised)."""
    damage = []
    for name, want in expected.items():
        arr = opened[name]
        try:
            if isinstance(arr, Exception):
                raise arr
            found = (tuple(arr.shape), tuple(arr.chunks))
        except KeyError:
            damage.append(Damage(f"{base}/{name}", "missing", REMAKE_VIEW))
            continue
        except Exception as e:
            damage.append(Damage(f"{base}/{name}", f"its metadata cannot be read ({brief(e)})", REMAKE_VIEW))
            continue
        if found != want:
            damage.append(Damage(f"{base}/{name}", f"shape {found[0]} in chunks of {found[1]}, where the "
                                 f"model's config gives {want[0]} in chunks of {want[1]}", REMAKE_VIEW))
    return damage


def rank_labels(attrs: dict | None, head_classes: Sequence[int]) -> Damage | None:
    """Labels that are ranks among the WNIDs the images carry where a 1000-way head (one of `head_classes`)
    predicts ImageNet-1k indices: a build before labels were checked read a labels file with a WNID outside
    ImageNet-1k (`n00000001`, a typo) that way, and every accuracy of the store is then scored wrongly. Told from
    the images attrs: folder-rank labels, class names all WNIDs, one (not all) outside ImageNet-1k. None for any
    other store, and where the attrs cannot be read (`attrs` None: the image table's damage says that)."""
    if attrs is None:
        return None
    names = attrs.get("class_names") or []
    if attrs.get("label_space", "folder-rank") != "folder-rank" or 1000 not in head_classes:
        return None
    foreign = foreign_wnid(names) if isinstance(names, list) and all(isinstance(c, str) for c in names) else None
    if foreign is None:
        return None
    return Damage("images/label", f"the labels are ranks among the {len(names)} WNIDs the images carry (one of "
                  f"them, {foreign}, no ImageNet-1k class), not the ImageNet-1k indices the store's 1000-way "
                  f"head predicts, so every accuracy scored against them is wrong",
                  f"fix the rows or the folder of {foreign}, then build a new store from them")


def _blame(key: str, view: str, chunk: int, changed: list[str], agreed: list[str]) -> list[ChunkProblem]:
    """Which arrays of a done chunk are really wrong. Most of them differing from the chunk's checksum row means
    the row is another commit's (a writer that lost its lease wrote its row and a few arrays over the chunk's
    commit): the arrays that agree with the row are that writer's, the others the commit's own."""
    if len(changed) <= len(agreed) or not agreed:
        return [ChunkProblem(key, view, name, chunk, CHANGED) for name in changed]
    stale = "written by another commit than the chunk's other arrays (the chunk's checksum row is that commit's)"
    return [ChunkProblem(key, view, "checksums", chunk, f"the row disagrees with {len(changed)} of "
                         f"{len(changed) + len(agreed)} arrays: another commit's, like {', '.join(agreed)}")] + \
        [ChunkProblem(key, view, name, chunk, stale) for name in agreed]
