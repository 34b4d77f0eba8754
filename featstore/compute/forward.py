"""The build's computing half: one batch of images through a tapped model into host arrays of their stored types,
and a chunk's batches joined for the store. The job that reads images, prepares the store and commits chunks is
`featstore.workflows.build`; nothing here writes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from featstore.errors import FeatstoreError
from featstore.nets.extraction import Tapper
from featstore.nets.stored_types import check_storable, to_host
from featstore.schema import PRECISIONS
from featstore.store.writer import ChunkData


def resolve_precision(precision: str, device: torch.device) -> str:
    """`--precision` made concrete for a device (auto: fp16 on CUDA, fp32 elsewhere), refusing what it cannot run."""
    if precision not in PRECISIONS:
        raise FeatstoreError(f"--precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        return "fp16" if device.type == "cuda" else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise FeatstoreError("--precision fp16 needs --device cuda; use fp32 or bf16 on CPU")
    return precision


def preferred_memory_format(model: torch.nn.Module) -> torch.memory_format:
    """channels_last for convolutional models: oneDNN and cuDNN run NHWC convolutions faster (~1.2x for
    resnet18 on this CPU). Recorded in the store config, since float32 results depend on the layout."""
    has_conv = any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    return torch.channels_last if has_conv else torch.contiguous_format


def chunk_batches(rows: range, batch_size: int) -> list[list[int]]:
    """A chunk's fixed partition into batches: the same rows always meet the same batch-mates."""
    return [list(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]


def forward_batch(tapper: Tapper, normalize: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                  device: torch.device, memory_format: torch.memory_format, logits_dtype: str, key: str,
                  rows: list[str | None]) -> tuple[list[np.ndarray], np.ndarray]:
    """One batch through the tapped model: its anchors and logits as host arrays of their stored types. `rows`
    names each image (None for a skipped one) for the refusal of a value the store cannot hold."""
    x = normalize(x.to(device, non_blocking=True)).contiguous(memory_format=memory_format)
    feats, logits = tapper.forward(x)
    # nothing its stored type cannot hold reaches a chunk (featstore.nets.stored_types)
    dtypes = [a.dtype for a in tapper.anchors] + [logits_dtype]
    check_storable(feats + [logits], dtypes, [f"anchor {a.name!r} of {key}" for a in tapper.anchors]
                   + [f"the logits of {key}"], rows)
    # one device->host copy per stored type (outside autocast: CPU autocast refuses float16 inputs to cat, which
    # broke --precision bf16 on CPU)
    with torch.autocast(device.type, enabled=False):
        parts = to_host(feats + [logits], dtypes)
    return parts[:-1], parts[-1]


def assemble_chunk(chunk: int, pieces: list, threads: int) -> ChunkData:
    """A chunk's batches (anchors, logits, skipped flags) joined into the one record the store commits."""
    n_anchors = len(pieces[0][0])
    features = [np.concatenate([p[0][a] for p in pieces]) for a in range(n_anchors)]
    return ChunkData(chunk, features, np.concatenate([p[1] for p in pieces]),
                     np.concatenate([p[2] for p in pieces]), threads)
