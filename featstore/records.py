"""The results featstore persists, as typed records: what the jobs hand to `featstore.analytics.db`.

Each record's fields are the columns of its table (sql/schema.sql), so the writer inserts them by name and a new
column is one new field; a probe run composes its `RunIdentity`, whose parts `ProbeRun.columns` spells out. This
module imports neither torch nor DuckDB: the jobs that make these records and the database layer that writes them
both depend on it, and it on nothing but the shared defaults and rules (`featstore.schema`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from featstore.errors import FeatstoreError
from featstore.schema import VAL_FRAC, check_field


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


# what follows the model, view and variant in a run id, and the variant in a probe name, each part at most once and
# in this order (a count without leading zeros: "cf0" or "seed01" is never written)
_RUN_TAIL = re.compile(r"(?:/train=(?P<train>[^/@]+))?(?:/cf(?P<cf>[1-9][0-9]*))?(?:/seed(?P<seed>[1-9][0-9]*))?"
                       r"(?P<streamed>/streamed)?")
_NAME_TAIL = re.compile(r"(?:-cf(?P<cf>[1-9][0-9]*))?(?:-seed(?P<seed>[1-9][0-9]*))?(?P<streamed>-streamed)?"
                        r"@(?P<train>[^/@]+)")
_LOOKS_LIKE_TAIL = re.compile(r"-(?:cf|seed)[1-9][0-9]*$|-streamed$")


def ends_like_a_run_part(name: str) -> bool:
    """Whether `name` ends like a probe name's cross-fit, seed or streamed part ('-cf2', '-seed1', '-streamed'): a
    variant so named would have probe names that read back as another run's."""
    return bool(_LOOKS_LIKE_TAIL.search(name))


def check_variant_end(name: str, what: str = "probe_id") -> str:
    """`name` (a variant's name or id) unless it `ends_like_a_run_part`: one FeatstoreError naming `what`."""
    if ends_like_a_run_part(name):
        raise FeatstoreError(f"{what}={name!r} ends like a probe name's cross-fit, seed or streamed part (-cf<k>, "
                             f"-seed<s>, -streamed), so its runs would read back as others; give it another name")
    return name


