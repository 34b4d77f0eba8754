"""The Zarr v3 feature store's reader (docs/design.md §4), what `fs.open_store` wraps; it writes nothing (the
writer, `featstore.store.writer.StoreWriter`, is this class with the writing methods, for builds, repairs and
probes).

`FeatureStore` is the store's roles composed, each a module of its own, delegated to by name: reading the models,
views, rows, head and image table (`reading.StoreReading`, its base), the integrity check (`verification.StoreCheck`,
`store.checks`), the summary (`summary.summarize`: `info()`, a `StoreInfo`) and the probes kept (`probes`, the one
place that knows their layout: `read_probe`, `probe_versions`).

docs/store.md is the layout (groups, arrays, shapes, attrs), checked against a store built by this code in
tests/test_docs.py. The writer's `commit_chunk` is the one function that writes a chunk and then marks it done, so
a chunk that is marked done is always complete (zarr's LocalStore writes each file atomically, and an object
store's PUT is atomic). Where the store lives, a folder or an object-store URL, is `featstore.store.location`'s
affair. Each commit also records a checksum of every array's values (`featstore.store.integrity`), so that
`verify` finds a chunk whose content changed since, and the image table carries its own checksums: `verify`
covers everything a store holds, and `build` repairs what it can recompute (`featstore.store.repair`).
"""

from __future__ import annotations

from functools import cached_property

from featstore.store import probes
from featstore.store.integrity import Damage
from featstore.store.probes import ProbeVersion, StoredProbe, new_probe_version
from featstore.store.reading import HEAD, StoreReading, model_key
from featstore.store.rows import read_rows
from featstore.store.summary import StoreInfo, summarize
from featstore.store.verification import ChunkProblem, StoreCheck

# the names other modules import from here (defined in the role modules)
__all__ = ["HEAD", "ChunkProblem", "FeatureStore", "ProbeVersion", "StoreInfo", "StoredProbe", "model_key",
           "new_probe_version", "read_rows"]


class FeatureStore(StoreReading):
    """A featstore Zarr store, on local disk or object storage (`path`: a folder, file:// or s3://... URL)."""

    @cached_property
    def checks(self) -> StoreCheck:
        """The integrity check of everything the store holds (`verify`)."""
        return StoreCheck(self)

    # -- integrity (`StoreCheck`) -------------------------------------------------------------------

    def check_view(self, key: str, view: str, deep: bool = True) -> list[ChunkProblem]:
        """Done chunks of a view that cannot be trusted (`StoreCheck.view_chunks`)."""
        return self.checks.view_chunks(key, view, deep)

    def check_view_arrays(self, key: str, view: str) -> list[Damage]:
        """The arrays a view must hold, each of the shape its config gives (`StoreCheck.view_arrays`)."""
        return self.checks.view_arrays(key, view)

    def verify(self, key: str | None = None, deep: bool = True) -> list[ChunkProblem | Damage]:
        """Everything the store holds that cannot be trusted (`StoreCheck.verify`)."""
        return self.checks.verify(key, deep)

    # -- probes (`featstore.store.probes`) ----------------------------------------------------------

    def probe_versions(self, key: str) -> list[ProbeVersion]:
        """Every saved version of every probe of a model."""
        return probes.probe_versions(self, key)

    def probe_version_exists(self, key: str, name: str, version: str) -> bool:
        """True when <model>/probes/<name>/<version> holds weights (listed, no metadata parsed)."""
        return probes.probe_version_exists(self, key, name, version)

    def read_probe(self, key: str, name: str, version: str | None = None) -> StoredProbe:
        """One version of a probe (default: the current one), every anchor's arrays and attrs."""
        return probes.read_probe(self, key, name, version)

    # -- summary (`featstore.store.summary`) --------------------------------------------------------

    def info(self) -> StoreInfo:
        """What the store holds: images, and per model its anchors and each view's completeness."""
        return summarize(self)
