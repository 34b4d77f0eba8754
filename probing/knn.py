"""`knn`: a k-nearest-neighbour probe per anchor, as in Baldock, Maennel and Neyshabur, "Deep Learning Through the
Lens of Example Difficulty" (NeurIPS 2021), whose prediction depth reads k-NN classifiers (k = 30) on each
layer's embeddings.

- References: the train split's rows of the training view, on the raw pooled features (no standardisation).
  "Training" is one pass that memorises them, as they come by in the trainer's mini-batches (float16, which is
  what the store holds, so the copy is exact); the store keeps which rows they were (`reference`, a mask over
  its rows per fold), never a second copy of the features.
- Metric: `cosine` (default; distance 1 - cos) or `euclidean`. A row of zeros has cosine 0 to everything.
- Vote: the k nearest references vote with equal weight; a tie between classes goes to the class whose voters
  are nearer (smaller mean distance). Confidence = the winning class's share of the k votes.
- Prediction: blocks of query rows against tiles of `tile` references, keeping a running top k, so memory is the
  references (rows x width x 2 bytes per anchor) plus one block x tile of scores, whatever the sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from featstore.probing.base import AnchorContext, FittedProbe, Plan, ProbeGroup, ProbeVariant, register
from featstore.schema import Int, Text

METRICS = ("cosine", "euclidean")


@register
class Knn(ProbeVariant):
    name = "knn"

    parameters = {
        "k": Int(30, ge=1, help="neighbours that vote"),
        "metric": Text("cosine", choices=METRICS, help="cosine (distance 1 - cos) or euclidean"),
        "tile": Int(8192, ge=1, help="references scored at a time (memory: a query block x tile scores)"),
    }

    def plan(self, n_fit: int) -> Plan:
        return Plan(max_epochs=1, batch_size=8192, train_on_val=False)

    def batches_anchors(self) -> bool:
        return True

    def make_group(self, ctxs) -> ProbeGroup:
        return Memorise(ctxs, self.params["k"], self.params["metric"], self.params["tile"])


class Memorise(ProbeGroup):
    """The anchors of one width: one pass over the train rows copies them, transposed and float16, into buffers
    of the final size (no second copy is ever made), with their labels."""

    def __init__(self, ctxs, k: int, metric: str, tile: int):
        ctx0: AnchorContext = ctxs[0]
        self.anchors = [ctx.anchor for ctx in ctxs]
        self.members = list(self.anchors)  # the order of the stacked features
        self.k, self.metric, self.tile = k, metric, tile
        self.reference = np.zeros(ctx0.store_rows, dtype=bool)
        if ctx0.fit_rows is not None:
            self.reference[ctx0.fit_rows] = True
        self.refs_t = [torch.empty(ctx.dim, ctx0.n_fit, dtype=torch.float16, device=ctx0.device) for ctx in ctxs]
        self.labels = torch.empty(ctx0.n_fit, dtype=torch.long, device=ctx0.device)
        self.rows = 0

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        return x.half()  # the stored precision: an exact copy at half the memory of float32

    def step(self, x, y, is_val, report=False):
        stop = self.rows + len(y)
        if stop > len(self.labels):
            raise RuntimeError(f"knn was handed {stop} rows to memorise, more than the {len(self.labels)} it expected")
        for refs_t, part in zip(self.refs_t, x, strict=True):
            refs_t[:, self.rows : stop] = part.T
        self.labels[self.rows : stop] = y
        self.rows = stop
        return None

    def end_epoch(self, epoch, val_x, val_y) -> None:
        self.anchors = []  # one pass memorises everything

    def fitted(self, val_x, val_y) -> dict[int, NeighbourFit]:
        labels = self.labels[: self.rows]
        out = {}
        for refs_t, a in zip(self.refs_t, self.members, strict=True):  # no val accuracy: the val rows are
            # predicted with every other row (probe_accuracy_by_split), so it is not computed twice here
            out[a] = NeighbourFit(refs_t[:, : self.rows], labels, self.k, self.metric, self.tile, self.reference,
                                  info={"references": self.rows, "metric": self.metric, "k": self.k}, epochs=1)
        return out


@dataclass
class NeighbourFit(FittedProbe):
    """The references of one anchor (transposed, [D, n] float16) and their labels; predicts by majority vote."""

    refs_t: torch.Tensor
    labels: torch.Tensor  # [n] int64
    k: int
    metric: str
    tile: int
    reference: np.ndarray  # [store rows] bool: which rows of the store the references are

    def __post_init__(self) -> None:
        squares = torch.cat([self.refs_t[:, i : i + self.tile].float().pow(2).sum(dim=0)  # tile by tile
                             for i in range(0, self.refs_t.shape[1], self.tile)])
        # cosine ranks by x.r / |r|; euclidean by x.r - |r|^2 / 2 (= (|x|^2 - d^2) / 2)
        self.scale = squares.sqrt().clamp_min(1e-30).reciprocal() if self.metric == "cosine" else None
        self.offset = None if self.metric == "cosine" else -0.5 * squares

    def arrays(self) -> dict[str, np.ndarray]:
        return {"reference": self.reference}

    def neighbours(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Distances [n, k'] (ascending) and reference indices [n, k'] of the k' = min(k, references) nearest."""
        best = index = None
        for start in range(0, self.refs_t.shape[1], self.tile):
            stop = min(start + self.tile, self.refs_t.shape[1])
            tile = self.refs_t[:, start:stop].to(x.device).float()
            if self.scale is not None:  # cosine: the reference norms folded into the tile, not into the scores
                score = x @ tile.mul_(self.scale[start:stop].to(x.device))
            else:
                score = torch.addmm(self.offset[None, start:stop].to(x.device), x, tile)
            score, pos = score.topk(min(self.k, score.shape[1]), dim=1)
            pos += start
            if best is not None:  # merge with the running top k
                score, pick = torch.cat([best, score], dim=1).topk(min(self.k, best.shape[1] + score.shape[1]), dim=1)
                pos = torch.cat([index, pos], dim=1).gather(1, pick)
            best, index = score, pos
        norms = x.norm(dim=1, keepdim=True)
        if self.metric == "cosine":
            distance = (1.0 - best / norms.clamp_min(1e-30)).clamp_min(0)
            distance = torch.where(norms > 0, distance, torch.ones_like(distance))
        else:
            distance = (norms * norms - 2.0 * best).clamp_min(0).sqrt()
        return distance, index

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        distance, index = self.neighbours(x.float())
        votes = self.labels.to(x.device)[index]  # [n, k]
        same = votes[:, :, None] == votes[:, None, :]  # [n, k, k]: neighbours j and i vote alike (no [n, classes])
        counts = same.sum(dim=2)  # per neighbour, the votes of its class
        spread = (same * distance[:, None, :]).sum(dim=2)  # per neighbour, the distance sum of its class's voters
        # most votes first; among classes with equal votes the smaller distance sum (a fraction below one vote)
        key = counts - 0.5 * spread / (distance.sum(dim=1, keepdim=True) + 1e-30)
        winner = key.argmax(dim=1, keepdim=True)
        return votes.gather(1, winner).squeeze(1), (counts.gather(1, winner).squeeze(1) / index.shape[1]).float()
