"""What a store holds, as one typed, frozen record (`StoreInfo`): its images, and per model the network, the
anchors, each view's completeness and damage, the probes kept. `FeatureStore.info()` makes it, reading the
metadata once (no torch, no feature values); `featstore info` prints it, and `to_dict()` is its JSON
(`featstore info --format json`).

A part that cannot be read is a `Damaged` in its place, saying what the integrity check says first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from featstore.images.preprocessing import Preprocessing

# the model families whose token anchors are read at their class token (`cls`): a store records `cls` for every
# model, tokens or none, so the name says whether it was read
CLASS_TOKEN_FAMILIES = ("vit", "deit", "beit", "cait", "eva", "xcit")


@dataclass(frozen=True)
class Damaged:
    """A part of the store that cannot be read or trusted, and why."""

    what: str

    def to_dict(self) -> dict[str, Any]:
        return {"damaged": self.what}


@dataclass(frozen=True)
class ImagesInfo:
    """The image table: how many images, how many distinct labels they carry, where they were read from, and the
    names the store records of those classes (folder names; ImageNet's WNIDs), in label order."""

    count: int | None
    classes: int
    source: str | None
    label_space: str  # "folder-rank" or "imagenet-1k" (`featstore.images.datasets`)
    class_names: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "classes": self.classes, "source": self.source, "label_space": self.label_space,
                "class_names": list(self.class_names)}


@dataclass(frozen=True)
class ViewInfo:
    """One view of a model: chunks committed of all, rows skipped, the CPU thread counts its chunks were computed
    with (none for a GPU build), and the done chunks whose files are missing."""

    chunks_done: int
    chunks: int
    skipped: int
    threads: tuple[int, ...]
    damaged_chunks: tuple[int, ...]

    @property
    def complete(self) -> bool:
        return self.chunks_done == self.chunks

    def to_dict(self) -> dict[str, Any]:
        return {"chunks_done": self.chunks_done, "chunks": self.chunks, "skipped": self.skipped,
                "threads": list(self.threads), "damaged_chunks": list(self.damaged_chunks)}


@dataclass(frozen=True)
class AnchorInfo:
    """One anchor as `info` lists it: its index, name, module and stored width."""

    index: int
    name: str
    module: str
    dim: int


@dataclass(frozen=True)
class ModelInfo:
    """One model group: the network and its weights (with their published top-1 where the library says it), how
    images were preprocessed and tokens pooled, the head's classes, the chunking, the anchors, each view, the probes
    kept, the library versions of the build, and what in the group featstore did not write (`foreign`)."""

    model: str
    weights: str
    published_top1: float | None
    preprocessing: Preprocessing | None  # None: features written directly (no images decoded)
    token_pool: str | None
    num_classes: int
    chunk_rows: int
    anchors: tuple[AnchorInfo, ...]
    views: Mapping[str, ViewInfo | Damaged]
    probes: tuple[str, ...]
    versions: Mapping[str, Any]
    foreign: tuple[str, ...] = ()

    @property
    def reads_tokens(self) -> bool:
        """Whether the token pool says anything of this model: a mean pool is recorded only where tokens exist (or
        with taps, a VisionTransformer's); `cls` is recorded for every model, and read only by the class-token
        families (the build's `default_token_pool` found a class token in them)."""
        arch = self.model.removeprefix("timm/").split(".")[0]
        return self.token_pool == "mean" or arch.startswith(CLASS_TOKEN_FAMILIES)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "weights": self.weights, "published_top1": self.published_top1,
            "preprocessing": None if self.preprocessing is None else self.preprocessing.to_dict(),
            "token_pool": self.token_pool, "num_classes": self.num_classes, "chunk_rows": self.chunk_rows,
            "anchors": [[a.index, a.name, a.module, a.dim] for a in self.anchors],
            "views": {name: v.to_dict() for name, v in self.views.items()}, "probes": list(self.probes),
            "versions": dict(self.versions), **({"foreign": list(self.foreign)} if self.foreign else {}),
        }


@dataclass(frozen=True)
class StoreInfo:
    """What a store holds (`FeatureStore.info()`, `fs.open_store(...).info()`): where it is, its images (None
    before a build wrote them) and its models by store key."""

    path: str
    images: ImagesInfo | Damaged | None
    models: Mapping[str, ModelInfo | Damaged]

    def to_dict(self) -> dict[str, Any]:
        """The JSON `featstore info --format json` prints."""
        return {"path": self.path, "images": None if self.images is None else self.images.to_dict(),
                "models": {key: m.to_dict() for key, m in self.models.items()}}


def published_top1_of(weights_id: str) -> float | None:
    """The published top-1 of a library's weights; only those load the library (its weight table), so that
    `featstore info` on a store of other weights reads metadata alone."""
    if not weights_id.startswith(("torchvision:", "timm:")):
        return None
    from featstore.nets.models import published_top1

    return published_top1(weights_id)

