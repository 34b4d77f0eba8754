"""The store's image table (`images/`): ids, labels and paths with their checksums, the build's image list
fingerprint, and the image files' stats. Composed by the store's reading (`StoreReading.image_rows`), which
delegates its image methods here; it writes nothing (`StoreWriter.write_images` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

import numpy as np
import zarr

from featstore.errors import FeatstoreError, Name, Step
from featstore.images.imagenet_val import foreign_wnid
from featstore.store.integrity import Damage, brief, checksum, text_checksum

if TYPE_CHECKING:  # reading a store's metadata (`featstore info`) loads no torch
    from featstore.images.datasets import ImageSet
    from featstore.store.location import StoreLocation

IMAGE_ARRAYS = ("image_id", "label", "path")
REWRITE_IMAGES = "a build rewrites it from the image folder"
UNFINISHED = "not finished (a build stopped while writing it)"


class _Store(Protocol):
    """What the image table reads of its store (`featstore.store.reading.StoreReading`, which holds it)."""

    root: zarr.Group
    location: StoreLocation

    def damage_is_one_line(self, where: str) -> AbstractContextManager[None]: ...

    def models(self) -> list[str]: ...

    def views(self, key: str) -> list[str]: ...


class ImageTable:
    """The image table of one store, read through its Zarr root on every call (a build may be writing it)."""

    def __init__(self, store: _Store):
        self.store = store

    def complete(self) -> bool:
        """True once the image list is complete (its fingerprint attr is written last)."""
        root = self.store.root
        with self.store.damage_is_one_line("images/zarr.json"):
            return "images" in root and "fingerprint" in root["images"].attrs

    def check(self, images: ImageSet) -> None:
        """Refuse a build of another image list (or label space) than the one the store holds."""
        location = self.store.location
        attrs = dict(self.store.root["images"].attrs)
        space = attrs.get("label_space", "folder-rank")
        if attrs.get("fingerprint") != images.fingerprint() and space != images.label_space:
            raise FeatstoreError(
                f"store {location} labels its images as {space} classes, but this model's head needs "
                f"{images.label_space} labels (ImageNet-1k indices only fit a 1000-way head); use a new ",
                Name("store"))
        if attrs.get("fingerprint") != images.fingerprint():
            raise FeatstoreError(
                f"store {location} holds a different image list ({attrs.get('count')} images from "
                f"{attrs.get('source')}) than {images.source} ({len(images)} images); use the same ",
                Name("data"), ", ", Name("labels"), " and ", Name("limit"), ", or a new ", Name("store"))

    def table(self) -> dict[str, np.ndarray]:
        """The image ids, paths and labels, as written: a table that is damaged is refused, never read as zeros."""
        table, damage = self.read()
        if damage:
            raise FeatstoreError(f"store {self.store.location} is damaged: {damage[0]}; rerun ",
                                 Step("fs.build(...)", "build"), " with "
                                 "the same ", Name("data"), " to rewrite the image table")
        return table

    def damage(self) -> list[Damage]:
        """What cannot be trusted in the image table: an array that cannot be read, has the wrong length, or whose
        values differ from those written (their checksums, in the images attrs)."""
        return self.read()[1]

    def read(self) -> tuple[dict[str, np.ndarray], list[Damage]]:
        """Every array that can be read, and the damage found reading them."""
        try:
            g, attrs = self.store.root["images"], self.attrs()
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

    def rank_labels(self, head_classes: Sequence[int]) -> Damage | None:
        """Labels that are ranks among the WNIDs the images carry where a 1000-way head (one of `head_classes`)
        predicts ImageNet-1k indices: a build before labels were checked read a labels file with a WNID outside
        ImageNet-1k (`n00000001`, a typo) that way, and every accuracy of the store is then scored wrongly. Told
        from what the images attrs record: folder-rank labels, class names all WNIDs, one (not all) outside
        ImageNet-1k. None for any other store, and where the attrs cannot be read (`damage` says that)."""
        try:
            attrs = self.attrs()
        except FeatstoreError:
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

    def attrs(self) -> dict:
        with self.store.damage_is_one_line("images"):
            return dict(self.store.root["images"].attrs)

    def count(self) -> int:
        with self.store.damage_is_one_line("images"):
            return int(self.store.root["images"].attrs["count"])

    def classes_present(self) -> int:
        """How many distinct labels the images carry."""
        return len(np.unique(self.store.root["images"]["label"][:]))

    def stats(self, contents: bool = True) -> np.ndarray | None:
        """The image files as the store was built from them (`featstore.store.integrity.image_stats`), or None where
        the store does not record them (built before it did, or the record cannot be read). With `contents`, a
        content checksum missing from `images/stat` is taken from the views' `image_content`, where a build's loader
        recorded it."""
        store = self.store
        try:
            stat = store.root["images"]["stat"]
            if "columns" not in stat.attrs:  # written after the values: their record was interrupted
                return None
            stats = np.asarray(stat[:], dtype=np.int64)
        except Exception:
            return None
        for key in store.models() if contents else []:
            for view in store.views(key):
                if not (stats[:, 2] == 0).any():
                    return stats
                try:
                    content = np.asarray(store.root[key][view]["image_content"][:], dtype=np.int64)
                except Exception:  # a view made before contents were recorded, or damaged: it records none
                    continue
                if content.shape == stats[:, 2].shape:
                    stats[:, 2] = np.where(stats[:, 2] == 0, content, stats[:, 2])
        return stats
