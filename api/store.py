"""A store opened read-only from Python: its models, and per model the anchors, views, images and features.
(What only `verify` and `split` need, the probes' and databases' modules, loads torch or DuckDB: imported there.)"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from featstore.errors import FeatstoreError, FeatstoreTypeError
from featstore.schema import VAL_FRAC, VIEW
from featstore.store.location import StoreLocation
from featstore.store.reader import FeatureStore, model_key
from featstore.store.summary import Damaged, StoreInfo

if TYPE_CHECKING:
    from featstore.nets.anchors import Anchor
    from featstore.store.probes import StoredProbe
    from featstore.workflows.gc import Unreferenced

__all__ = ["Damaged", "ModelData", "Store", "StoreInfo", "Verification", "open_store"]


@dataclass(frozen=True)
class Verification:
    """What `Store.verify` found: every problem, one line each (none: the store is sound), and the saved probe
    versions no run names (`fs.gc` removes the removable ones; they are no damage)."""

    problems: list[str]
    unreferenced: list[Unreferenced]

    @property
    def sound(self) -> bool:
        return not self.problems


class Store:
    """A featstore store opened read-only (a folder or an object-store URL): its models, and per model its data."""

    def __init__(self, location: str | Path):
        if not isinstance(location, str | os.PathLike):
            raise FeatstoreTypeError("give a store's folder or its URL (s3://...)", field="location", value=location)
        self._named = str(location)  # as given: what info() says the store is
        where = StoreLocation.parse(location)  # a scheme featstore cannot reach is refused, never read as a folder
        if where.path is not None:  # a folder: where it is now, whatever cwd later
            where = StoreLocation.parse(where.path.absolute())
        self._fs = FeatureStore(where)  # mode "r": a missing store is an error, nothing is created

    @property
    def location(self) -> str:
        return str(self._fs.location)

    @property
    def models(self) -> list[str]:
        return self._fs.models()

    def model(self, name: str) -> ModelData:
        """One model group ('resnet18' or its store key); an unknown one is an error naming those there are."""
        key = model_key(name)
        self._fs.model_attrs(key)
        return ModelData(self._fs, key)

    def info(self) -> StoreInfo:
        """What the store holds: images, models, views, anchors, widths and completeness (`featstore info`), its
        path as it was given to `open_store`; `.to_dict()` is `featstore info --format json`."""
        return replace(self._fs.info(), path=self._named)

    def verify(self, model: str | None = None, deep: bool = True,
               dbs: str | Path | Sequence[str | Path] = ()) -> Verification:
        """Check everything the store holds (`featstore verify`): the image table, each model's and array's
        metadata, and (`deep`) every chunk marked done; with `dbs` (one path or a list), that every probe run of
        those databases finds its weights here. Also lists the saved probe versions no run names."""
        from featstore.analytics.selection import databases
        from featstore.workflows.gc import unreferenced
        from featstore.workflows.probe import missing_weights

        dbs = databases(dbs, "dbs", empty=True)
        problems = [str(p) for p in self._fs.verify(model, deep=deep)]
        if dbs:
            problems += missing_weights(self.location, dbs)
        return Verification(problems, unreferenced(self.location, dbs, model))

    def __repr__(self) -> str:
        return f"Store({self.location!r}, models={self.models})"


class ModelData:
    """What a store holds of one model: its anchors, views, images and the stored features (read on demand)."""

    def __init__(self, store: FeatureStore, key: str):
        self._fs, self.key = store, key

    @property
    def anchors(self) -> list[Anchor]:
        return self._fs.anchors(self.key)

    @property
    def views(self) -> list[str]:
        return self._fs.views(self.key)

    @property
    def image_ids(self) -> np.ndarray:
        return self._fs.image_table()["image_id"]

    @property
    def labels(self) -> np.ndarray:
        return self._fs.image_table()["label"]

    @property
    def class_names(self) -> list[str]:
        """The name of each class as the store records it, indexed by label: the class folders' names in sorted
        order, or ImageNet-1k's 1000 WNIDs where `label_space` is 'imagenet-1k' (labels are its indices)."""
        return [str(name) for name in self._fs.image_attrs().get("class_names") or []]

    @property
    def label_space(self) -> str:
        """'folder-rank' (labels rank the class folders) or 'imagenet-1k' (labels are ImageNet-1k indices)."""
        return str(self._fs.image_attrs().get("label_space", "folder-rank"))

    def anchor(self, which: str | int) -> Anchor:
        """An anchor by name or index; anything else is an error listing the valid ones."""
        anchors = self.anchors
        names = [a.name for a in anchors]
        if isinstance(which, str) and which in names:
            return anchors[names.index(which)]
        if isinstance(which, int | np.integer) and not isinstance(which, bool) and 0 <= which < len(anchors):
            return anchors[int(which)]
        raise FeatstoreError(f"anchor {which!r} of {self.key!r}: give a name or an index 0..{len(anchors) - 1} "
                             f"(the anchors: {', '.join(names)})")

    def features(self, anchor: str | int, view: str = VIEW) -> np.ndarray:
        """[images, width] pooled features of one anchor, as float32 (what the probes learn from)."""
        a = self.anchor(anchor)
        return np.asarray(self._fs.read(self.key, view, a.name), dtype=np.float32)

    def stored_probe(self, name: str, version: str | None = None) -> StoredProbe:
        """The probes `name` the store keeps of this model, per anchor its arrays and attrs: `version`, or the
        current one (`featstore probe` saves them; `load_probe` reads a run's)."""
        return self._fs.read_probe(self.key, name, version)

    def skipped(self, view: str = VIEW) -> np.ndarray:
        """[images] bool: rows the build could not read (the probes leave them out)."""
        return self._fs.read_skipped(self.key, view)

    def split(self, split_seed: int = 0, val_frac: float = VAL_FRAC) -> np.ndarray:
        """Per image 'train' | 'val' | 'test': the split `featstore probe` uses with these settings."""
        from featstore.probing.split import checked, make_split

        checked(split_seed=split_seed, val_frac=val_frac)  # val_frac=2.0 would mark every image val
        return make_split(self.image_ids, split_seed, val_frac=val_frac)

    def __repr__(self) -> str:
        return f"ModelData({self.key!r}, anchors={len(self.anchors)}, views={self.views})"


def open_store(location: str | Path) -> Store:
    """A store, read-only: `.models`, `.model(name)` -> anchors, views, image ids, labels, features."""
    return Store(location)
