"""The Zarr v3 feature store's reader (docs/design.md §4): images, then per model and view one float16 array per
anchor. What `fs.open_store` wraps; it writes nothing (the writer, `featstore.store.writer.StoreWriter`, is this
class with the writing methods, for builds, repairs and probes).

docs/store.md is the layout (groups, arrays, shapes, attrs), checked against a store built by this code in
tests/test_docs.py. The writer's `commit_chunk` is the one function that writes a chunk and then marks it done, so
a chunk that is marked done is always complete (zarr's LocalStore writes each file atomically, and an object
store's PUT is atomic). Where the store lives, a folder or an object-store URL, is `featstore.store.location`'s
affair. Each commit also records a checksum of every array's values (`featstore.store.integrity`), so that
`verify` finds a chunk whose content changed since, and the image table carries its own checksums: `verify`
covers everything a store holds, and `build` repairs what it can recompute (`featstore.store.repair`).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import zarr
from zarr.core.sync import sync

from featstore.errors import FeatstoreError
from featstore.records import ModelSource
from featstore.store.config import StoreConfig
from featstore.store.integrity import NO_CHECKSUM, UNREADABLE, Damage, checksum, text_checksum
from featstore.store.location import StoreLocation

if TYPE_CHECKING:  # reading a store's metadata (`featstore info`) loads no torch
    from featstore.images.datasets import ImageSet
    from featstore.nets.anchors import Anchor

FORMAT = 1
HEAD = "head"  # <model>/head: the classifier's weight [C, D] and bias [C], float32 (`write_head`)
MODEL_PARTS = ("probes", HEAD)  # groups of a model that are no view
VERSION = re.compile(r"v\d{8}T\d{6}-[0-9a-f]{8}")  # a saved probe version's name (`new_probe_version`)


def new_probe_version() -> str:
    """A new saved version's name: the time it was begun, then 8 random hex digits."""
    return time.strftime("v%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:8]


@dataclass(frozen=True)
class ProbeVersion:
    """One saved version of a model's probe: <key>/probes/<name>/<version>, the database whose runs it was saved
    for (None: not recorded) and whether the probe's `current` points at it."""

    key: str
    name: str
    version: str
    owner: str | None
    current: bool

    def __str__(self) -> str:
        return f"{self.key}/probes/{self.name}/{self.version}"
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def model_key(name: str) -> str:
    """A model name as a store group name: 'timm/vit_base_patch16_224' -> 'timm_vit_base_patch16_224'."""
    key = name.replace("/", "_")
    if not _KEY.match(key):
        raise FeatstoreError(f"{name!r} cannot name a store group; use `name` with letters, digits, _ . -")
    return key


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


T = TypeVar("T")
IMAGE_ARRAYS = ("image_id", "label", "path")
REWRITE_IMAGES = "featstore build rewrites it from --data"
REMAKE_VIEW = "featstore build makes the view again"
CHANGED = "values differ from those its commit wrote (checksum)"


class FeatureStore:
    """A featstore Zarr store, on local disk or object storage (`path`: a folder, file:// or s3://... URL)."""

    _mode = "r"  # the writer's is "a": it may create the store
    _memo: dict | None = None  # what `one_reading` has read, while it lasts

    def __init__(self, path: str | Path | StoreLocation):
        mode = self._mode
        self.location = StoreLocation.parse(path)
        if mode == "r" and not self.location.has_store():
            raise FeatstoreError(f"no featstore store at {self.location}; build one with `featstore build`")
        self.location.check_usable()
        try:
            # a new store is created with its format attr in its first zarr.json: another build starting at the
            # same moment never sees a root without it
            self.root = zarr.open_group(self.location.zarr_store(read_only=mode == "r"), mode=mode,
                                        **({} if mode == "r" else {"attributes": {"featstore_format": FORMAT}}))
        except Exception as e:
            raise FeatstoreError(f"cannot open {self.location} as a Zarr v3 store ({type(e).__name__}: "
                                 f"{_brief(e)}); point `store` at a featstore store or a new path") from e
        fmt = self.root.attrs.get("featstore_format")
        if fmt is None and mode != "r" and not list(self.root.keys()):
            self.root.attrs["featstore_format"] = FORMAT
        elif fmt != FORMAT:
            raise FeatstoreError(f"{self.location} is not a featstore store (format {fmt!r}); use a new `store` path")

    # -- images -------------------------------------------------------------------------------------

    def has_images(self) -> bool:
        """True once the image list is complete (its fingerprint attr is written last)."""
        with self.damage_is_one_line("images/zarr.json"):
            return "images" in self.root and "fingerprint" in self.root["images"].attrs

    def check_images(self, images: ImageSet) -> None:
        attrs = dict(self.root["images"].attrs)
        space = attrs.get("label_space", "folder-rank")
        if attrs.get("fingerprint") != images.fingerprint() and space != images.label_space:
            raise FeatstoreError(
                f"store {self.location} labels its images as {space} classes, but this model's head needs "
                f"{images.label_space} labels (ImageNet-1k indices only fit a 1000-way head); use a new `store`")
        if attrs.get("fingerprint") != images.fingerprint():
            raise FeatstoreError(
                f"store {self.location} holds a different image list ({attrs.get('count')} images from "
                f"{attrs.get('source')}) than {images.source} ({len(images)} images); use the same `data`, "
                f"`labels` and `limit`, or a new `store`")

    def image_table(self) -> dict[str, np.ndarray]:
        """The image ids, paths and labels, as written: a table that is damaged is refused, never read as zeros."""
        table, damage = self._image_table()
        if damage:
            raise FeatstoreError(f"store {self.location} is damaged: {damage[0]}; rerun `featstore build` with the "
                                 f"same `data` to rewrite the image table")
        return table

    def check_images_table(self) -> list[Damage]:
        """What cannot be trusted in the image table: an array that cannot be read, has the wrong length, or whose
        values differ from those written (their checksums, in the images attrs)."""
        return self._image_table()[1]

    def _image_table(self) -> tuple[dict[str, np.ndarray], list[Damage]]:
        try:
            g, attrs = self.root["images"], self.image_attrs()
            n, sums = int(attrs["count"]), attrs.get("checksums", {})
        except Exception as e:
            return {}, [Damage("images", f"metadata cannot be read ({_brief(e)})", REWRITE_IMAGES)]
        table, damage = {}, []
        for name in IMAGE_ARRAYS:
            where = f"images/{name}"
            try:
                values = np.asarray(g[name][:], dtype=object if name == "path" else None)
            except Exception as e:
                damage.append(Damage(where, f"cannot be read ({_brief(e)})", REWRITE_IMAGES))
                continue
            found = text_checksum(values) if name == "path" else checksum(values.astype(np.int64))
            if values.shape != (n,):
                damage.append(Damage(where, f"holds {values.shape} values for {n} images", REWRITE_IMAGES))
            elif name in sums and int(sums[name], 16) != found:
                damage.append(Damage(where, "values differ from those written (checksum)", REWRITE_IMAGES))
            table[name] = values
        return table, damage

    def image_attrs(self) -> dict:
        with self.damage_is_one_line("images"):
            return dict(self.root["images"].attrs)

    @property
    def num_images(self) -> int:
        with self.damage_is_one_line("images"):
            return int(self.root["images"].attrs["count"])

    @contextmanager
    def damage_is_one_line(self, where: str) -> Iterator[None]:
        """Metadata that cannot be read (a garbage zarr.json, a removed group) as one line naming it, not a
        traceback from Zarr."""
        try:
            yield
        except FeatstoreError:
            raise
        except Exception as e:
            raise FeatstoreError(f"store {self.location} is damaged: {where} cannot be read ({_brief(e)}); "
                                 f"`featstore verify` lists the damage, and `featstore build` repairs what it can "
                                 f"recompute") from e

    # -- models and views ---------------------------------------------------------------------------

    def models(self) -> list[str]:
        """The model groups, as the storage lists them: one whose metadata is damaged is still named."""
        with self.damage_is_one_line("the store's listing"):
            return [k for k in self.listed("") if k != "images"]

    @contextmanager
    def one_reading(self) -> Iterator[None]:
        """Within it, the model listing, a model's attributes, a view's group, its arrays, done bitmap and skipped
        rows are read once: a summary (`info`) asks for them dozens of times, each a metadata read (about a
        millisecond on local disk, a round trip on object storage). Outside it every call reads afresh, as a
        store another job is writing must be read. Nested, the outer reading's lasts."""
        if self._memo is not None:
            yield
            return
        self._memo = {}
        try:
            yield
        finally:
            self._memo = None

    def _once(self, what: tuple, read: Callable[[], T]) -> T:
        if self._memo is None:
            return read()
        if what not in self._memo:
            self._memo[what] = read()
        return self._memo[what]

    def model_attrs(self, key: str) -> dict:
        return dict(self._once(("attrs", key), lambda: self._read_model_attrs(key)))

    def _read_model_attrs(self, key: str) -> dict:
        models = self._once(("models",), self.models)
        if key not in models:
            have = ", ".join(models) or "none"
            raise FeatstoreError(f"store {self.location} has no model {key!r} (it has: {have}); "
                                 f"build it with `featstore build --model {key}`")
        with self.damage_is_one_line(f"{key}/zarr.json"):
            return dict(self.root[key].attrs)

    def config(self, key: str) -> StoreConfig:
        """What the model group was built with (read through `StoreConfig.from_dict`, which knows older shapes)."""
        attrs = self.model_attrs(key)
        with self.damage_is_one_line(f"the config of {key!r} ({key}/zarr.json)"):
            return StoreConfig.from_dict(attrs["config"])

    def anchors(self, key: str) -> list[Anchor]:
        return list(self.config(key).anchors)

    def source(self, key: str) -> ModelSource:
        """How this store identifies a model's rows (its image table's checksums, the weights, the anchors): what a
        database records with the model, and refuses a probe of another store for."""
        attrs, cfg = self.image_attrs(), self.config(key)
        sums = attrs.get("checksums") or {}
        images = "/".join(f"{k}={sums[k]}" for k in sorted(sums)) or str(attrs.get("fingerprint", ""))
        return ModelSource(key, str(self.location), images, cfg.weights_id,
                           " ".join(f"{a.name}:{a.dim}" for a in cfg.anchors))

    def views(self, key: str) -> list[str]:
        """The view groups of a model (a folder there that is not a Zarr group, say someone's `notes/`, is not
        one: `foreign` names those)."""
        with self.damage_is_one_line(f"the views of {key!r}"):
            return [k for k in self.listed(key) if k not in MODEL_PARTS and self._is_node(f"{key}/{k}")]

    def foreign(self, key: str) -> list[str]:
        """What a model group holds that featstore did not write: entries that are not Zarr nodes (no zarr.json),
        ignored by every command and named by `featstore info`."""
        with self.damage_is_one_line(f"the listing of {key!r}"):
            return [k for k in self.listed(key) if k not in MODEL_PARTS and not self._is_node(f"{key}/{k}")]

    def _is_node(self, path: str) -> bool:
        return bool(sync(self.root.store.exists(f"{path}/zarr.json")))

    def view_group(self, key: str, view: str) -> zarr.Group:
        return self._once(("view", key, view), lambda: self._open_view(key, view))

    def _open_view(self, key: str, view: str) -> zarr.Group:
        self.model_attrs(key)
        with self.damage_is_one_line(f"view {view!r} of {key!r}"):
            if view not in self.root[key] or "done" not in self.root[key][view]:
                have = ", ".join(self.views(key)) or "none"
                raise FeatstoreError(f"store {self.location} has no view {view!r} of {key!r} (it has: {have}); "
                                     f"build it with `featstore build --views {view}`")
            return self.root[key][view]

    def _view_array(self, key: str, view: str, g: zarr.Group, name: str) -> zarr.Array:
        """Array `name` ("logits", "anchors/<anchor>") of view group g, opened once within `one_reading`."""
        return self._once(("array", key, view, name), lambda: g[name])

    def chunk_rows(self, key: str) -> int:
        return self.config(key).chunk_rows

    def done(self, key: str, view: str) -> np.ndarray:
        """The commit bitmap; an entry whose file cannot be decoded counts as not done (it is made again)."""
        return self._once(("done", key, view), lambda: self._read_done(key, view)).copy()

    def _read_done(self, key: str, view: str) -> np.ndarray:
        bitmap = self.view_group(key, view)["done"]
        try:
            return np.asarray(bitmap[:], dtype=bool)
        except Exception:  # a damaged entry: read them one by one
            return np.array([_decodes(bitmap, c) for c in range(bitmap.shape[0])], dtype=bool)

    def check_view(self, key: str, view: str, deep: bool = True) -> list[ChunkProblem]:
        """Done chunks that cannot be trusted: a file missing, undecodable, values that differ from those its
        commit wrote (the chunk's checksums), or non-finite values in rows not marked skipped.

        `deep=False` only looks for missing files (one listing of the view, through the Zarr store, so it holds
        on object storage too); `deep=True` also reads every done chunk once (a chunk's arrays all at once).
        Chunks not marked done are not looked at: a build writes them anyway."""
        g = self.view_group(key, view)
        rows, n = self.chunk_rows(key), self.num_images
        with self.damage_is_one_line(f"the arrays of view {view!r} of {key!r}"):
            names = [f"anchors/{a.name}" for a in self.anchors(key)] + ["logits"]
            arrays = [(name, self._view_array(key, view, g, name)) for name in names]
            listed = self.location.keys(f"{g.path}/")
            present = {arr.path: {k for k in listed if k.startswith(f"{arr.path}/")} for _, arr in arrays}
            skipped_array = self._view_array(key, view, g, "skipped")
        try:  # every row at once; a damaged chunk is found below, chunk by chunk
            skipped_rows = self.read_skipped(key, view)
        except Exception:
            skipped_rows = None
        sums = self._checksums(g, len(arrays) + 1) if deep else None
        problems: list[ChunkProblem] = []
        for chunk in np.flatnonzero(self.done(key, view)).tolist():
            start, stop = chunk * rows, min(n, (chunk + 1) * rows)
            recorded = sums[chunk] if sums is not None else None
            try:
                skipped = (skipped_rows[start:stop] if skipped_rows is not None
                           else np.asarray(skipped_array[start:stop], dtype=bool))
            except Exception as e:
                problems.append(ChunkProblem(key, view, "skipped", chunk, f"cannot be decoded ({_brief(e)})"))
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
                    problems.append(ChunkProblem(key, view, name, chunk, f"cannot be decoded ({_brief(block)})"))
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
        """Everything the store holds that cannot be trusted: the image table (`check_images_table`), each model's
        config, each view's arrays (`check_view_arrays`) and, in the views whose arrays are sound, every done
        chunk (`check_view`). Groups are found by listing the storage, so a group whose metadata is garbage is
        reported, not skipped."""
        problems: list[ChunkProblem | Damage] = list(self.check_images_table())
        if key is not None and key not in self.listed(""):
            self.model_attrs(key)  # an unknown model is a one-line error
        for k in [key] if key is not None else [k for k in self.listed("") if k != "images"]:
            try:
                self.config(k)
            except FeatstoreError as e:
                problems.append(Damage(k, f"its metadata cannot be read ({str(e.__cause__ or e)[:160]})",
                                       ""))
                continue
            for v in [v for v in self.views(k) if "done" in self.listed(f"{k}/{v}")]:
                damage = self.check_view_arrays(k, v)
                problems += damage if damage else self.check_view(k, v, deep)
        return problems

    def check_view_arrays(self, key: str, view: str) -> list[Damage]:
        """The arrays a view must hold, each readable and of the shape and chunks its model's config gives (a
        view whose `done` bitmap was never written was interrupted while being created: a build makes it)."""
        cfg, n = self.config(key), self.num_images
        rows, classes, n_chunks = cfg.chunk_rows, max(cfg.num_classes, 1), math.ceil(n / cfg.chunk_rows)
        expected = {f"anchors/{a.name}": ((n, a.dim), (rows, a.dim)) for a in cfg.anchors}
        expected |= {"logits": ((n, classes), (rows, classes)), "skipped": ((n,), (rows,)),
                     "done": ((n_chunks,), (1,))}
        base = f"{key}/{view}"
        listed = self.listed(base)
        if "done" not in listed:
            return []
        if "checksums" in listed:
            columns = len(cfg.anchors) + 2
            expected["checksums"] = ((n_chunks, columns), (1, columns))
        if "image_content" in listed:
            expected["image_content"] = ((n,), (rows,))
        try:
            g = self.root[key][view]
        except Exception as e:
            return [Damage(base, f"its metadata cannot be read ({_brief(e)})", REMAKE_VIEW)]
        damage = []
        for name, want in expected.items():
            try:
                arr = self._view_array(key, view, g, name)
                found = (tuple(arr.shape), tuple(arr.chunks))
            except KeyError:
                damage.append(Damage(f"{base}/{name}", "missing", REMAKE_VIEW))
                continue
            except Exception as e:
                damage.append(Damage(f"{base}/{name}", f"its metadata cannot be read ({_brief(e)})", REMAKE_VIEW))
                continue
            if found != want:
                damage.append(Damage(f"{base}/{name}", f"shape {found[0]} in chunks of {found[1]}, where the "
                                     f"model's config gives {want[0]} in chunks of {want[1]}", REMAKE_VIEW))
        return damage

    def listed(self, prefix: str) -> list[str]:
        """The names directly under `prefix`, as the storage lists them (no metadata is parsed)."""
        from zarr.core.sync import sync

        async def names() -> list[str]:
            return [k async for k in self.root.store.list_dir(prefix)]

        return sorted(n for n in sync(names()) if n != "zarr.json" and not n.startswith("."))

    def image_stats(self, contents: bool = True) -> np.ndarray | None:
        """The image files as the store was built from them (`featstore.store.integrity.image_stats`), or None where the
        store does not record them (built before it did, or the record cannot be read). With `contents`, a content
        checksum missing from `images/stat` is taken from the views' `image_content`, where a build's loader
        recorded it."""
        try:
            stats = np.asarray(self.root["images"]["stat"][:], dtype=np.int64)
        except Exception:
            return None
        for key in self.models() if contents else []:
            for view in self.views(key):
                if not (stats[:, 2] == 0).any():
                    return stats
                try:
                    content = np.asarray(self.root[key][view]["image_content"][:], dtype=np.int64)
                except Exception:  # a view made before contents were recorded, or damaged: it records none
                    continue
                if content.shape == stats[:, 2].shape:
                    stats[:, 2] = np.where(stats[:, 2] == 0, content, stats[:, 2])
        return stats

    def threads_used(self, key: str, view: str) -> list[int]:
        """The CPU thread counts the done chunks of a view were computed with ([] for a GPU build, or a view made
        before they were recorded); float sums split over other counts can differ in the last bits."""
        g = self.view_group(key, view)
        if "threads" not in g:
            return []
        counts = np.asarray(g["threads"][:])[self.done(key, view)]
        return sorted(int(c) for c in np.unique(counts) if c > 0)

    def read(self, key: str, view: str, anchor: str, rows: slice = slice(None)) -> np.ndarray:
        return self.view_group(key, view)["anchors"][anchor][rows]

    def read_logits(self, key: str, view: str, rows: slice = slice(None)) -> np.ndarray:
        return self.view_group(key, view)["logits"][rows]

    def read_skipped(self, key: str, view: str) -> np.ndarray:
        """Which rows of a view were skipped (read once within `one_reading`: `info` and `check_view` both ask)."""
        g = self.view_group(key, view)
        return self._once(("skipped", key, view),
                          lambda: np.asarray(self._view_array(key, view, g, "skipped")[:], dtype=bool)).copy()

    # -- the model's head ---------------------------------------------------------------------------

    def read_head(self, key: str) -> tuple[np.ndarray, np.ndarray, str] | None:
        """(weight [C, D], bias [C], module) of the model's classifier, or None for a store built before heads
        were kept (or a model without a Linear head); values that differ from those written are refused."""
        self.model_attrs(key)
        if HEAD not in self.listed(key):
            return None
        with self.damage_is_one_line(f"{key}/{HEAD}"):
            g = self.root[key][HEAD]
            attrs = dict(g.attrs)
            if "checksums" not in attrs:  # interrupted while being written
                return None
            weight, bias = np.asarray(g["weight"][:]), np.asarray(g["bias"][:])
        for name, values in (("weight", weight), ("bias", bias)):
            if int(attrs["checksums"][name], 16) != checksum(values):
                raise FeatstoreError(f"store {self.location} is damaged: {key}/{HEAD}/{name} {CHANGED}; rerun the "
                                     f"same `featstore build` to write the head again")
        return weight, bias, str(attrs.get("module", ""))

    def has_head(self, key: str) -> bool:
        """True when the model's classifier is kept (complete), whatever its values (`read_head` checks them)."""
        try:
            return HEAD in self.listed(key) and "checksums" in self.root[key][HEAD].attrs
        except Exception:
            return False

    # -- probes -------------------------------------------------------------------------------------

    def probe_versions(self, key: str) -> list[ProbeVersion]:
        """Every saved version of every probe of a model (listed; each version's attrs read for its owner)."""
        found = []
        if "probes" not in self.listed(key):
            return found
        for name in self.listed(f"{key}/probes"):
            try:
                current = self.root[key]["probes"][name].attrs.get("current")
            except Exception:  # unreadable metadata: a version of it is current as far as anyone can tell
                current = None
            for version in self.listed(f"{key}/probes/{name}"):
                if not VERSION.fullmatch(version):  # a store before versions kept one set of anchors here
                    continue
                try:
                    owner = dict(self.root[key]["probes"][name][version].attrs).get("database")
                except Exception:  # interrupted before its metadata was written
                    owner = None
                found.append(ProbeVersion(key, name, version, owner, version == current))
        return found

    def probe_version_exists(self, key: str, name: str, version: str) -> bool:
        """True when <model>/probes/<name>/<version> holds weights (listed, no metadata parsed)."""
        try:
            return bool(self.listed(f"{key}/probes/{name}/{version}"))
        except Exception:
            return False

    # -- summary ------------------------------------------------------------------------------------

    def info(self) -> dict:
        """What the store holds: images, and per model its anchors and each view's completeness."""
        with self.one_reading():
            return self._info()

    def _info(self) -> dict:
        out: dict = {"path": str(self.location), "images": None, "models": {}}
        damage = self.check_images_table()
        if damage:  # what `verify` would say first, in place of what cannot be read
            out["images"] = {"damaged": str(damage[0])}
        elif self.has_images():
            a = self.image_attrs()
            present = len(np.unique(self.root["images"]["label"][:]))
            out["images"] = {"count": a.get("count"), "classes": present, "source": a.get("source"),
                             "label_space": a.get("label_space", "folder-rank")}
        for key in self.models():
            try:
                out["models"][key] = self._model_info(key)
            except FeatstoreError as e:
                out["models"][key] = {"damaged": str(e)}
        return out

    def _model_info(self, key: str) -> dict:
        attrs = self.model_attrs(key)
        cfg = self.config(key)
        views = {}
        for v in self.views(key):
            damage = self.check_view_arrays(key, v)
            if damage:
                views[v] = {"damaged": str(damage[0])}
                continue
            if "done" not in self.root[key][v]:
                continue
            done = self.done(key, v)
            views[v] = {"chunks_done": int(done.sum()), "chunks": int(done.size),
                        "skipped": int(self.read_skipped(key, v).sum()), "threads": self.threads_used(key, v),
                        "damaged_chunks": sorted({p.chunk for p in self.check_view(key, v, deep=False)})}
        with self.damage_is_one_line(f"{key}/probes"):
            probes = sorted(self.listed(f"{key}/probes")) if "probes" in self.listed(key) else []
        return {
            "model": cfg.model, "weights": cfg.weights_id,
            "published_top1": _published_top1(cfg.weights_id),
            "preprocessing": None if cfg.preprocessing is None else cfg.preprocessing.to_dict(),
            "token_pool": cfg.token_pool, "num_classes": cfg.num_classes, "chunk_rows": cfg.chunk_rows,
            "anchors": [(a.index, a.name, a.module, a.dim) for a in cfg.anchors],
            "views": views, "probes": probes, "versions": attrs.get("versions", {}),
            **({"foreign": foreign} if (foreign := self.foreign(key)) else {}),
        }


def _published_top1(weights_id: str) -> float | None:
    """The published top-1 of a library's weights; only those load the library (its weight table), so that
    `featstore info` on a store of other weights reads metadata alone."""
    if not weights_id.startswith(("torchvision:", "timm:")):
        return None
    from featstore.nets.models import published_top1

    return published_top1(weights_id)


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


def read_rows(arrays: Sequence[zarr.Array], start: int, stop: int, errors: bool = False) -> list:
    """Rows [start, stop) of every array, all read at once: one request each, all in flight together (object
    storage answers each after a round trip; local disk decodes them in parallel). `errors=True` returns a
    failed read's exception in its place instead of raising it."""

    async def all_at_once() -> list:
        return await asyncio.gather(*[a.async_array.getitem((slice(start, stop),)) for a in arrays],
                                    return_exceptions=errors)

    return [b if isinstance(b, BaseException) else np.asarray(b) for b in sync(all_at_once())]


def _decodes(array: zarr.Array, index: int) -> bool:
    try:
        return bool(array[index])
    except Exception:
        return False


def _brief(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:160]


