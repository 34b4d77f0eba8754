"""The Zarr v3 feature store's reader (docs/design.md §4): images, then per model and view one array per anchor.
`FeatureStore` is the one class that reads a store, what `fs.open_store` wraps; it writes nothing (the writer,
`featstore.store.writer.StoreWriter`, is this class with the writing methods, for builds, repairs and probes).

It reads the models, their configs and views, the stored rows, the head, the image table (its checksums checked
as it reads), the probes kept (`featstore.store.probes`: their layout and records) and what the store holds
(`info()`, a `featstore.store.summary.StoreInfo`), with the memo of `one_reading`. Its integrity check (`verify`,
`check_view`, `check_view_arrays`) opens what a check needs and hands it to `featstore.store.verification`, whose
rules judge it without calling back here.

docs/store.md is the layout (groups, arrays, shapes, attrs), checked against a store built by this code in
tests/test_docs.py. The writer's `commit_chunk` is the one function that writes a chunk and then marks it done, so
a chunk that is marked done is always complete (zarr's LocalStore writes each file atomically, and an object
store's PUT is atomic). Where the store lives, a folder or an object-store URL, is `featstore.store.location`'s
affair. Each commit also records a checksum of every array's values (`featstore.store.integrity`), so that
`verify` finds a chunk whose content changed since, and the image table carries its own checksums: `verify`
covers everything a store holds, and `build` repairs what it can recompute (`featstore.store.repair`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import zarr

from featstore.errors import FeatstoreError, FeatstoreTypeError, Name, Step
from featstore.records import ModelSource
from featstore.store.config import StoreConfig
from featstore.store.integrity import (
    CHANGED,
    IMAGE_ARRAYS,
    REWRITE_IMAGES,
    UNFINISHED,
    Damage,
    brief,
    checksum,
    text_checksum,
)
from featstore.store.location import StoreLocation, zarr_temporary
from featstore.store.probes import (
    GROUP_NAME,
    PROBES,
    VERSION,
    ProbeVersion,
    StoredAnchor,
    StoredProbe,
    new_probe_version,
)
from featstore.store.rows import decodes, read_rows
from featstore.store.summary import (
    AnchorInfo,
    Damaged,
    ImagesInfo,
    ModelInfo,
    StoreInfo,
    ViewInfo,
    published_top1_of,
)
from featstore.store.verification import (
    REMAKE_VIEW,
    ChunkProblem,
    OpenedView,
    array_damage,
    chunk_problems,
    expected_arrays,
    rank_labels,
    recorded_checksums,
)
from featstore.store.zarr_loop import sync

if TYPE_CHECKING:  # reading a store's metadata (`featstore info`) loads no torch
    from featstore.images.datasets import ImageSet
    from featstore.nets.anchors import Anchor

# the names other modules import from here (defined in the modules of the store's records)
__all__ = ["HEAD", "ChunkProblem", "FeatureStore", "ProbeVersion", "StoreInfo", "StoredProbe", "model_key",
           "new_probe_version", "read_rows"]

FORMAT = 1
HEAD = "head"  # <model>/head: the classifier's weight [C, D] and bias [C], float32 (`StoreWriter.write_head`)
MODEL_PARTS = (PROBES, HEAD)  # groups of a model that are no view


def one_name(name: str) -> bool:
    """Whether `name` can be a group directly under another (a view, a kept probe): no '/', no '.' or '..', which
    Zarr refuses as a path and a reader must not take for damage."""
    return bool(name) and "/" not in name and name not in (".", "..")


_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def model_key(name: str) -> str:
    """A model name as a store group name: 'timm/vit_base_patch16_224' -> 'timm_vit_base_patch16_224'."""
    key = name.replace("/", "_")
    if not _KEY.match(key):
        raise FeatstoreError(f"{name!r} cannot name a store group; use ", Name("name"), " with letters, digits, _ . -")
    return key


T = TypeVar("T")


class FeatureStore:
    """A featstore Zarr store opened for reading, on local disk or object storage (`path`: a folder, file:// or
    s3://... URL)."""

    _mode = "r"  # the writer's is "a": it may create the store
    _memo: dict | None = None  # what `one_reading` has read, while it lasts

    def __init__(self, path: str | Path | StoreLocation):
        mode = self._mode
        self.location = StoreLocation.parse(path)
        if mode == "r" and not self.location.has_store():
            raise FeatstoreError("no featstore store there; build one with ", Step("fs.build(store=..., ...)", "build"),
                                 field="store", value=str(self.location))
        self.location.check_usable()
        try:
            # a new store is created with its format attr in its first zarr.json: another build starting at the
            # same moment never sees a root without it
            self.root = zarr.open_group(self.location.zarr_store(read_only=mode == "r"), mode=mode,
                                        **({} if mode == "r" else {"attributes": {"featstore_format": FORMAT}}))
        except Exception as e:
            raise FeatstoreError(f"cannot open {self.location} as a Zarr v3 store ({type(e).__name__}: "
                                 f"{brief(e)}); point ", Name("store"), " at a featstore store or a new path") from e
        fmt = self.root.attrs.get("featstore_format")
        if fmt is None and mode != "r" and not list(self.root.keys()):
            self.root.attrs["featstore_format"] = FORMAT
        elif fmt != FORMAT:
            raise FeatstoreError(f"{self.location} is not a featstore store (format {fmt!r}); use a new ",
                                 Name("store"), " path")

    @contextmanager
    def damage_is_one_line(self, where: str) -> Iterator[None]:
        """Metadata that cannot be read (a garbage zarr.json, a removed group) as one line naming it, not a
        traceback from Zarr."""
        try:
            yield
        except FeatstoreError:
            raise
        except Exception as e:
            raise FeatstoreError(f"store {self.location} is damaged: {where} cannot be read ({brief(e)}); ",
                                 Step("fs.open_store(store).verify()", "verify"), " lists the damage, and ",
                                 Step("fs.build(...)", "build"), " repairs what it can "
                                 "recompute") from e

    # -- the image table (`images/`): ids, labels, paths, their checksums, the files' stats -----------------------

    def has_images(self) -> bool:
        """True once the image list is complete (its fingerprint attr is written last)."""
        with self.damage_is_one_line("images/zarr.json"):
            return "images" in self.root and "fingerprint" in self.root["images"].attrs

    def check_images(self, images: ImageSet) -> None:
        """Refuse a build of another image list (or label space) than the one the store holds."""
        attrs = dict(self.root["images"].attrs)
        space = attrs.get("label_space", "folder-rank")
        if attrs.get("fingerprint") != images.fingerprint() and space != images.label_space:
            raise FeatstoreError(
                f"store {self.location} labels its images as {space} classes, but this model's head needs "
                f"{images.label_space} labels (ImageNet-1k indices only fit a 1000-way head); use a new ",
                Name("store"))
        if attrs.get("fingerprint") != images.fingerprint():
            raise FeatstoreError(
                f"store {self.location} holds a different image list ({attrs.get('count')} images from "
                f"{attrs.get('source')}) than {images.source} ({len(images)} images); use the same ",
                Name("data"), ", ", Name("labels"), " and ", Name("limit"), ", or a new ", Name("store"))

    def image_table(self) -> dict[str, np.ndarray]:
        """The image ids, paths and labels, as written: a table that is damaged is refused, never read as zeros."""
        table, damage = self._read_image_table()
        if damage:
            raise FeatstoreError(f"store {self.location} is damaged: {damage[0]}; rerun ",
                                 Step("fs.build(...)", "build"), " with the same ", Name("data"),
                                 " to rewrite the image table")
        return table

    def check_images_table(self) -> list[Damage]:
        """What cannot be trusted in the image table: an array that cannot be read, has the wrong length, or whose
        values differ from those written (their checksums, in the images attrs)."""
        return self._read_image_table()[1]

    def _read_image_table(self) -> tuple[dict[str, np.ndarray], list[Damage]]:
        """Every array of the image table that can be read, and the damage found reading them."""
        try:
            g, attrs = self.root["images"], self.image_attrs()
        except Exception as e:
            return {}, [Damage("images", f"metadata cannot be read ({brief(e)})", REWRITE_IMAGES)]
        if "fingerprint" not in attrs:  # written last, with the rest of the attrs: the build stopped before
            return {}, [Damage("images", UNFINISHED, REWRITE_IMAGES)]
        try:
            n, sums = int(attrs["count"]), attrs.get("checksums", {})
        except Exception as e:
            return {}, [Damage("images", f"metadata cannot be read ({brief(e)})", REWRITE_IMAGES)]
        table, damage = {}, []
        for name in IMAGE_ARRAYS:
            where = f"images/{name}"
            try:
                values = np.asarray(g[name][:], dtype=object if name == "path" else None)
            except Exception as e:
                damage.append(Damage(where, f"cannot be read ({brief(e)})", REWRITE_IMAGES))
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

    def image_stats(self, contents: bool = True) -> np.ndarray | None:
        """The image files as the store was built from them (`featstore.store.integrity.image_stats`), or None where
        the store does not record them (built before it did, or the record cannot be read). With `contents`, a
        content checksum missing from `images/stat` is taken from the views' `image_content`, where a build's loader
        recorded it."""
        try:
            stat = self.root["images"]["stat"]
            if "columns" not in stat.attrs:  # written after the values: their record was interrupted
                return None
            stats = np.asarray(stat[:], dtype=np.int64)
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

    def _labels_present(self) -> np.ndarray:
        """The distinct labels the images carry, sorted."""
        return np.unique(self.root["images"]["label"][:])

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
                                 "build it with ", Step(f"fs.build(model={key!r}, ...)", "build"))
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
        if not isinstance(view, str):
            raise FeatstoreTypeError(f"give a view's name (the views of {key!r}: "
                                     f"{', '.join(self.views(key)) or 'none'})", field="view", value=view)
        with self.damage_is_one_line(f"view {view!r} of {key!r}"):
            try:  # the view's own metadata, not each group's on the way (on object storage each is a request)
                g = self.root[f"{key}/{view}"] if one_name(view) else None
            except KeyError:
                g = None
            if not isinstance(g, zarr.Group) or "done" not in g:
                have = ", ".join(self.views(key)) or "none"
                raise FeatstoreError(f"store {self.location} has no view {view!r} of {key!r} (it has: {have}); "
                                     "build it with ", Step(f"fs.build(views={view!r}, ...)", "build"))
            return g

    def view_array(self, key: str, view: str, g: zarr.Group, name: str) -> zarr.Array:
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
            return np.array([decodes(bitmap, c) for c in range(bitmap.shape[0])], dtype=bool)

    def listed(self, prefix: str) -> list[str]:
        """The names directly under `prefix`, as the storage lists them (no metadata is parsed), but for the files
        a killed writer left half-written."""
        async def names() -> list[str]:
            return [k async for k in self.root.store.list_dir(prefix)]

        return sorted(n for n in sync(names()) if n != "zarr.json" and not n.startswith(".") and not zarr_temporary(n))

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
                          lambda: np.asarray(self.view_array(key, view, g, "skipped")[:], dtype=bool)).copy()

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
                                     f"same ", Step("fs.build(...)", "build"), " to write the head again")
        return weight, bias, str(attrs.get("module", ""))

    def read_head_reading(self, key: str) -> tuple[dict, dict[str, np.ndarray]] | None:
        """The model's final norm and each anchor's role to the head (`featstore.nets.head_norm`), with the norm's
        arrays, as `write_head` kept them; None where the head was kept without them (or not at all)."""
        if self.read_head(key) is None:
            return None
        with self.damage_is_one_line(f"{key}/{HEAD}"):
            g = self.root[key][HEAD]
            attrs = dict(g.attrs)
            if "reading" not in attrs:
                return None
            names = [n for n in attrs["checksums"] if n not in ("weight", "bias")]
            arrays = {n: np.asarray(g[n][:]) for n in names}
        for name, values in arrays.items():
            if int(attrs["checksums"][name], 16) != checksum(values):
                raise FeatstoreError(f"store {self.location} is damaged: {key}/{HEAD}/{name} {CHANGED}; rerun the "
                                     f"same ", Step("fs.build(...)", "build"), " to write the head again")
        return dict(attrs["reading"]), arrays

    def has_head(self, key: str) -> bool:
        """True when the model's classifier is kept (complete), whatever its values (`read_head` checks them)."""
        try:
            return HEAD in self.listed(key) and "checksums" in self.root[key][HEAD].attrs
        except Exception:
            return False

    # -- the probes kept (layout: `featstore.store.probes`) -------------------------------------------------------

    def probe_versions(self, key: str) -> list[ProbeVersion]:
        """Every saved version of every probe of a model (listed; each version's attrs read for its owner)."""
        found: list[ProbeVersion] = []
        if PROBES not in self.listed(key):
            return found
        for name in self.listed(f"{key}/{PROBES}"):
            try:
                current = self.root[key][PROBES][name].attrs.get("current")
            except Exception:  # unreadable metadata: a version of it is current as far as anyone can tell
                current = None
            for version in self.listed(f"{key}/{PROBES}/{name}"):
                if not VERSION.fullmatch(version):  # a store before versions kept one set of anchors here
                    continue
                try:
                    owner = dict(self.root[key][PROBES][name][version].attrs).get("database")
                except Exception:  # interrupted before its metadata was written
                    owner = None
                found.append(ProbeVersion(key, name, version, owner, version == current))
        return found

    def probe_version_exists(self, key: str, name: str, version: str) -> bool:
        """True when <model>/probes/<name>/<version> holds weights (listed, no metadata parsed)."""
        try:
            return bool(self.listed(f"{key}/{PROBES}/{name}/{version}"))
        except Exception:
            return False

    def read_probe(self, key: str, name: str, version: str | None = None) -> StoredProbe:
        """One version of probe `name` of model `key`, every anchor's arrays and attrs: `version`, or without it the
        one the probe's `current` names (a store before versions: its one unversioned set). What is missing is one
        FeatstoreError naming it."""
        self.model_attrs(key)  # an unknown model is a one-line error
        if not isinstance(name, str):
            raise FeatstoreTypeError("give the kept probes' name ('linear@clean'; ",
                                     Step("fs.open_store(store).info()", "info"), " lists them)", field="name",
                                     value=name)
        root = self.root[key]
        with self.damage_is_one_line(f"{key}/{PROBES}/{name}"):
            if PROBES not in root or not one_name(name) or name not in root[PROBES]:
                raise FeatstoreError(f"store {self.location} holds no probes {name!r} of {key!r}; ",
                                     Step("fs.probe(...)", "probe"), " saves them")
            group = root[PROBES][name]
            version = version or group.attrs.get("current")
        if version is not None and not (isinstance(version, str) and GROUP_NAME.fullmatch(version)):
            raise FeatstoreError(f"store {self.location}: {version!r} is no stored-weights version of probes "
                                 f"{name!r} (a name of letters, digits, _ . -)")
        held = group if version is None else group.get(version)
        if held is None:
            raise FeatstoreError(f"store {self.location}: the probes {name}/{version} are gone (",
                                 Step("fs.open_store(store).verify(dbs=[db])", "verify"), " lists such runs)")
        anchors = {}
        with self.damage_is_one_line(f"{key}/{PROBES}/{name}/{version}"):
            for anchor, g in sorted(held.groups()):
                anchors[anchor] = StoredAnchor({a: np.asarray(arr[:]) for a, arr in sorted(g.arrays())},
                                               dict(g.attrs))
        return StoredProbe(key, name, version, anchors)

    # -- integrity: what is opened here, judged by `featstore.store.verification` ----------------------------------

    def check_view(self, key: str, view: str, deep: bool = True) -> list[ChunkProblem]:
        """Done chunks of a view that cannot be trusted (`verification.chunk_problems`). `deep=False` only looks for
        missing files (one listing of the view, through the Zarr store, so it holds on object storage too)."""
        g = self.view_group(key, view)
        with self.damage_is_one_line(f"the arrays of view {view!r} of {key!r}"):
            names = [f"anchors/{a.name}" for a in self.anchors(key)] + ["logits"]
            arrays = [(name, self.view_array(key, view, g, name)) for name in names]
            listed = self.location.keys(f"{g.path}/")
            skipped = self.view_array(key, view, g, "skipped")
        try:  # every row at once; a damaged chunk is found chunk by chunk
            skipped_rows = self.read_skipped(key, view)
        except Exception:
            skipped_rows = None
        sums = recorded_checksums(g, len(arrays) + 1) if deep else None
        opened = OpenedView(key, view, arrays, skipped, skipped_rows, self.done(key, view), listed,
                            self.chunk_rows(key), self.num_images, sums)
        return chunk_problems(opened, deep)

    def check_view_arrays(self, key: str, view: str) -> list[Damage]:
        """The arrays a view must hold, each readable and of the shape and chunks its model's config gives (a
        view whose `done` bitmap was never written was interrupted while being created: a build makes it)."""
        cfg, n = self.config(key), self.num_images
        base = f"{key}/{view}"
        listed = self.listed(base)
        if "done" not in listed:
            return []
        expected = expected_arrays(cfg, n, listed)
        try:
            g = self.root[key][view]
        except Exception as e:
            return [Damage(base, f"its metadata cannot be read ({brief(e)})", REMAKE_VIEW)]
        opened: dict[str, zarr.Array | Exception] = {}
        for name in expected:
            try:
                opened[name] = self.view_array(key, view, g, name)
            except Exception as e:
                opened[name] = e
        return array_damage(base, expected, opened)

    def verify(self, key: str | None = None, deep: bool = True) -> list[ChunkProblem | Damage]:
        """Everything the store holds that cannot be trusted: the image table (`check_images_table`), each model's
        config, each view's arrays (`check_view_arrays`) and, in the views whose arrays are sound, every done chunk
        (`check_view`). Groups are found by listing the storage, so a group whose metadata is garbage is reported,
        not skipped."""
        problems: list[ChunkProblem | Damage] = list(self.check_images_table())
        if key is not None and key not in self.listed(""):
            self.model_attrs(key)  # an unknown model is a one-line error
        heads = []
        for k in [key] if key is not None else [k for k in self.listed("") if k != "images"]:
            try:
                heads.append(self.config(k).num_classes)
            except FeatstoreError as e:
                problems.append(Damage(k, f"its metadata cannot be read ({str(e.__cause__ or e)[:160]})", ""))
                continue
            for v in [v for v in self.views(k) if "done" in self.listed(f"{k}/{v}")]:
                damage = self.check_view_arrays(k, v)
                problems += damage if damage else self.check_view(k, v, deep)
        ranks = rank_labels(self._image_attrs_if_readable(), heads)
        return problems + ([ranks] if ranks is not None else [])

    def _image_attrs_if_readable(self) -> dict | None:
        try:
            return self.image_attrs()
        except FeatstoreError:
            return None

    # -- what the store holds (`featstore info`) -------------------------------------------------------------------

    def info(self) -> StoreInfo:
        """What the store holds: images, and per model its anchors and each view's completeness; every metadata
        file read once (`one_reading`)."""
        with self.one_reading():
            images: ImagesInfo | Damaged | None = None
            damage = self.check_images_table()
            if damage:  # what `verify` would say first, in place of what cannot be read
                images = Damaged(str(damage[0]))
            elif self.has_images():
                a = self.image_attrs()
                images = ImagesInfo(a.get("count"), len(self._labels_present()), a.get("source"),
                                    a.get("label_space", "folder-rank"), self._present_class_names(a))
            models: dict[str, ModelInfo | Damaged] = {}
            for key in self.models():
                try:
                    models[key] = self._model_info(key)
                except FeatstoreError as e:
                    models[key] = Damaged(str(e))
            ranks = rank_labels(self._image_attrs_if_readable(),
                                [m.num_classes for m in models.values() if isinstance(m, ModelInfo)])
            if ranks is not None:  # a store whose every accuracy is wrong is refused, not summarised as sound
                raise FeatstoreError(f"store {self.location}: {ranks.what}; {ranks.repair}")
            return StoreInfo(str(self.location), images, models)

    def _model_info(self, key: str) -> ModelInfo:
        attrs = self.model_attrs(key)
        cfg = self.config(key)
        views: dict[str, ViewInfo | Damaged] = {}
        for v in self.views(key):
            damage = self.check_view_arrays(key, v)
            if damage:
                views[v] = Damaged(str(damage[0]))
                continue
            if "done" not in self.root[key][v]:
                continue
            done = self.done(key, v)
            views[v] = ViewInfo(int(done.sum()), int(done.size), int(self.read_skipped(key, v).sum()),
                                tuple(self.threads_used(key, v)),
                                tuple(sorted({p.chunk for p in self.check_view(key, v, deep=False)})))
        with self.damage_is_one_line(f"{key}/{PROBES}"):
            probes = sorted(self.listed(f"{key}/{PROBES}")) if PROBES in self.listed(key) else []
        return ModelInfo(cfg.model, cfg.weights_id, published_top1_of(cfg.weights_id), cfg.preprocessing,
                         cfg.token_pool, cfg.num_classes, cfg.chunk_rows,
                         tuple(AnchorInfo(a.index, a.name, a.module, a.dim) for a in cfg.anchors), views,
                         tuple(probes), attrs.get("versions", {}), tuple(self.foreign(key)))

    def _present_class_names(self, attrs: dict) -> tuple[str, ...]:
        """The recorded names of the classes the images carry, in label order (none where the store records none)."""
        names = attrs.get("class_names") or []
        present = self._labels_present() if names else []
        return tuple(str(names[i]) for i in present if 0 <= i < len(names))
