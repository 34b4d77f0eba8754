"""The store's integrity check (`featstore verify`, `featstore info`'s damage marks): the image table, each model's
config, each view's arrays against its config, and every chunk marked done against the checksums its commit
recorded. One role of `FeatureStore` (`store.checks`), which delegates `verify`, `check_view` and
`check_view_arrays` here; it reads through the store and writes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import zarr

from featstore.errors import FeatstoreError
from featstore.store.integrity import CHANGED, NO_CHECKSUM, UNREADABLE, Damage, brief, checksum
from featstore.store.rows import read_rows

if TYPE_CHECKING:
    from featstore.store.reading import StoreReading

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



class StoreCheck:
    """What in one store cannot be trusted; every method lists problems, none raises for damage it can name."""

    def __init__(self, store: StoreReading):
        self.store = store

    def view_chunks(self, key: str, view: str, deep: bool = True) -> list[ChunkProblem]:
        """Done chunks that cannot be trusted: a file missing, undecodable, values that differ from those its
        commit wrote (the chunk's checksums), or non-finite values in rows not marked skipped.

        `deep=False` only looks for missing files (one listing of the view, through the Zarr store, so it holds
        on object storage too); `deep=True` also reads every done chunk once (a chunk's arrays all at once).
        Chunks not marked done are not looked at: a build writes them anyway."""
        store = self.store
        g = store.view_group(key, view)
        rows, n = store.chunk_rows(key), store.num_images
        with store.damage_is_one_line(f"the arrays of view {view!r} of {key!r}"):
            names = [f"anchors/{a.name}" for a in store.anchors(key)] + ["logits"]
            arrays = [(name, store.view_array(key, view, g, name)) for name in names]
            listed = store.location.keys(f"{g.path}/")
            present = {arr.path: {k for k in listed if k.startswith(f"{arr.path}/")} for _, arr in arrays}
            skipped_array = store.view_array(key, view, g, "skipped")
        try:  # every row at once; a damaged chunk is found below, chunk by chunk
            skipped_rows = store.read_skipped(key, view)
        except Exception:
            skipped_rows = None
        sums = self._checksums(g, len(arrays) + 1) if deep else None
        problems: list[ChunkProblem] = []
        for chunk in np.flatnonzero(store.done(key, view)).tolist():
            start, stop = chunk * rows, min(n, (chunk + 1) * rows)
            recorded = sums[chunk] if sums is not None else None
            try:
                skipped = (skipped_rows[start:stop] if skipped_rows is not None
                           else np.asarray(skipped_array[start:stop], dtype=bool))
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
            for column, (name, arr) in enumerate(arrays):
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

    def _checksums(self, g: zarr.Group, columns: int) -> np.ndarray | None:
        """The view's recorded checksums, uint64 [n_chunks, columns] (UNREADABLE throughout a row that cannot be
        decoded or a table of the wrong shape), or None for a view written before checksums."""
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

    def verify(self, key: str | None = None, deep: bool = True) -> list[ChunkProblem | Damage]:
        """Everything the store holds that cannot be trusted: the image table (`ImageTable.damage`), each model's
        config, each view's arrays (`view_arrays`) and, in the views whose arrays are sound, every done
        chunk (`view_chunks`). Groups are found by listing the storage, so a group whose metadata is garbage is
        reported, not skipped."""
        store = self.store
        problems: list[ChunkProblem | Damage] = list(store.image_rows.damage())
        if key is not None and key not in store.listed(""):
            store.model_attrs(key)  # an unknown model is a one-line error
        heads = []
        for k in [key] if key is not None else [k for k in store.listed("") if k != "images"]:
            try:
                heads.append(store.config(k).num_classes)
            except FeatstoreError as e:
                problems.append(Damage(k, f"its metadata cannot be read ({str(e.__cause__ or e)[:160]})",
                                       ""))
                continue
            for v in [v for v in store.views(k) if "done" in store.listed(f"{k}/{v}")]:
                damage = self.view_arrays(k, v)
                problems += damage if damage else self.view_chunks(k, v, deep)
        ranks = store.image_rows.rank_labels(heads)
        return problems + ([ranks] if ranks is not None else [])

    def view_arrays(self, key: str, view: str) -> list[Damage]:
        """The arrays a view must hold, each readable and of the shape and chunks its model's config gives (a
        view whose `done` bitmap was never written was interrupted while being created: a build makes it)."""
        store = self.store
        cfg, n = store.config(key), store.num_images
        rows, classes, n_chunks = cfg.chunk_rows, max(cfg.num_classes, 1), math.ceil(n / cfg.chunk_rows)
        expected = {f"anchors/{a.name}": ((n, a.dim), (rows, a.dim)) for a in cfg.anchors}
        expected |= {"logits": ((n, classes), (rows, classes)), "skipped": ((n,), (rows,)),
                     "done": ((n_chunks,), (1,))}
        base = f"{key}/{view}"
        listed = store.listed(base)
        if "done" not in listed:
            return []
        if "checksums" in listed:
            columns = len(cfg.anchors) + 2
            expected["checksums"] = ((n_chunks, columns), (1, columns))
        if "image_content" in listed:
            expected["image_content"] = ((n,), (rows,))
        try:
            g = store.root[key][view]
        except Exception as e:
            return [Damage(base, f"its metadata cannot be read ({brief(e)})", REMAKE_VIEW)]
        damage = []
        for name, want in expected.items():
            try:
                arr = store.view_array(key, view, g, name)
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
