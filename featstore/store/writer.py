"""The store's writer (internal): what builds, repairs and probes change in a store. `StoreWriter` is the reader
(`featstore.store.reader.FeatureStore`) opened for writing, with the methods that create groups, commit chunks,
undo them, keep the head and keep probes (their layout: `featstore.store.probes`); `fs.open_store` never hands one
out.

`commit_chunk` is the one function that writes a chunk and then marks it done (every writer calls it); before
each write it runs `guard`, the lock check a build sets (`featstore.store.location.StoreLocation.writer_lock`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from featstore.errors import FeatstoreError, Name
from featstore.images.datasets import ImageSet
from featstore.nets.anchors import Anchor
from featstore.store.config import StoreConfig
from featstore.store.integrity import NO_CHECKSUM, STAT_COLUMNS, brief, checksum, text_checksum
from featstore.store.location import StoreLocation
from featstore.store.probes import PROBES
from featstore.store.reader import HEAD, FeatureStore
from featstore.store.zarr_loop import settle, sync, together


@dataclass
class ChunkData:
    """Everything one view of one chunk writes: rows [start, stop) of each array."""

    chunk: int
    features: list[np.ndarray]  # per anchor, float16 [rows, C]
    logits: np.ndarray  # float16 [rows, classes]
    skipped: np.ndarray  # bool [rows]
    threads: int = 0  # CPU threads its forward ran with (0: not on the CPU)
    content: np.ndarray | None = None  # int64 [rows]: each image file's content checksum as the loader read it


@dataclass(frozen=True)
class _CommitTargets:
    """The arrays a view's commits write, opened once per build (each open reads metadata from the storage):
    the anchors, logits and skipped flags (checksummed, in that order), then the bookkeeping arrays, and the rows
    of a chunk."""

    rows: int
    values: list[zarr.Array]
    threads: zarr.Array | None
    checksums: zarr.Array | None
    content: zarr.Array | None
    done: zarr.Array


class StoreWriter(FeatureStore):
    """A store opened for writing (created when it is not there yet); see the module docstring."""

    _mode = "a"

    def __init__(self, path: str | Path | StoreLocation):
        super().__init__(path)
        self.guard: Callable[[], None] | None = None  # a writer's lock check, run before each commit
        self._targets: dict[tuple[str, str], _CommitTargets] = {}
        self._targets_lock = threading.Lock()  # commits run on several writer threads at once

    def write_images(self, images: ImageSet, stats: np.ndarray | None = None) -> None:
        """Write the image table (and, given, the files' `stats`: `record_image_stats`). Its attrs go last, in one
        write: until their fingerprint is there the table is unfinished, and a build makes it again."""
        n = len(images)
        g = self.root.require_group("images")
        chunk = (max(1, min(n, 1 << 16)),)
        g.create_array("image_id", shape=(n,), chunks=chunk, dtype="int64", overwrite=True)[:] = images.image_ids
        g.create_array("label", shape=(n,), chunks=chunk, dtype="int64", overwrite=True)[:] = images.labels
        g.create_array("path", shape=(n,), chunks=chunk, dtype=str, overwrite=True)[:] = np.asarray(images.paths)
        if stats is not None:
            self.record_image_stats(stats)
        sums = {"image_id": checksum(np.asarray(images.image_ids, dtype=np.int64)),
                "label": checksum(np.asarray(images.labels, dtype=np.int64)), "path": text_checksum(images.paths)}
        g.attrs.put({"source": images.source, "root": str(images.root.resolve()),
                     "class_names": images.class_names, "label_space": images.label_space, "count": n,
                     "fingerprint": images.fingerprint(), "checksums": {k: f"{v:016x}" for k, v in sums.items()}})

    def prepare_model(self, key: str, config: StoreConfig, versions: dict) -> None:
        """Create the model group, or check that an existing one was built with the same config."""
        try:
            if key in self.listed("") and "config" not in self.root[key].attrs:
                self.delete(key)  # interrupted while being created: nothing in it was committed
        except Exception as e:
            raise FeatstoreError(f"store {self.location} is damaged: the metadata of model {key!r} ({key}/zarr.json) "
                                 f"cannot be read ({brief(e)}), so what built its arrays is unknown and build "
                                 f"cannot repair it; remove {key} from the store and build it again, or use a new ",
                                 Name("store")) from e
        if key in self.listed(""):
            diff = self.config(key).differences(config)
            if diff:
                raise FeatstoreError(
                    f"store {self.location} already holds {key!r} built with a different {', '.join(diff)}; "
                    f"rebuild with the same settings, pass ", Name("name"), " to store this config beside it, or use a "
                    "new ", Name("store"))
            return
        # its attrs in the group's one metadata write: a model group is never there without its config
        self.root.create_group(key, attributes={"config": config.to_dict(), "versions": versions})

    def prepare_view(self, key: str, view: dict, anchors: Sequence[Anchor], num_classes: int,
                     chunk_rows: int, logits_dtype: str = "float16") -> None:
        """Create a view's arrays (NaN-filled) and its all-False done bitmap, unless they exist. The group carries
        the view's attrs from its first write; the bitmap is written last: a view without it is made again."""
        g = self.root[key]
        if view["name"] in g and "done" in g[view["name"]]:
            return
        if view["name"] in g:
            del g[view["name"]]  # interrupted while its arrays were being created: make it again
        n = self.num_images
        vg = g.create_group(view["name"], attributes=view)
        ag = vg.create_group("anchors")

        # every array's metadata at once (each a write; on object storage a PUT)
        widths = [(ag, a.name, a.dim, a.dtype) for a in anchors] + [(vg, "logits", max(num_classes, 1), logits_dtype)]
        together([group._async_group.create_array(name, shape=(n, dim), chunks=(chunk_rows, dim), dtype=dtype,
                                                  fill_value=np.nan) for group, name, dim, dtype in widths])
        vg.create_array("skipped", shape=(n,), chunks=(chunk_rows,), dtype="bool", fill_value=False)
        vg.create_array("threads", shape=(math.ceil(n / chunk_rows),), chunks=(1,), dtype="int16", fill_value=0)
        _create_checksums(vg, math.ceil(n / chunk_rows), anchors)
        _create_image_content(vg, n, chunk_rows)
        # the bitmap last: a view without it was interrupted while being created and is made again
        vg.create_array("done", shape=(math.ceil(n / chunk_rows),), chunks=(1,), dtype="bool", fill_value=False)

    def upgrade_view(self, key: str, view: str) -> None:
        """Give a view of a store written before checksums (or before image contents were recorded) its empty
        arrays for them: the chunks committed from now on carry theirs."""
        g = self.view_group(key, view)
        if "checksums" not in g:
            _create_checksums(g, g["done"].shape[0], self.anchors(key))
        if "image_content" not in g:
            _create_image_content(g, self.num_images, self.chunk_rows(key))

    def delete(self, path: str) -> None:
        """Remove a group or array and everything under it, without reading its metadata (which may be garbage)."""
        with self._targets_lock:
            self._targets.clear()
        sync(self.root.store.delete_dir(path))

    def record_image_stats(self, stats: np.ndarray) -> None:
        """Record the image files' stats (`images/stat`). Its `columns` attr is written after its values: a record
        without it was interrupted and counts as none (`FeatureStore.image_stats`), never as files of size 0."""
        g = self.root["images"]
        stat = g.create_array("stat", shape=stats.shape, chunks=(max(1, min(len(stats), 1 << 16)), 3), dtype="int64",
                              overwrite=True)
        stat[:] = stats
        stat.attrs.put({"columns": list(STAT_COLUMNS)})

    def undo_rows(self, rows: np.ndarray) -> None:
        """Mark every chunk holding one of `rows` not done, in every model and view of the store."""
        for key in self.models():
            chunks = sorted({int(r) // self.chunk_rows(key) for r in np.asarray(rows).tolist()})
            for view in self.views(key):
                if "done" in self.root[key][view]:
                    self.undo_chunks(key, view, chunks)

    def undo_chunks(self, key: str, view: str, chunks: Sequence[int]) -> None:
        """Mark chunks not done, so that the next build writes them again."""
        bitmap = self.view_group(key, view)["done"]
        for c in chunks:
            bitmap[c] = False

    def _commit_targets(self, key: str, view: str) -> _CommitTargets:
        with self._targets_lock:
            if (key, view) not in self._targets:
                g = self.root[key][view]
                # feature chunks are never all fill value (NaN): zarr's scan for one before each write is skipped
                eager = {"write_empty_chunks": True}
                values = [g["anchors"][a.name].with_config(eager) for a in self.anchors(key)]
                values += [g["logits"].with_config(eager), g["skipped"]]
                self._targets[(key, view)] = _CommitTargets(
                    self.chunk_rows(key), values,
                    g["threads"] if "threads" in g else None,  # views made before thread counts: none
                    g["checksums"] if "checksums" in g else None,
                    g["image_content"].with_config(eager) if "image_content" in g else None, g["done"])
            return self._targets[(key, view)]

    def commit_chunk(self, key: str, view: str, data: ChunkData) -> None:
        """Write one chunk of every array of a view, then mark it done: the store's only commit point. Safe to call
        for different chunks from several threads at once."""
        targets = self._commit_targets(key, view)
        start = data.chunk * targets.rows
        stop = start + len(data.skipped)
        if len(targets.values) - 2 != len(data.features):
            raise ValueError(f"chunk {data.chunk} holds {len(data.features)} anchors, the store "
                             f"{len(targets.values) - 2}")
        values = [*data.features, data.logits, data.skipped]
        writes = list(zip(targets.values, values, strict=True))
        if targets.content is not None and data.content is not None:
            writes.append((targets.content, data.content))

        guard = self.guard or (lambda: None)  # a build that lost (or may have lost) its lease writes nothing more

        async def write(target: zarr.Array, value: np.ndarray) -> None:
            guard()  # checked before each PUT, not only at the commit point: a build paused past its lease's
            await target.async_array.setitem((slice(start, stop),), value)  # expiry never writes over the new holder's

        sums = np.asarray([checksum(np.asarray(v, dtype=t.dtype)) for t, v in zip(targets.values, values,
                                                                                  strict=True)],
                          dtype=np.uint64)  # the values as they decode, each in its array's type
        guard()
        together([write(t, v) for t, v in writes])  # every array at once (each a PUT on object storage)
        guard()
        if targets.threads is not None:
            targets.threads[data.chunk] = data.threads
        if targets.checksums is not None:
            guard()
            targets.checksums[data.chunk] = sums
        guard()
        targets.done[data.chunk] = True

    def write_head(self, key: str, weight: np.ndarray, bias: np.ndarray, module: str,
                   reading: tuple[dict, dict[str, np.ndarray]] | None = None) -> None:
        """Keep the classifier (the model's last Linear, `module`) beside the model's metadata: weight [C, D] and
        bias [C] float32, with their checksums in the group's attrs (written last: they mark it complete), so a
        readout through the head (`head-probe`, `tuned-lens`) never runs the network again. `reading`: the final
        norm and each anchor's role (`featstore.nets.head_norm.head_reading`), its arrays kept and checksummed
        beside the head's."""
        g = self.root[key].require_group(HEAD)
        arrays = {"weight": weight, "bias": bias, **(reading[1] if reading is not None else {})}
        for name, values in arrays.items():
            g.create_array(name, shape=values.shape, chunks=values.shape, dtype="float32",
                           overwrite=True)[:] = np.asarray(values, dtype=np.float32)
        g.attrs.put({"module": module, **({"reading": reading[0]} if reading is not None else {}), "checksums": {
            name: f"{checksum(np.asarray(v, dtype=np.float32)):016x}" for name, v in arrays.items()}})

    def write_probe(self, key: str, name: str, anchor: str, arrays: dict[str, np.ndarray], attrs: dict,
                    version: str, owner: dict | None = None) -> None:
        """Save what one anchor's probe keeps, one array per name with folds first, under
        <model>/probes/<name>/<version>/<anchor>/: bool stays bool, uint8 (a pickle's bytes) stays bytes, every other
        array is float32. Nothing reads them until `make_probe_current` names that version. `owner` (the database and
        split whose runs name the version) goes into the version group's attrs."""
        probe = self.root[key].require_group(PROBES).require_group(name)
        if version not in probe:  # with its owner in one write: a version is never left without one
            probe.create_group(version, attributes=owner or {})
        vg = probe[version]
        if owner and dict(vg.attrs) != owner:
            vg.attrs.put(owner)
        g = vg.require_group(anchor)
        for array, values in arrays.items():
            dtype = "bool" if values.dtype == bool else "uint8" if values.dtype == np.uint8 else "float32"
            g.create_array(array, shape=values.shape, chunks=values.shape, dtype=dtype, overwrite=True)[:] = values
        g.attrs.put(attrs)

    def make_probe_current(self, key: str, name: str, version: str, retired: Sequence[str] = ()) -> None:
        """Point <model>/probes/<name> at `version` (one attrs file, written atomically), then drop the `retired`
        versions: those the committing database named before and names no more. Called after the database committed
        the rows of that version, so a failure before leaves the old pair. Versions other jobs wrote (other
        databases, other views of the one-job-per-view pattern) are never touched: each job's version name is its
        own."""
        g = self.root[key][PROBES][name]
        g.attrs["current"] = version
        present = {k for k, _ in g.groups()}
        for other in retired:
            if other != version and other in present:
                del g[other]

    def discard_probe_version(self, key: str, name: str, version: str) -> None:
        """Remove a version that never became current (its database transaction failed, or Ctrl-C came while its
        arrays were written: those writes end first, `settle`)."""
        settle()
        try:
            g = self.root[key][PROBES][name]
        except KeyError:
            return
        if version in g and g.attrs.get("current") != version:
            del g[version]

def _create_image_content(g: zarr.Group, n: int, chunk_rows: int) -> None:
    """Each image's file content checksum as the build's loader read it (0: not recorded), one chunk per view
    chunk, written by that chunk's commit (`featstore.store.integrity.changed_images` reads it)."""
    g.create_array("image_content", shape=(n,), chunks=(chunk_rows,), dtype="int64", fill_value=0, overwrite=True)


def _create_checksums(g: zarr.Group, n_chunks: int, anchors: Sequence[Anchor]) -> None:
    names = [f"anchors/{a.name}" for a in anchors] + ["logits", "skipped"]
    g.create_array("checksums", shape=(n_chunks, len(names)), chunks=(1, len(names)), dtype="uint64",
                   fill_value=NO_CHECKSUM, overwrite=True, attributes={"arrays": names})
