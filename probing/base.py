"""What a probe variant is: a class that makes one `AnchorProbe` per anchor; the trainer knows nothing else.

To add a variant, write one file in `probing/` with a subclass of `ProbeVariant`, decorate it with
`@register`, and import it in `probing/__init__.py`::

    @register
    class Centroid(ProbeVariant):
        name = "centroid"
        parameters = {"shrink": Real(0.1, ge=0, le=1, help="towards the grand mean")}
        def make(self, ctx: AnchorContext) -> AnchorProbe: ...

`parameters` declares each parameter once, with its type, default and range (`featstore.schema`): the base
class fills in the defaults and refuses unknown names, wrong types and values out of range (`--variant
centroid:shrink=2` is one line, before any work), so a variant never sees a value it did not declare. Constraints
between parameters go in `relations`.

Its `AnchorProbe` sees raw float32 features (standardise them yourself from `ctx.stats` if you want to),
learns from mini-batches, and finally returns a `FittedProbe`: something that predicts a block of raw stored
features (a class and a confidence per row), so that every variant lands in the same tables. Most return a
`LinearFit` (argmax(W x + b), weights in the raw feature space); `knn` returns the train rows it memorised.
A variant whose probes can share kernels overrides `make_group` instead (see `linear`): it then gets all anchors
of one width at once, as stacked features [G, n, D]. Probes stop by their own criterion; the plan only caps
the epochs. What a probe learns to predict is the label, or with `learns_from = "model"` the model's own
output distribution (softmax of the stored logits of the training view; `head-probe`, `tuned-lens`): the trainer
then hands it probability rows [n, C] where it would hand labels [n].
"""

from __future__ import annotations

import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from featstore.errors import FeatstoreError, FeatstoreWarning, Name
from featstore.records import check_variant_end
from featstore.schema import Value, shown

if TYPE_CHECKING:
    from featstore.store.reader import FeatureStore


@dataclass
class FeatureStats:
    """Per-feature statistics of one anchor over the rows its probe learns from, plus a random sample of them (for
    step sizes and the spectrum)."""

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
    fit_rows: np.ndarray | None = None  # positions in the store of the rows the batches carry (sorted)
    store_rows: int = 0  # rows of the store (the length of a per-row record such as knn's reference mask)
    resident: bool = False  # every fit row will be prepared and held in memory (`ProbeGroup.finish` may run)


@dataclass
class Plan:
    """The trainer's schedule: at most `max_epochs` epochs over the training rows, in mini-batches. Probes stop
    earlier by their own criterion (`ProbeGroup.end_epoch`)."""

    max_epochs: int
    batch_size: int
    train_on_val: bool = False  # True: batches also carry val rows, flagged, for heads refit on train+val


