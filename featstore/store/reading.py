"""Reading a Zarr v3 feature store (docs/design.md §4): images, then per model and view one float16 array per
anchor. `StoreReading` opens the store and reads it: the models, their configs and views, the stored rows, the
head, and the image table (`image_table.ImageTable`, composed), with the memo of `one_reading`. It is the base of
`featstore.store.reader.FeatureStore`, which adds the store's other roles (the integrity check, the summary, the
probes kept); it writes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import zarr
from zarr.core.sync import sync

from featstore.errors import FeatstoreError, FeatstoreTypeError, Name, Step
from featstore.records import ModelSource
from featstore.store.config import StoreConfig
from featstore.store.image_table import ImageTable
from featstore.store.integrity import CHANGED, Damage, brief, checksum
from featstore.store.location import StoreLocation, zarr_temporary
from featstore.store.rows import decodes

if TYPE_CHECKING:  # reading a store's metadata (`featstore info`) loads no torch
    from featstore.images.datasets import ImageSet
    from featstore.nets.anchors import Anchor

FORMAT = 1
HEAD = "head"  # <model>/head: the classifier's weight [C, D] and bias [C], float32 (`write_head`)
PROBES = "probes"  # <model>/probes: the probes kept (`featstore.store.probes`)
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


class StoreReading:
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


    # -- the roles it composes ----------------------------------------------------------------------

    @cached_property
    def image_rows(self) -> ImageTable:
        """The image table: ids, labels, paths, their checksums, the files' stats."""
        return ImageTable(self)


    # -- images (`ImageTable`) ----------------------------------------------------------------------

    def has_images(self) -> bool:
        """True once the image list is complete (its fingerprint attr is written last)."""
        return self.image_rows.complete()

    def check_images(self, images: ImageSet) -> None:
        self.image_rows.check(images)

    def image_table(self) -> dict[str, np.ndarray]:
        """The image ids, paths and labels, as written: a table that is damaged is refused, never read as zeros."""
        return self.image_rows.table()

    def check_images_table(self) -> list[Damage]:
        """What cannot be trusted in the image table (`ImageTable.damage`)."""
        return self.image_rows.damage()

    def image_attrs(self) -> dict:
        return self.image_rows.attrs()

    @property
    def num_images(self) -> int:
        return self.image_rows.count()

    def image_stats(self, contents: bool = True) -> np.ndarray | None:
        """The image files as the store was built from them, or None where it does not record them
        (`ImageTable.stats`)."""
        return self.image_rows.stats(contents)

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
