"""Rows of one (model, view) of the store as float32 tensors, held in memory or streamed chunk by chunk.

Both paths hand the trainer the same thing, blocks of rows with every anchor's features, and differ only in
where the rows come from: a shuffled epoch (`blocks` with an rng) is chunks in a random order, rows shuffled
within each chunk, whether the chunks are read from the store or from memory, so the same seed gives the same
batches either way. (The trainer's faster path, all fit rows prepared once and permuted as a whole, needs
their prepared copy to fit the budget too: `holds_prepared`; a run that cannot take it is named `streamed`.)

A chunk's arrays are read together (one request per anchor, all in flight at once: object storage answers each
after a round trip, local disk decodes them in parallel), and while the trainer works on one chunk the next is
read, so streaming holds at most two chunks beside the budgeted features.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from featstore.nets.anchors import Anchor
from featstore.probing.base import FeatureStats
from featstore.store.reader import FeatureStore
from featstore.store.rows import read_rows

Block = tuple[np.ndarray, list[torch.Tensor]]
IN_MEMORY_BLOCK = 2048


def holds_prepared(source_bytes: int, prepared_bytes: int, budget: int) -> bool:
    """True when a source's rows and the prepared copy of the fit rows both fit the memory budget: the trainer
    then permutes all fit rows every epoch (`ResidentBatches`), else it reads shuffled chunks."""
    return source_bytes + prepared_bytes <= budget


class FeatureSource:
    """The rows `rows` of some anchors' features, as the trainer reads them: from a view of the store
    (`FeatureSource(store, ...)`) or from arrays already in memory (`FeatureSource.from_arrays`), one code path
    from there on (the projections moved to the device, the rows held in memory when the budget allows)."""

    def __init__(self, store: FeatureStore, key: str, view: str, anchors: Sequence[Anchor], rows: np.ndarray,
                 device: torch.device, memory_budget: int,
                 projections: Sequence[torch.Tensor | None] | None = None):
        group = store.view_group(key, view)["anchors"]
        self._hold([group[a.name] for a in anchors], store.chunk_rows(key), store.num_images, rows, device,
                   memory_budget, projections)

    @classmethod
    def from_arrays(cls, arrays: Sequence[np.ndarray], device: torch.device, memory_budget: int,
                    projections: Sequence[torch.Tensor | None] | None = None) -> FeatureSource:
        """Every row of in-memory features, one [rows, width] array per anchor (rows 0..n-1, one chunk), held on
        the device whatever the budget (they are in memory already): what `fs.Probe` fits on, so that one anchor
        is fitted exactly as a run fits it from the store."""
        arrays = [np.asarray(a) for a in arrays]
        n = len(arrays[0])
        if any(a.ndim != 2 or len(a) != n for a in arrays):
            raise ValueError(f"arrays of shapes {[a.shape for a in arrays]}: give [rows, width] arrays of equal rows")
        source = cls.__new__(cls)
        source._hold(arrays, max(n, 1), n, np.arange(n), device, memory_budget, projections, in_memory=True)
        return source

    def _hold(self, arrays: Sequence, chunk_rows: int, num_rows: int, rows: np.ndarray, device: torch.device,
              memory_budget: int, projections: Sequence[torch.Tensor | None] | None,
              in_memory: bool | None = None) -> None:
        """Both constructors' common part: `arrays` are Zarr arrays of the store or numpy arrays of `num_rows`
        rows each; they are read into memory (float32, on the device) when `in_memory`, by default when they fit
        the budget."""
        self.arrays = list(arrays)
        self.chunk_rows = chunk_rows
        self.device = device
        self.projections = [None if p is None else p.to(device) for p in (projections or [None] * len(arrays))]
        self.rows = np.sort(rows)
        self.nbytes = len(self.rows) * sum(int(a.shape[1]) for a in self.arrays) * 4  # held as float32
        self.memory_budget = memory_budget
        self.in_memory = self.nbytes <= memory_budget if in_memory is None else in_memory
        self._cache: list[torch.Tensor] | None = None
        self._where: np.ndarray | None = None
        if self.in_memory:
            self._where = np.full(num_rows, -1, dtype=np.int64)
            self._where[self.rows] = np.arange(len(self.rows))
            parts = [self._read_chunk(c, r) for c, r in self._by_chunk(self.rows)]
            self._cache = [torch.from_numpy(parts[0][a] if len(parts) == 1 else np.concatenate([p[a] for p in parts]))
                           .to(device).float() for a in range(len(self.arrays))]

    @property
    def dims(self) -> list[int]:
        return [int(a.shape[1]) if p is None else int(p.shape[1]) for a, p in zip(self.arrays, self.projections,
                                                                                strict=True)]

    def _by_chunk(self, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
        chunks = rows // self.chunk_rows
        bounds = np.flatnonzero(np.diff(chunks)) + 1
        return [(int(g[0]) // self.chunk_rows, g) for g in np.split(rows, bounds) if len(g)]

    def _read_chunk(self, chunk: int, rows: np.ndarray) -> list[np.ndarray]:
        start = chunk * self.chunk_rows
        stop = min(start + self.chunk_rows, int(self.arrays[0].shape[0]))
        if isinstance(self.arrays[0], np.ndarray):  # in-memory arrays (`from_arrays`)
            return [a[rows] for a in self.arrays]
        return [block[rows - start] for block in read_rows(self.arrays, start, stop)]

    def _tensors(self, raw: Sequence[np.ndarray | torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for x, p in zip(raw, self.projections, strict=True):
            t = torch.as_tensor(x).to(self.device, non_blocking=True)
            t = t if t.dtype == torch.float32 else t.float()
            out.append(t if p is None else t @ p)
        return out

    def gather(self, rows: np.ndarray) -> list[torch.Tensor]:
        """Features of `rows` (any order), as float32 on the device."""
        rows = np.asarray(rows)
        if self.in_memory:
            idx = torch.from_numpy(self._where[rows]).to(self.device)
            return self._tensors([c.index_select(0, idx) for c in self._cache])
        order = np.argsort(rows, kind="stable")
        parts = [self._read_chunk(c, r) for c, r in self._by_chunk(rows[order])]
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return self._tensors([np.concatenate([p[a] for p in parts])[inverse] for a in range(len(self.arrays))])

    def steps_per_epoch(self, rows: np.ndarray, batch_size: int) -> int:
        """Mini-batches one shuffled epoch over `rows` takes: batches never straddle a chunk."""
        sizes = [len(part) for _, part in self._by_chunk(np.sort(np.asarray(rows)))]
        return sum(-(-size // batch_size) for size in sizes)

    def blocks(self, rows: np.ndarray, rng: np.random.Generator | None = None) -> Iterator[Block]:
        """Blocks covering `rows` once: in row order, or shuffled by chunk (chunk order, then rows within each
        chunk) when `rng` is given, the same blocks whether the rows are in memory or streamed."""
        rows = np.sort(np.asarray(rows))
        if self.in_memory and rng is None:
            for i in range(0, len(rows), IN_MEMORY_BLOCK):
                part = rows[i : i + IN_MEMORY_BLOCK]
                yield part, self.gather(part)
            return
        groups = self._by_chunk(rows)
        if rng is not None:
            groups = [(chunk, rng.permutation(part)) for chunk, part in (groups[i] for i in
                                                                           rng.permutation(len(groups)))]
        if self.in_memory:  # the streamed schedule, from the rows in memory
            for _, part in groups:
                yield part, self.gather(part)
            return

        def read(group: tuple[int, np.ndarray]) -> list[np.ndarray]:
            chunk, part = group
            return self._read_chunk(chunk, part) if rng is None else self._reordered(chunk, part)

        with ThreadPoolExecutor(1, thread_name_prefix="featstore-prefetch") as pool:
            ahead = pool.submit(read, groups[0]) if groups else None
            for i, (_, part) in enumerate(groups):
                raw = ahead.result()
                ahead = pool.submit(read, groups[i + 1]) if i + 1 < len(groups) else None
                yield part, self._tensors(raw)

    def _reordered(self, chunk: int, part: np.ndarray) -> list[np.ndarray]:
        order = np.argsort(part, kind="stable")
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return [a[inverse] for a in self._read_chunk(chunk, part[order])]

    def stats(self, rows: np.ndarray, sample_size: int | None = None, seed: int = 0) -> list[FeatureStats]:
        """Per-anchor mean and std over `rows` (one pass, float64 sums) and a seeded sample of them
        (default: max(2048, 2 x the widest anchor) rows, enough for a stable covariance spectrum)."""
        sample_size = sample_size or max(2048, 2 * max(self.dims))
        sums = [torch.zeros(d, dtype=torch.float64, device=self.device) for d in self.dims]
        squares = [torch.zeros(d, dtype=torch.float64, device=self.device) for d in self.dims]
        for _, feats in self.blocks(rows):
            for a, x in enumerate(feats):
                x64 = x.double()
                sums[a] += x64.sum(dim=0)
                squares[a] += (x64 * x64).sum(dim=0)
        n = len(rows)
        sample_rows = np.random.default_rng(seed).choice(rows, size=min(sample_size, n), replace=False)
        sample = self.gather(sample_rows)
        out = []
        for a in range(len(self.arrays)):
            mean = sums[a] / n
            var = (squares[a] / n - mean * mean).clamp_min(0)
            std = var.sqrt().clamp_min(1e-6 * max(float(var.sqrt().max()), 1e-12) + 1e-12)
            out.append(FeatureStats(mean.float(), std.float(), sample[a]))
        return out

