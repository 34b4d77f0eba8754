"""The build's computing half: one batch of images through a tapped model into host arrays of their stored types,
and a chunk's batches joined for the store. The job that reads images, prepares the store and commits chunks is
`featstore.workflows.build`; nothing here writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from featstore.errors import FeatstoreError, Name
from featstore.nets.extraction import Tapper
from featstore.nets.stored_types import row_peaks
from featstore.schema import PRECISIONS
from featstore.store.writer import ChunkData


def resolve_precision(precision: str, device: torch.device) -> str:
    """`--precision` made concrete for a device (auto: fp16 on CUDA, fp32 elsewhere), refusing what it cannot run."""
    if precision not in PRECISIONS:
        raise FeatstoreError(f"use one of {', '.join(PRECISIONS)}", field="precision", value=precision)
    if precision == "auto":
        return "fp16" if device.type == "cuda" else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise FeatstoreError("needs ", Name("device", "cuda"), "; use fp32 or bf16 on CPU", field="precision",
                             value=precision)
    return precision


def preferred_memory_format(model: torch.nn.Module) -> torch.memory_format:
    """channels_last for convolutional models: oneDNN and cuDNN run NHWC convolutions faster (~1.2x for
    resnet18 on this CPU). Recorded in the store config, since float32 results depend on the layout."""
    has_conv = any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    return torch.channels_last if has_conv else torch.contiguous_format


def chunk_batches(rows: range, batch_size: int) -> list[list[int]]:
    """A chunk's fixed partition into batches: the same rows always meet the same batch-mates."""
    return [list(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]


@dataclass
class HostOutputs:
    """One view of one batch on its way to the host: its arrays in one host tensor per stored type (pinned on CUDA,
    where the copies run behind the next batch's forward), where each array lies in them, and `row_peaks`, what the
    storable check reads. `arrays` waits for the copies (releasing the GIL) and returns them."""

    parts: list[torch.Tensor]
    places: list[tuple[int, int, int]]  # per array (anchors, then logits): part, first column, end column
    peaks: torch.Tensor  # [arrays, rows] float32
    copied: torch.cuda.Event | None = None

    def arrays(self) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """(features per anchor, logits, peaks) as numpy arrays, once the copies have landed."""
        if self.copied is not None:
            self.copied.synchronize()
        host = [p.numpy() for p in self.parts]
        values = [host[k][:, a:b] for k, a, b in self.places]
        return values[:-1], values[-1], self.peaks.numpy()


def forward_to_host(tapper: Tapper, normalize: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                    memory_format: torch.memory_format, dtypes: list[str]) -> HostOutputs:
    """One batch through the tapped model, its anchors and logits (in `dtypes`, the anchors' then the logits'
    stored types) on their way to the host: on CUDA nothing here waits for the device, so the caller can launch the
    next batch while this one computes and copies."""
    x = normalize(x).contiguous(memory_format=memory_format)
    feats, logits = tapper.forward(x)
    values = feats + [logits]
    # outside autocast: CPU autocast refuses float16 inputs to cat (which broke --precision bf16 on CPU)
    with torch.autocast(x.device.type, enabled=False):
        peaks = row_peaks(values)
        parts: list[torch.Tensor] = []
        places: list[tuple[int, int, int]] = [(0, 0, 0)] * len(values)
        for dtype in dict.fromkeys(dtypes):  # one device->host copy per stored type
            members = [i for i, d in enumerate(dtypes) if d == dtype]
            part = torch.empty(len(x), sum(values[i].shape[1] for i in members), dtype=getattr(torch, dtype),
                               device=x.device)
            column = 0
            for i in members:  # cast while copying into place: one pass over each array
                places[i] = (len(parts), column, column + values[i].shape[1])
                part[:, column : column + values[i].shape[1]].copy_(values[i])
                column += values[i].shape[1]
            parts.append(part)
    if x.device.type != "cuda":
        return HostOutputs(parts, places, peaks)
    host = [_pinned_copy(p) for p in parts]
    peaks_host = _pinned_copy(peaks)
    copied = torch.cuda.Event()
    copied.record()
    return HostOutputs(host, places, peaks_host, copied)


def _pinned_copy(x: torch.Tensor) -> torch.Tensor:
    """A copy of device tensor `x` into page-locked host memory, queued on the current stream (not waited for)."""
    return torch.empty(x.shape, dtype=x.dtype, pin_memory=True).copy_(x, non_blocking=True)


def assemble_chunk(chunk: int, pieces: list, threads: int, content: np.ndarray | None = None) -> ChunkData:
    """A chunk's batches (anchors, logits, skipped flags) joined into the one record the store commits."""
    n_anchors = len(pieces[0][0])
    features = [np.concatenate([p[0][a] for p in pieces]) for a in range(n_anchors)]
    return ChunkData(chunk, features, np.concatenate([p[1] for p in pieces]),
                     np.concatenate([p[2] for p in pieces]), threads, content)