@dataclass(kw_only=True)
class FittedProbe(ABC):
    """A trained probe of one anchor and how its training ended. It predicts blocks of raw stored features, and
    says what the store keeps of it, so the trainer, the run and the store never ask what kind of probe it is."""

    info: dict = field(default_factory=dict)  # chosen hyper-parameters, history
    epochs: int = 0  # epochs this probe trained
    converged: bool = True  # False: it hit the epoch cap before its stopping criterion was met
    train_loss: float = float("nan")  # final objective on the rows it learnt from (NaN: not tracked)
    val_loss: float = float("nan")  # cross-entropy on the val rows
    val_accuracy: float = float("nan")  # on the val rows: of the label, or of the model's head (`learns_from`)

    @abstractmethod
    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(class int64 [n], confidence float32 [n]) of every row of a block of raw features x [n, D]."""

    @abstractmethod
    def arrays(self) -> dict[str, np.ndarray]:
        """What the store keeps of this fit (one fold), by array name; folds are stacked along a first axis."""

    def predict_rows(self, x: torch.Tensor, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """`predict` of the block x whose rows are the store's rows `rows` (knn leaves a row out of its own
        neighbours); the same as `predict` unless a probe needs to know which rows it predicts."""
        return self.predict(x)

    def unprojected(self, projection: torch.Tensor) -> FittedProbe:
        """This probe reading the raw features, given the fixed [D, D'] projection it was trained behind."""
        raise NotImplementedError(f"{type(self).__name__} cannot fold a projection into itself")

    def record(self) -> dict:
        """What the store and the `probe_fits` table keep about this fit (JSON-ready)."""
        ended = {"epochs": self.epochs, "converged": self.converged, "train_loss": self.train_loss,
                 "val_loss": self.val_loss, "val_accuracy": self.val_accuracy}
        return {**self.info, **{k: None if v != v else v for k, v in ended.items()}}  # NaN -> null


@dataclass
class LinearFit(FittedProbe):
    """A linear probe in the raw feature space: logits = x @ weight.T + bias; confidence = max softmax."""

    weight: torch.Tensor  # [C, D]
    bias: torch.Tensor  # [C]

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = x @ self.weight.T.to(x.device) + self.bias.to(x.device)
        conf, pred = torch.softmax(logits, dim=-1).max(dim=-1)
        return pred, conf

    def arrays(self) -> dict[str, np.ndarray]:
        return {"weight": self.weight.cpu().numpy(), "bias": self.bias.cpu().numpy()}

    def unprojected(self, projection: torch.Tensor) -> LinearFit:
        weight = self.weight @ projection.T.to(self.weight.device)
        return replace(self, weight=weight, info={**self.info, "projected_from": int(projection.shape[0]),
                                                  "projected_to": int(projection.shape[1])})


class UnconvergedProbe(FeatstoreWarning):
    """Some probe hit its epoch cap before its stopping criterion was met: its predictions may be off-optimum."""


class AnchorProbe(ABC):
    """The probe of one anchor while it trains."""

    @abstractmethod
    def step(self, x: torch.Tensor, y: torch.Tensor, is_val: torch.Tensor,
             report: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One update on a mini-batch (raw features). With `report`, return the batch's mean training loss and
        accuracy as 0-d tensors (for the progress bar)."""

    def end_epoch(self, epoch: int, val_x: torch.Tensor, val_y: torch.Tensor) -> bool:
        """Called after each epoch; return True when this probe needs no more epochs."""
        return False

    @abstractmethod
    def fitted(self, val_x: torch.Tensor, val_y: torch.Tensor) -> FittedProbe:
        """The final probe, in the raw feature space (val rows given for model selection)."""


class ProbeGroup(ABC):
    """The probes of several anchors of equal width, trained together on stacked features [G, n, D] so that one
    batched matmul serves them all. `anchors` lists the anchors still training, in the order of the stack."""

    anchors: list[int]
    resident: bool = False  # set by the trainer: every fit row is prepared and held in memory (`finish` may run)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """Stacked raw features [G, n, D] -> what `step` learns from (e.g. standardised). The trainer may prepare
        all training rows once and keep them, so this must not depend on the training state."""
        return x

    @abstractmethod
    def step(self, x: torch.Tensor, y: torch.Tensor, is_val: torch.Tensor,
             report: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One update of every anchor in `anchors` on its slice x[i] (prepared) of the same mini-batch."""

    @abstractmethod
    def end_epoch(self, epoch: int, val_x: Sequence[torch.Tensor], val_y: torch.Tensor) -> None:
        """After each epoch (`val_x[a]`: val features of anchor a): drop anchors that need no more epochs."""

    @abstractmethod
    def fitted(self, val_x: Sequence[torch.Tensor], val_y: torch.Tensor) -> dict[int, FittedProbe]:
        """Every anchor's final probe, in the raw feature space."""

    def batch_rows(self, rows: torch.Tensor) -> None:
        """The store rows (int64, on the device) of the mini-batch the next `step` gets, in its order (knn keeps
        which row each reference is, to leave a row out of its own neighbours). Nothing by default."""
        return None

    def ready_to_finish(self) -> bool:
        """True when some anchors want `finish` (only asked when `resident`)."""
        return False

    def finish(self, x: torch.Tensor, y: torch.Tensor, is_val: torch.Tensor,
               on_pass: Callable[[], None] | None = None) -> None:
        """Finish the waiting anchors on all fit rows at once: x [G, n, D] prepared, one slice per anchor in
        `anchors`, y [n], is_val [n] (which rows are val rows); `on_pass()` after every pass over the rows. They
        leave `anchors` when done."""
        raise NotImplementedError(f"{type(self).__name__} asked to finish but has no full-batch method")


class EachAnchor(ProbeGroup):
    """A group of independent `AnchorProbe`s (variants that do not batch their anchors)."""

    def __init__(self, probes: dict[int, AnchorProbe]):
        self.probes = probes
        self.anchors = list(probes)

    def step(self, x, y, is_val, report=False):
        shown = None
        for i, a in enumerate(self.anchors):
            shown = self.probes[a].step(x[i], y, is_val, report=report and i == len(self.anchors) - 1) or shown
        return shown

    def end_epoch(self, epoch, val_x, val_y) -> None:
        self.anchors = [a for a in self.anchors if not self.probes[a].end_epoch(epoch, val_x[a], val_y)]

    def fitted(self, val_x, val_y) -> dict[int, FittedProbe]:
        return {a: p.fitted(val_x[a], val_y) for a, p in self.probes.items()}


class ProbeVariant(ABC):
    """A family of probes with its parameters; `label` names its runs, `params` are recorded with them."""

    name: ClassVar[str]
    learns_from: ClassVar[str] = "labels"  # or "model": the model's own output distribution (stored logits)
    parameters: ClassVar[dict[str, Value]] = {}  # name -> Int/Real/Text with its default and range, declared once

    def __init__(self, **given):
        try:
            self.params = self.checked(given)
        except ValueError as e:
            raise FeatstoreError(f"probe variant {self.name}: {e}") from None

    @classmethod
    def checked(cls, given: dict) -> dict:
        """The declared defaults updated by `given`, each value checked against its declaration (ValueError
        naming the parameter otherwise), then the constraints between them (`relations`)."""
        unknown = sorted(set(given) - set(cls.parameters))
        if unknown:
            raise _no_parameter(cls, unknown[0])
        params = _defaults(cls)
        for key, value in given.items():
            try:
                params[key] = cls.parameters[key].check(value)
            except ValueError as e:
                raise ValueError(f"{key}={shown(value)} {e}") from None
        cls.relations(params)
        return params

    @classmethod
    def relations(cls, params: dict) -> None:
        """Constraints between parameters (e.g. lr_low <= lr_high): raise ValueError naming them. None here."""
        return None

    @property
    def label(self) -> str:
        return self.name

    label_params: ClassVar[tuple[str, ...]] = ()  # parameters `label` already shows
    identity_params: ClassVar[tuple[str, ...]] = ()  # parameters every id spells, default or not (knn's metric:
    # its default changed, and a run id must never mean one distance in an old database and another in a new one)
    cap_param: ClassVar[str] = "max_epochs"  # the parameter that sets the epoch cap (`Plan.max_epochs`)

    @property
    def canonical_id(self) -> str:
        """`label` plus every parameter that differs from the variant's defaults (and every `identity_params`),
        sorted: 'linear:epochs=12'. Equal settings always give the same id (12 and 12.0 alike), so it names runs and
        stored probes."""
        defaults = _defaults(type(self))
        changed = {k: v for k, v in self.params.items() if k not in self.label_params
                   and (defaults.get(k) != v or k in self.identity_params)}
        if not changed:
            return self.label
        return self.label + ":" + ",".join(f"{k}={self.shown_value(k, v)}" for k, v in sorted(changed.items()))

    def shown_value(self, key: str, value: float | str) -> str:
        """How a changed parameter is spelled in `canonical_id` (a variant may shorten one that is no name, such as
        a store location, whose slashes would nest run ids and store groups)."""
        return _number(value)

    def bind(self, store: FeatureStore, key: str, train_view: str) -> None:
        """Check this variant against the store and model it will probe, before any work (raise `FeatstoreError`,
        one line), and keep what it reads from them besides the features (knn's reference store, the head that
        `head-probe` and `tuned-lens` read through).
        Nothing here by default."""
        return None

    @abstractmethod
    def plan(self, n_fit: int) -> Plan: ...

    def make(self, ctx: AnchorContext) -> AnchorProbe:
        raise NotImplementedError(f"{type(self).__name__} implements make() or make_group()")

    def make_group(self, ctxs: Sequence[AnchorContext]) -> ProbeGroup:
        """The probes of anchors of equal width (default: one `make` per anchor, trained one by one)."""
        return EachAnchor({ctx.anchor: self.make(ctx) for ctx in ctxs})

    def batches_anchors(self) -> bool:
        """True: `make_group` gets every anchor of a width at once; False: one anchor per group."""
        return False

    def projection(self, dim: int, anchor: int, seed: int) -> torch.Tensor | None:
        """A fixed [D, D'] matrix applied to the features before anything else (capacity control), or None."""
        return None


def _defaults(cls: type[ProbeVariant]) -> dict:
    """A variant's default parameters, as declared."""
    return {key: value.default for key, value in cls.parameters.items()}


def _no_parameter(cls: type[ProbeVariant], key: str) -> ValueError:
    return ValueError(f"no parameter {key!r} (the parameters of {cls.name}: {', '.join(cls.parameters) or 'none'})")


def _number(value: float | str) -> str:
    """12 and 12.0 -> '12'; 0.1 -> '0.1'; 1e-4 -> '0.0001'; a word stays itself. The shortest spelling that reads
    back as the same float (Python's repr), so two different values never share a run id (0.10000000001 is not
    0.1)."""
    if isinstance(value, str):
        return value
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


VARIANTS: dict[str, type[ProbeVariant]] = {}

# Old names `--variant` still takes, for commands written before a rename (a database keeps its old runs under the
# old name): old name -> (the variant's name now, why it was renamed). A run lands under the new name, with a warning.
RENAMED: dict[str, tuple[str, str]] = {
    "lens": ("head-probe", "a linear probe read through the model's head, trained on KL to its output, not "
                           "Belrose et al.'s tuned lens (that is --variant tuned-lens)"),
}


class RenamedVariant(FeatstoreWarning):
    """A probe variant was asked for by its old name: the run lands under the new one."""

# What a probe variant (or an estimator probe's `name`) may be called: it becomes a run id's part, a store group's
# name and `--variant`'s word, so lower-case letters, digits and `_ . -`, 64 at most, starting with a letter or a
# digit: no '/' (nested groups), ':' (parameters), '@' (the training view), no '..' alone, no case that a
# case-insensitive file system would fold.
PROBE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


def check_probe_name(name: object, what: str = "name") -> str:
    """`name` if it matches `PROBE_NAME`, else one FeatstoreError naming the field and the rule."""
    if not isinstance(name, str) or not PROBE_NAME.fullmatch(name):
        shown_name = shown(name[:60] + "…" if isinstance(name, str) and len(name) > 64 else name)
        size = f" ({len(name)} characters)" if isinstance(name, str) and len(name) > 64 else ""
        raise FeatstoreError(f"{what}={shown_name}{size}: use letters a-z, digits, _ . - (1 to 64, the first a "
                             f"letter or digit): a probe name names runs and store groups")
    return check_variant_end(name, what)


def register(cls: type[ProbeVariant]) -> type[ProbeVariant]:
    """Make a variant known by its `name` (checked against `PROBE_NAME` now, not when a run fails inside Zarr); a
    second variant of the same name is refused (it would silently replace the first, and runs named after it would
    mean something else)."""
    check_probe_name(getattr(cls, "name", None), f"{getattr(cls, '__qualname__', cls)}.name")
    if cls.name in RENAMED:
        raise ValueError(f"{cls.name!r} is the old name of the probe variant {RENAMED[cls.name][0]!r} (old databases' "
                         f"runs keep it); give {cls.__qualname__} another name")
    if cls.name in VARIANTS and VARIANTS[cls.name] is not cls:
        raise ValueError(f"a probe variant named {cls.name!r} is already registered ({VARIANTS[cls.name].__module__}."
                         f"{VARIANTS[cls.name].__qualname__}); give {cls.__qualname__} another name")
    VARIANTS[cls.name] = cls
    return cls


def get_variant(spec: str) -> ProbeVariant:
    """'linear', 'paper', 'projected:dim=128' or 'knn:k=10,metric=euclidean' -> a variant instance. Every
    parameter is parsed and checked as the variant declares it: an unknown name, a value of the wrong type or out of
    range is one line."""
    name, _, args = spec.partition(":")
    if name in RENAMED:
        now, why = RENAMED[name]
        warnings.warn(RenamedVariant("is now ", Name("variant", now), f", {why}; this run lands as {now}",
                                     field="variant", value=name), stacklevel=2)
        name = now
    if name not in VARIANTS:
        raise FeatstoreError(f"unknown probe variant {name!r}: use one of {', '.join(sorted(VARIANTS))}")
    cls = VARIANTS[name]
    params: dict = {}
    try:
        for item in filter(None, args.split(",")):
            key, eq, text = (part.strip() for part in item.partition("="))
            if not eq:
                raise ValueError(f"{item!r} is no key=value pair")
            if key in params:
                raise ValueError(f"{key} is given twice")
            if key not in cls.parameters:
                raise _no_parameter(cls, key)
            try:
                params[key] = cls.parameters[key].parse(text)
            except ValueError as e:
                raise ValueError(f"{key}={text} {e}") from None
        cls.checked(params)
    except ValueError as e:
        raise FeatstoreError(f"{e}", field="variant", value=spec) from None
    return cls(**params)