@dataclass(frozen=True)
class RunIdentity:
    """What names a probe run: every parameter that changes its results. It makes the run id
    ('resnet50/gaussian_noise-1/linear:max_epochs=12/train=clean/cf5/seed1/streamed') and the name its probes are
    stored under in the store ('linear:max_epochs=12-cf5-seed1-streamed@clean', shared by every view the probes
    predict), and parses both back (`parse`, `from_probe_name`): the one place either is spelled or read, a circuit
    run's id too (`circuit`). Its seed and cross-fit follow the rules `FIELDS` declares for them.

    `probe_id` is the variant's canonical id (`ProbeVariant.canonical_id`: its label and every changed parameter);
    `streamed` says the probes trained on shuffled chunks because the fit rows did not fit the memory budget (other
    batches, other results)."""

    model: str
    view: str
    probe_id: str
    train_view: str
    cross_fit: int = 0
    seed: int = 0
    streamed: bool = False

    def __post_init__(self) -> None:
        for what in ("model", "view", "probe_id", "train_view"):
            value = getattr(self, what)
            if not isinstance(value, str) or not value or "/" in value or (what != "model" and "@" in value):
                raise FeatstoreError(f"{what}={value!r}: a run identity's {what} is a non-empty name without '/'"
                                     f"{'' if what == 'model' else ' or @'}")
        check_variant_end(self.probe_id)
        for what in ("cross_fit", "seed"):  # the rule the option, the config and the file of that name follow
            value = getattr(self, what)
            object.__setattr__(self, what, check_field(what, value.item() if isinstance(value, np.generic) else value))
        if not isinstance(self.streamed, bool | np.bool_):
            raise FeatstoreError("a run identity's streamed is True or False", field="streamed", value=self.streamed)
        object.__setattr__(self, "streamed", bool(self.streamed))

    @classmethod
    def circuit(cls, model: str, image_set: str, ig_steps: int) -> RunIdentity:
        """The identity of an EAP-IG circuit run of `model` on an image set: the attribution ('eap-ig<steps>') in
        a variant's place, so its id is '<model>/<image set>/eap-ig<steps>'."""
        return cls(model, image_set, f"eap-ig{check_field('ig_steps', ig_steps)}", image_set)

    @staticmethod
    def begins_run_id(text: str) -> bool:
        """Whether `text` starts like a run id: a model key (never with '=') and a '/'. A piece of a comma list
        that does not continues the id before it, whose variant spells several parameters."""
        model, slash, _ = text.partition("/")
        return bool(slash) and "=" not in model

    @property
    def run_id(self) -> str:
        """<model>/<view>/<probe_id>[/train=<train view>][/cf<k>][/seed<s>][/streamed] (a part only where it is
        not the default: training on the view predicted, no cross-fit, seed 0, not streamed)."""
        rid = f"{self.model}/{self.view}/{self.probe_id}"
        if self.train_view != self.view:
            rid += f"/train={self.train_view}"
        if self.cross_fit:
            rid += f"/cf{self.cross_fit}"
        if self.seed:
            rid += f"/seed{self.seed}"
        if self.streamed:
            rid += "/streamed"
        return rid

    @property
    def label(self) -> str:
        """The run id less its model and view ('linear:C=0.5/cf5/seed1'): what tells apart the runs of one model
        on one view."""
        return self.run_id.split("/", 2)[2]

    @property
    def probe_name(self) -> str:
        """Where the run's probes live in the store, <model>/probes/<name>/: the same for every view they predict."""
        return (self.probe_id + (f"-cf{self.cross_fit}" if self.cross_fit else "")
                + (f"-seed{self.seed}" if self.seed else "") + ("-streamed" if self.streamed else "")
                + f"@{self.train_view}")

    @classmethod
    def parse(cls, run_id: str) -> RunIdentity:
        """The identity whose `run_id` is exactly `run_id`; anything else (another order of its parts, a default
        spelled out, a part it has not) is refused in one line naming it."""
        parts = run_id.split("/", 3) if isinstance(run_id, str) else []
        found = _RUN_TAIL.fullmatch("/" + parts[3]) if len(parts) == 4 else _RUN_TAIL.fullmatch("")
        identity = None
        if len(parts) >= 3 and found:
            try:
                identity = cls(parts[0], parts[1], parts[2], found["train"] or parts[1], int(found["cf"] or 0),
                               int(found["seed"] or 0), bool(found["streamed"]))
            except FeatstoreError:
                identity = None
        if identity is None or identity.run_id != run_id:
            raise FeatstoreError(f"{run_id!r} is no run id (<model>/<view>/<variant>[/train=<view>][/cf<k>]"
                                 f"[/seed<s>][/streamed])")
        return identity

    @classmethod
    def from_probe_name(cls, model: str, view: str, name: str) -> RunIdentity:
        """The identity of the run of `model` on `view` whose probes are stored as `name` (the inverse of
        `probe_name`); a name `probe_name` never makes is refused in one line."""
        head, at, _ = name.rpartition("@") if isinstance(name, str) else ("", "", "")
        identity = None
        for cut in range(1, len(head) + 1) if at else ():  # the shortest variant id whose rest is a name's tail
            found = _NAME_TAIL.fullmatch(name, cut)
            if found:
                try:
                    identity = cls(model, view, name[:cut], found["train"], int(found["cf"] or 0),
                                   int(found["seed"] or 0), bool(found["streamed"]))
                except FeatstoreError:
                    identity = None
                break
        if identity is None or identity.probe_name != name:
            raise FeatstoreError(f"{name!r} is no probe name (<variant>[-cf<k>][-seed<s>][-streamed]@<train view>)")
        return identity


@dataclass(frozen=True)
class ProbeRun:
    """One row of `runs`: a set of probes' predictions of one view. Its `identity` fills the run id, model, view,
    train view, cross-fit, seed, probe_id, probe_name and streamed columns (`columns`), and nothing else records
    them; `params` holds the variant's own parameters (`ProbeVariant.params`) and the job's settings (split seed,
    val fraction, weights, featstore's version); `C` is the L2 strength the variant pins (`linear:C=0.5`), None
    where its search chooses one per anchor (`probe_fits.C`) or it has none."""

    identity: RunIdentity
    probe: str  # the variant's name (its family)
    params: dict
    n_images: int
    n_anchors: int
    store: str
    probe_version: str | None = None  # the stored weights' version
    C: float | None = None
    created_at: datetime = field(default_factory=_now)

    @property
    def run_id(self) -> str:
        return self.identity.run_id

    def columns(self) -> dict[str, object]:
        """The row as `runs` holds it, column by column: the identity's parts and the names it makes."""
        i = self.identity
        return {"run_id": i.run_id, "model": i.model, "view": i.view, "train_view": i.train_view,
                "probe": self.probe, "params": self.params, "cross_fit": i.cross_fit, "seed": i.seed,
                "n_images": self.n_images, "n_anchors": self.n_anchors, "store": self.store,
                "created_at": self.created_at, "probe_id": i.probe_id, "probe_name": i.probe_name,
                "probe_version": self.probe_version, "streamed": i.streamed, "C": self.C}


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
