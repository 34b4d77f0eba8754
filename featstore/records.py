"""The results featstore persists, as typed records: what the jobs hand to `featstore.analytics.db`.

Each record's fields are the columns of its table (sql/schema.sql), so the writer inserts them by name and a new
column is one new field. This module imports neither torch nor DuckDB: the jobs that make these records and the
database layer that writes them both depend on it, and it on nothing but the shared defaults
(`featstore.schema`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from featstore.schema import VAL_FRAC


def _now() -> datetime:
    return datetime.now()


@dataclass(frozen=True)
class DatasetInfo:
    """Which image set a database holds (its `meta` rows): one database per image set and split."""

    fingerprint: str
    source: str
    store: str
    split_seed: int
    val_frac: float = VAL_FRAC


@dataclass(frozen=True)
class ModelSource:
    """One row of `model_sources`: the store a model's rows in a database come from, as the store identifies
    itself. A database holds one source per model: a probe (or a merged or attached database) whose images,
    weights or anchors differ is another experiment. `store` says where it was read, and is never compared (a
    store may be moved or copied)."""

    model: str
    store: str
    images: str  # the image table's checksums (ids, labels, paths), or its fingerprint for a store without them
    weights_id: str
    anchors: str  # "name:width" of every anchor in order, space-separated

    def differences(self, other: ModelSource, holder: str = "the database") -> list[str]:
        """What differs, one phrase each: `self` as a database (`holder`) holds it, `other` as a new source has it
        (a field either side does not know, in a database written before sources were recorded, is not compared)."""
        said = []
        if self.images and other.images and self.images != other.images:
            said.append(f"image table {other.images[:12]} where {holder} holds {self.images[:12]}")
        if self.weights_id and other.weights_id and self.weights_id != other.weights_id:
            said.append(f"weights {other.weights_id} where {holder} holds {self.weights_id}")
        if self.anchors and other.anchors and self.anchors != other.anchors:
            theirs, mine = _anchor_list(other.anchors), _anchor_list(self.anchors)
            if theirs == mine:  # the same names: their widths differ
                theirs, mine = other.anchors, self.anchors
            said.append(f"anchors {theirs} where {holder} holds {mine}")
        return said


def _anchor_list(anchors: str) -> str:
    names = [a.rsplit(":", 1)[0] for a in anchors.split()]
    return f"({len(names)}: {names[0]} … {names[-1]})" if len(names) > 2 else f"({len(names)}: {', '.join(names)})"


@dataclass(frozen=True)
class ProbeRun:
    """One row of `runs`: a set of probes' predictions of one view. `params` holds the variant's parameters and
    what identifies the probes (probe_id, probe_name, probe_version, split seed, weights)."""

    run_id: str
    model: str
    view: str
    train_view: str
    probe: str
    params: dict
    cross_fit: int
    seed: int
    n_images: int
    n_anchors: int
    store: str
    created_at: datetime = field(default_factory=_now)


@dataclass(frozen=True)
class RunRows:
    """Everything one run writes: its `runs` row, predictions [n, anchors], folds and per-(fold, anchor) fits."""

    run: ProbeRun
    image_id: np.ndarray  # [n]
    pred: np.ndarray  # [n, A] int
    conf: np.ndarray  # [n, A] float
    fold: np.ndarray | None = None  # [n] for cross-fit runs
    fits: list[tuple[int, int, dict]] = field(default_factory=list)  # (fold, anchor, fit record as JSON)

    def __post_init__(self) -> None:
        if self.pred.shape != (self.run.n_images, self.run.n_anchors) or self.conf.shape != self.pred.shape:
            raise ValueError(f"run {self.run.run_id}: predictions {self.pred.shape} and confidences "
                             f"{self.conf.shape} do not match n_images x n_anchors "
                             f"({self.run.n_images} x {self.run.n_anchors})")


@dataclass(frozen=True)
class Gate:
    """One row of `gates`: a run's learned exit gate (`featstore gate`), fitted on one split of its timelines."""

    run_id: str
    trained_on: str  # the split it was fitted on
    n_rows: int  # (image, anchor) rows it learnt from
    target: str
    features: dict  # names and standardisation
    weights: dict
    info: dict  # how the fit went
    created_at: datetime = field(default_factory=_now)


@dataclass(frozen=True)
class GateScores:
    """A gate and its score at every (image, anchor) of its run (`gate_scores`)."""

    gate: Gate
    image_id: np.ndarray  # [n]
    score: np.ndarray  # [n, A] float32
    learnt: np.ndarray  # [n] bool: an image the gate was fitted on

    def __post_init__(self) -> None:
        if self.score.shape[0] != len(self.image_id) or len(self.learnt) != len(self.image_id):
            raise ValueError(f"gate of {self.gate.run_id}: scores {self.score.shape}, {len(self.image_id)} images and "
                             f"{len(self.learnt)} learnt flags do not match")


@dataclass(frozen=True)
class CircuitRun:
    """One row of `circuit_runs`: an EAP-IG run of one model on one image set."""

    run_id: str
    model: str
    view: str  # the image set's name (a view name, or a zoo image set)
    layers: int
    heads: int
    ig_steps: int
    n_images: int
    n_edges: int
    params: dict
    created_at: datetime = field(default_factory=_now)


@dataclass(frozen=True)
class ZooRow:
    """One row of `zoo_runs`: a zoo model's top-1 accuracy and circuit run on one image set (role id or ood)."""

    study: str
    model: str
    dataset: str
    role: str
    accuracy: float
    n_images: int
    circuit_run: str
    created_at: datetime = field(default_factory=_now)


@dataclass(frozen=True)
class AnchorCost:
    """One row of `anchor_costs` (without the key columns): exiting at one anchor, per batch, in ms."""

    anchor: int
    ms: float  # network prefix up to this anchor's output
    flops: int
    probe_ms: float  # pooling + this anchor's linear probe + softmax
    probe_flops: int


@dataclass(frozen=True)
class ModelCost:
    """One measurement of a model on a device at a batch size: the whole model and every anchor's exit."""

    device: str
    batch_size: int
    ms: float  # the whole model, head included, no probes
    flops: int
    anchors: list[AnchorCost]
