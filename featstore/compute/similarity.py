"""Linear CKA between every pair of a model's anchors (docs/design.md §7), streamed over the store's chunks.

Kornblith et al. (ICML 2019) compare two layers by the HSIC of their linear kernels, which for centred features X
(n x p) and Y (n x q) is ||Xᵀ Y||_F² up to a factor: CKA(X, Y) = ||Xᵀ Y||² / (||Xᵀ X|| ||Yᵀ Y||). Nothing of size
n x n is needed: per pair of anchors the running sums Σ x yᵀ (p x q) and per anchor Σ x give the centred cross
products exactly, Xcᵀ Yc = Σ x yᵀ - (Σ x)(Σ y)ᵀ / n. The unbiased HSIC (Song et al. 2012; used for CKA by Nguyen
et al. 2021) of the kernels K = X Xᵀ, L = Y Yᵀ with zeroed diagonals reads only tr(K̃ L̃), 1ᵀK̃1, 1ᵀL̃1 and 1ᵀK̃L̃1,
and each of those is a sum over images of the same cross products plus Σ x ||y||², Σ y ||x||² and Σ ||x||² ||y||²
(see `_hsic`), so it streams exactly too. Both are invariant to shifting every row of an anchor by one vector, so
each pass subtracts the mean of the first chunk it reads (in float64) before summing: the sums then stay near
zero and the mean correction loses no digits.

The running sums of all pairs of 12 anchors 2048 wide take 2.6 GB in float64; `memory_budget` caps what one pass
holds, and pairs that do not fit are summed in further passes over the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from featstore.errors import FeatstoreError
from featstore.schema import VIEW
from featstore.store.reader import FeatureStore, model_key, read_rows
from featstore.threads import ThreadPolicy

Pair = tuple[int, int]
# the rows of one chunk for the anchors asked for: anchor index -> (rows x width) array
Blocks = Callable[[Sequence[int]], Iterator[dict[int, np.ndarray]]]
DEFAULT_BUDGET = 1 << 30


@dataclass(frozen=True)
class CkaResult:
    """CKA between every pair of anchors (symmetric, diagonal 1) and how it was computed."""

    key: str
    view: str
    anchors: list[str]
    matrix: np.ndarray  # [anchors, anchors]
    unbiased: bool
    n_images: int
    passes: int
    threads: int | list[int] | None

    @property
    def estimator(self) -> str:
        return "unbiased" if self.unbiased else "biased"


def plan_passes(dims: Sequence[int], memory_budget: int, unbiased: bool = False) -> list[list[Pair]]:
    """The pairs a <= b of anchors, in order, packed into passes whose running sums fit `memory_budget` bytes (a
    pair larger than the budget gets a pass of its own)."""
    passes: list[list[Pair]] = [[]]
    held = 0
    for a in range(len(dims)):
        for b in range(a, len(dims)):
            size = 8 * (dims[a] * dims[b] + (dims[a] + dims[b] if unbiased else 0))
            if passes[-1] and held + size > memory_budget:
                passes.append([])
                held = 0
            passes[-1].append((a, b))
            held += size
    return passes


class _Sums:
    """One pass's running sums (float64) over shifted rows: per anchor Σ x, Σ ||x||²; per pair Σ x yᵀ and, for
    the unbiased estimator, Σ x ||y||², Σ y ||x||², Σ ||x||² ||y||²."""

    def __init__(self, pairs: Sequence[Pair], unbiased: bool):
        self.pairs, self.unbiased = list(pairs), unbiased
        self.anchors = sorted({a for pair in pairs for a in pair})
        self.n = 0
        self.shift: dict[int, torch.Tensor] = {}
        self.s: dict[int, torch.Tensor] = {}
        self.q: dict[int, float] = {}
        self.c: dict[Pair, torch.Tensor] = {}
        self.u: dict[Pair, torch.Tensor] = {}
        self.v: dict[Pair, torch.Tensor] = {}
        self.w: dict[Pair, float] = {}

    def add(self, block: dict[int, np.ndarray]) -> None:
        rows = len(next(iter(block.values())))
        if not rows:
            return
        x = {a: torch.from_numpy(np.asarray(block[a])).to(torch.float64) for a in self.anchors}
        if not self.shift:
            self.shift = {a: x[a].mean(0) for a in self.anchors}
        x = {a: x[a] - self.shift[a] for a in self.anchors}
        d = {a: (x[a] * x[a]).sum(1) for a in self.anchors}
        for a in self.anchors:
            self.s[a] = self.s.get(a, 0) + x[a].sum(0)
            self.q[a] = self.q.get(a, 0.0) + float(d[a].sum())
        for a, b in self.pairs:
            self.c[a, b] = self.c.get((a, b), 0) + x[a].T @ x[b]
            if self.unbiased:
                self.u[a, b] = self.u.get((a, b), 0) + x[a].T @ d[b]
                self.v[a, b] = self.v.get((a, b), 0) + x[b].T @ d[a]
                self.w[a, b] = self.w.get((a, b), 0.0) + float(d[a] @ d[b])
        self.n += rows

    def hsic(self, a: int, b: int) -> float:
        """The (biased or unbiased) HSIC of the linear kernels of anchors a and b, up to a factor common to all
        pairs of the same n."""
        c, n = self.c[a, b], self.n
        if not self.unbiased:
            centred = c - torch.outer(self.s[a], self.s[b]) / n
            return float((centred * centred).sum())
        sa, sb = self.s[a], self.s[b]
        trace = float((c * c).sum()) - self.w[a, b]  # tr(K̃ L̃)
        ka, kb = float(sa @ sa) - self.q[a], float(sb @ sb) - self.q[b]  # 1ᵀK̃1, 1ᵀL̃1
        kl = float(sa @ c @ sb) - float(sa @ self.u[a, b]) - float(self.v[a, b] @ sb) + self.w[a, b]  # 1ᵀK̃L̃1
        return (trace + ka * kb / ((n - 1) * (n - 2)) - 2 * kl / (n - 2)) / (n * (n - 3))


def cka_matrix(dims: Sequence[int], blocks: Blocks, unbiased: bool = False,
               memory_budget: int = DEFAULT_BUDGET, on_block: Callable[[], None] | None = None) -> tuple[
                   np.ndarray, int, int]:
    """CKA of every pair of anchors of widths `dims` from `blocks` (called once per pass with the anchors it
    needs); returns the matrix, the number of rows and of passes. `on_block` hears of every block summed."""
    passes = plan_passes(dims, memory_budget, unbiased)
    hsic: dict[Pair, float] = {}
    n = 0
    for pairs in passes:
        sums = _Sums(pairs, unbiased)
        for block in blocks(sums.anchors):
            sums.add(block)
            if on_block is not None:
                on_block()
        if unbiased and sums.n < 4:
            raise FeatstoreError(f"the unbiased HSIC needs at least 4 images (got {sums.n})")
        if sums.n < 2:
            raise FeatstoreError(f"CKA needs at least 2 images (got {sums.n})")
        n = sums.n
        hsic.update({pair: sums.hsic(*pair) for pair in pairs})
    out = np.empty((len(dims), len(dims)))
    with np.errstate(invalid="ignore", divide="ignore"):
        for (a, b), value in hsic.items():
            out[a, b] = out[b, a] = value / np.sqrt(hsic[a, a] * hsic[b, b])
    return out, n, len(passes)


def store_blocks(store: FeatureStore, key: str, view: str) -> tuple[Blocks, int]:
    """The usable (not skipped) rows of a view, chunk by chunk, for `cka_matrix`; and the number of chunks."""
    group = store.view_group(key, view)["anchors"]
    names = [a.name for a in store.anchors(key)]
    keep = ~store.read_skipped(key, view)
    chunk, total = store.chunk_rows(key), len(keep)

    def blocks(anchors: Sequence[int]) -> Iterator[dict[int, np.ndarray]]:
        arrays = [group[names[a]] for a in anchors]
        for start in range(0, total, chunk):
            stop = min(total, start + chunk)
            rows = keep[start:stop]
            yield {a: x[rows] for a, x in zip(anchors, read_rows(arrays, start, stop), strict=True)}

    return blocks, -(-total // chunk)


def check_view(store: FeatureStore, key: str, view: str) -> None:
    """A view the store has for this model, else one line naming those it has."""
    if view not in store.views(key):
        raise FeatstoreError(f"store {store.location} has no view {view!r} of {key!r} (it has "
                             f"{', '.join(store.views(key)) or 'none'})")


def anchor_cka(store: str | FeatureStore, model: str, view: str = VIEW, unbiased: bool = False,
               memory_budget: int = DEFAULT_BUDGET, threads: int | None = None,
               progress: bool = False) -> CkaResult:
    """Linear CKA between every pair of a model's anchors on one view of a store, from every usable image: the
    representational similarity of the anchors, label-free (the store is only read)."""
    fs = store if isinstance(store, FeatureStore) else FeatureStore(store)
    key = model_key(model)
    anchors = fs.anchors(key)
    check_view(fs, key, view)
    blocks, chunks = store_blocks(fs, key, view)
    dims = [a.dim for a in anchors]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=chunks * len(plan_passes(dims, memory_budget, unbiased)), unit="chunk",
                   desc=f"cka {key}/{view}", dynamic_ncols=True, leave=False)
    with ThreadPolicy(threads) as policy:
        def tick() -> None:
            policy.update()
            if bar is not None:
                bar.update()

        try:
            matrix, n, passes = cka_matrix(dims, blocks, unbiased, memory_budget, tick)
        finally:
            if bar is not None:
                bar.close()
    return CkaResult(key, view, [a.name for a in anchors], matrix, unbiased, n, passes, policy.recorded)
