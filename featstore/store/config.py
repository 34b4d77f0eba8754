"""The configuration a store records per model (`<model>/` attrs `config`): everything that shaped its numbers.

`to_dict` writes it, `from_dict` reads it — the only place that knows older shapes: stores written before
anchors had a hook side kept it in `post`, stores written before the decoder was recorded decoded with PIL. A
build compares the config it would write with the stored one (`differences`), so a store never mixes two
settings under one model name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from featstore.images.preprocessing import Preprocessing
from featstore.nets.anchors import Anchor


@dataclass(frozen=True)
class StoreConfig:
    """One model group of a store: the network (model, library, weights_id, preprocessing, token_pool), its head
    (num_classes), the anchors, how it was computed (precision, memory format, decoder, batch size, compiled) and
    laid out (chunk_rows), and which image list it covers (images_fingerprint)."""

    model: str
    library: str
    weights_id: str
    preprocessing: Preprocessing | None  # None: features written directly (no images decoded)
    token_pool: str | None
    num_classes: int
    chunk_rows: int
    batch_size: int
    precision: str
    anchors: tuple[Anchor, ...]
    images_fingerprint: str
    memory_format: str | None = None
    decoder: str = "pil"
    logits_dtype: str = "float16"  # anchors carry their own (`Anchor.dtype`); see featstore.nets.stored_types
    compiled: bool = False  # the forward ran under torch.compile (`--compile`): its fused kernels round otherwise

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["preprocessing"] = None if self.preprocessing is None else self.preprocessing.to_dict()
        out["anchors"] = [a.to_dict() for a in self.anchors]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> StoreConfig:
        prep = d.get("preprocessing")
        return cls(model=d["model"], library=d["library"], weights_id=d["weights_id"],
                   preprocessing=None if prep is None else Preprocessing.from_dict(prep),
                   token_pool=d.get("token_pool"), num_classes=int(d["num_classes"]), chunk_rows=int(d["chunk_rows"]),
                   batch_size=int(d["batch_size"]), precision=d["precision"],
                   anchors=tuple(Anchor.from_dict(a) for a in d["anchors"]),
                   images_fingerprint=d["images_fingerprint"], memory_format=d.get("memory_format"),
                   decoder=d.get("decoder", "pil"),  # stores written before the decoder was recorded: all PIL
                   logits_dtype=d.get("logits_dtype", "float16"),  # ... and before per-array types: all float16
                   compiled=bool(d.get("compiled", False)))  # ... and before --compile: eager

    def differences(self, other: StoreConfig) -> list[str]:
        """The fields in which two configs differ, compared as they are written."""
        mine, theirs = self.to_dict(), other.to_dict()
        return sorted(k for k in mine if _canonical(mine[k]) != _canonical(theirs[k]))


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)
