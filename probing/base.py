"""What a probe variant is: a class that makes one `AnchorProbe` per anchor; the trainer knows nothing else.

To add a variant, write one file in `probing/` with a subclass of `ProbeVariant`, decorate it with
`@register`, and import it in `probing/__init__.py`::

    @register
    class Centroid(ProbeVariant):
        name = "centroid"
        def make(self, ctx: AnchorContext) -> AnchorProbe: ...

Its `AnchorProbe` sees raw float32 features (standardise them yourself from `ctx.stats` if you want to),
learns from mini-batches, and finally returns weights in the raw feature space, so that a prediction is
always argmax(W x + b) on the stored features and every variant lands in the same tables.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from featstore.errors import FeatstoreError


@dataclass
class FeatureStats:
    """Per-feature train statistics of one anchor, plus a random sample of train rows (for step sizes)."""

    mean: torch.Tensor  # [D] float32
    std: torch.Tensor  # [D] float32, >= a small floor
    sample: torch.Tensor  # [S, D] raw float32 rows


@dataclass
class AnchorContext:
    """Everything a variant may use to set up the probe of one anchor."""

    anchor: int
    dim: int
    num_classes: int
    n_train: int  # rows the probe fits (train split)
    n_fit: int  # rows seen in training, val rows included when the variant trains twins on them
    stats: FeatureStats
    device: torch.device
    seed: int


@dataclass
class Plan:
    """The trainer's schedule: epochs over the training rows and the mini-batch size."""

    epochs: int
    batch_size: int
    train_on_val: bool = False  # True: batches also carry val rows, flagged, for heads refit on train+val
    eval_every_epoch: bool = False  # True: `end_epoch` receives the val rows each epoch


@dataclass
class FittedProbe:
    """A trained probe in the raw feature space: logits = x @ weight.T + bias."""

    weight: torch.Tensor  # [C, D]
    bias: torch.Tensor  # [C]
    info: dict = field(default_factory=dict)  # chosen hyper-parameters, val accuracy, history


class AnchorProbe(ABC):
    """The probe of one anchor while it trains."""

    @abstractmethod
    def step(self, x: torch.Tensor, y: torch.Tensor, is_val: torch.Tensor, progress: float,
             report: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One update on a mini-batch (raw features); `progress` runs from 0 to 1 over the plan. With `report`,
        return the batch's mean training loss and accuracy as 0-d tensors (for the progress bar)."""

    def end_epoch(self, epoch: int, val_x: torch.Tensor | None, val_y: torch.Tensor | None) -> bool:
        """Called after each epoch; return True when this probe needs no more epochs."""
        return False

    @abstractmethod
    def fitted(self, val_x: torch.Tensor, val_y: torch.Tensor) -> FittedProbe:
        """The final probe, in the raw feature space (val rows given for model selection)."""


class ProbeVariant(ABC):
    """A family of probes with its parameters; `label` names its runs, `params` are recorded with them."""

    name: ClassVar[str]

    def __init__(self, **params):
        self.params = params

    @property
    def label(self) -> str:
        return self.name

    @abstractmethod
    def plan(self, n_fit: int) -> Plan: ...

    @abstractmethod
    def make(self, ctx: AnchorContext) -> AnchorProbe: ...

    def projection(self, dim: int, anchor: int, seed: int) -> torch.Tensor | None:
        """A fixed [D, D'] matrix applied to the features before anything else (capacity control), or None."""
        return None


VARIANTS: dict[str, type[ProbeVariant]] = {}


def register(cls: type[ProbeVariant]) -> type[ProbeVariant]:
    VARIANTS[cls.name] = cls
    return cls


def get_variant(spec: str) -> ProbeVariant:
    """'linear', 'paper', 'projected' or 'projected:dim=128' -> a variant instance."""
    name, _, args = spec.partition(":")
    if name not in VARIANTS:
        raise FeatstoreError(f"unknown probe variant {name!r}: use one of {', '.join(sorted(VARIANTS))}")
    params = {}
    for item in filter(None, args.split(",")):
        key, _, value = item.partition("=")
        try:
            params[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else float(value)
        except ValueError as e:
            raise FeatstoreError(f"--variant {spec}: parameters are key=number pairs") from e
    try:
        return VARIANTS[name](**params)
    except TypeError as e:
        raise FeatstoreError(f"--variant {spec}: {e}") from e
