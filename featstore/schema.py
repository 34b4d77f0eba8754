"""What values featstore accepts, declared once per name: the type and allowed range of every option, every key of
the study and zoo files, and every parameter of a probe variant.

A `Value` checks a Python value (`check`, as a record, a TOML file or a caller hands it) or parses command-line
text (`parse`, for `--variant linear:tol=0.01`), and refuses anything else with a message that says what it
must be. `FIELDS` holds the values shared by the CLI (`featstore.cli.options` turns each into a click type), the
records' `__post_init__` checks (`featstore.compute.specs`) and the TOML schemas (`featstore.workflows.toml_files`), so
that `--val-frac 1.5`, `val_frac = 1.5` and `ProbeConfig(val_frac=1.5)` are refused alike. Numbers are always
finite: NaN and infinity are no setting of anything. This module imports nothing of featstore but its errors.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from featstore.errors import FeatstoreError
from featstore.errors import shown as shown  # how every message quotes a value, read from here too


class Value:
    """One allowed kind of value; `check` returns it normalised (3.0 -> 3 for whole numbers) or raises
    ValueError('must be ..., not ...')."""

    default: Any = None
    help: str = ""

    def describe(self) -> str:
        raise NotImplementedError

    def check(self, value: Any) -> Any:
        raise NotImplementedError

    def parse(self, text: str) -> Any:
        """Command-line text -> a checked value."""
        return self.check(text)

    def refuse(self, value: Any) -> ValueError:
        """The error for `value` (the caller names the value and where it came from)."""
        return ValueError(f"must be {self.describe()}")


def _bound_text(kind: str, ge, gt, le, lt) -> str:
    parts = [f">= {_num(ge)}" if ge is not None else "", f"> {_num(gt)}" if gt is not None else "",
             f"<= {_num(le)}" if le is not None else "", f"< {_num(lt)}" if lt is not None else ""]
    bounds = " and ".join(p for p in parts if p)
    return f"{kind} {bounds}" if bounds else kind


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else format(x, "g")


@dataclass(frozen=True)
class Number(Value):
    """A finite number within bounds (`ge`/`gt` below, `le`/`lt` above; open or closed), or one of `also`."""

    default: Any = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    also: tuple = ()  # values allowed outside the bounds (cross-fit: 0, or K >= 2)
    help: str = ""
    whole: bool = field(default=False, init=False)

    def describe(self) -> str:
        text = _bound_text("a whole number" if self.whole else "a number", self.ge, self.gt, self.le, self.lt)
        if self.ge is not None and self.le is not None and self.whole and self.le - self.ge == 1:
            text = f"{_num(self.ge)} or {_num(self.le)}"
        return " or ".join([*map(_num, self.also), text]) if self.also else text

    def bounds(self) -> str:
        """The range in click's notation ('0<x<0.5', 'x>=1', '0 or x>=2'), for --help."""
        low = f"{_num(self.ge)}<=" if self.ge is not None else f"{_num(self.gt)}<" if self.gt is not None else ""
        high = f"<={_num(self.le)}" if self.le is not None else f"<{_num(self.lt)}" if self.lt is not None else ""
        text = f"{low}x{high}" if low or high else "x"
        if low and not high:
            text = f"x>={_num(self.ge)}" if self.ge is not None else f"x>{_num(self.gt)}"
        return " or ".join([*map(_num, self.also), text])

    def _in_range(self, x: float) -> bool:
        return ((self.ge is None or x >= self.ge) and (self.gt is None or x > self.gt)
                and (self.le is None or x <= self.le) and (self.lt is None or x < self.lt))

    def check(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.refuse(value)
        if self.whole:
            if not float(value).is_integer():
                raise self.refuse(value)
            value = int(value)
        else:
            value = float(value)
        if value in self.also or self._in_range(value):
            return value
        raise self.refuse(value)

    def parse(self, text: str) -> Any:
        try:
            number = float(text.strip())
        except ValueError:
            raise self.refuse(text) from None
        lost = _lost_in_float(text.strip(), number)
        if lost:
            raise ValueError(f"{lost}: give {self.describe()}")
        return self.check(int(number) if number.is_integer() and self.whole else number)


def _lost_in_float(text: str, number: float) -> str:
    """Why a number literal is no value though Python reads it: one beyond a float's range reads as inf, one below
    it as 0 (1e-400 as C would mean "search C"); '' where it reads as itself (the words inf and nan included: the
    bounds refuse them)."""
    if not re.search(r"[0-9]", text):
        return ""
    if math.isinf(number):
        return "is beyond a float's range (it reads as infinity)"
    if number == 0 and re.search(r"[1-9]", re.split(r"[eE]", text)[0]):
        return "is below a float's range (it reads as 0)"
    return ""


@dataclass(frozen=True)
class Int(Number):
    """A whole number (3.0 counts as 3) within bounds."""

    whole: bool = field(default=True, init=False)


@dataclass(frozen=True)
class Real(Number):
    """A finite number within bounds."""


@dataclass(frozen=True)
class Text(Value):
    """A string, optionally one of `choices`, optionally not empty."""

    default: Any = None
    choices: tuple[str, ...] = ()
    empty: bool = False
    help: str = ""

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(map(repr, self.choices))
        return "a string" if self.empty else "a non-empty string"

    def check(self, value: Any) -> Any:
        if not isinstance(value, str) or (self.choices and value not in self.choices) or (
                not self.empty and not value.strip()):
            raise self.refuse(value)
        return value


@dataclass(frozen=True)
class ListOf(Value):
    """A non-empty list (TOML array) of one kind of value: `seeds = "01"` is no list of seeds."""

    item: Value = field(default_factory=Text)
    default: Any = None
    help: str = ""

    def describe(self) -> str:
        return f"a non-empty list, each {self.item.describe()}"

    def check(self, value: Any) -> Any:
        if not isinstance(value, list) or not value:
            raise self.refuse(value)
        try:
            return [self.item.check(v) for v in value]
        except ValueError:
            raise self.refuse(value) from None


@dataclass(frozen=True)
class Either(Value):
    """The first of several kinds that accepts the value (`weights = "paper"` or `weights = ["paper", "none"]`)."""

    kinds: tuple[Value, ...] = ()
    default: Any = None
    help: str = ""

    def describe(self) -> str:
        return " or ".join(k.describe() for k in self.kinds)

    def check(self, value: Any) -> Any:
        for kind in self.kinds:
            try:
                return kind.check(value)
            except ValueError:
                continue
        raise self.refuse(value)


@dataclass(frozen=True)
class Names(Value):
    """A comma list of names ('clean,brightness-1') that names at least one: an empty one would run nothing."""

    default: Any = None
    help: str = ""

    def describe(self) -> str:
        return "a name or a comma list of names (such as clean,brightness-1)"

    def check(self, value: Any) -> Any:
        if not isinstance(value, str) or not comma_list(value):
            raise self.refuse(value)
        return value


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """'4GB', '512MB', '0', 1024 -> bytes (ValueError otherwise)."""
    if isinstance(text, bool) or not isinstance(text, str | int):
        raise ValueError("must be a size such as 4GB, 512MB or 0")
    m = _SIZE.fullmatch(str(text))
    if not m:
        raise ValueError("must be a size such as 4GB, 512MB or 0")
    return int(float(m.group(1)) * 1024 ** "_KMGT".index(m.group(2).upper() or "_"))


@dataclass(frozen=True)
class Size(Value):
    """A memory size: bytes as a number, or text such as 4GB or 512MB (kept as given)."""

    default: Any = None
    help: str = ""

    def describe(self) -> str:
        return "a size such as 4GB, 512MB or 0"

    def check(self, value: Any) -> Any:
        parse_size(value)
        return value


# Defaults and choices that several records, options and files share: declared here once, imported everywhere
CHUNK_ROWS = 1024  # images per store chunk (a build's unit of work and of resumption)
VAL_FRAC = 0.1  # the share of the non-test images a probe keeps for validation
MEMORY_BUDGET = "4GB"  # what a probe run may hold of stored rows in memory
# DuckDB's memory_limit on a read-only connection (the report, queries, sql): READ_MEMORY_PER_BYTE times the bytes of
# the database files it reads, at least READ_MEMORY_FLOOR_MB; past it DuckDB spills joins, aggregates and sorts to
# <database>.tmp. In proportion to the data because what DuckDB cannot spill (robust_sweep's state: more than 100 MB
# on the 48,000-image benchmark's 62 MB file) grows with it: a fixed bound would refuse a larger database's report
READ_MEMORY_FLOOR_MB = 150
READ_MEMORY_PER_BYTE = 2.5
IG_STEPS = 5  # integrated-gradients steps of a circuit attribution
PRECISIONS = ("auto", "fp32", "fp16", "bf16")  # a build's forward precision
DECODES = ("auto", "cpu", "gpu")  # where a build decodes its images
STORE_DTYPES = ("auto", "float16", "float32")  # stored type of anchors and logits (featstore.nets.stored_types)
MIN_AGE_S = 3600.0  # `featstore gc`: a probe version written less long ago may belong to a probe still committing
VIEW = "clean"  # the view a build stores, a probe predicts and a circuit attributes, unless told otherwise
VARIANT = "linear"  # the probe variant
TAU = 0.3  # DDB's shallow/deep split (sql/ddb.sql's default says the same)
TOP_N = 200  # edges of a circuit's top-n graph (sql/css.sql's default says the same)
REPEATS = 20  # timed runs per cost measurement
NULL_DRAWS = 2000  # permutations of the labels in overthinking's label-blind null (analytics/readouts.py)
NULL_SEED = 0  # the seed of those permutations
CALIBRATION_BINS = 15  # confidence bins of calibration (sql/calibration*.sql's default says the same)
CALIBRATION_BINNINGS = ("width", "mass")  # equal-width or equal-mass bins, the first the default (sql/calibration*.sql)
CALIBRATION_MIN_N = 10  # a calibration bin of fewer images never sets MCE (sql/calibration.sql's min_n default)
CALIBRATION_REPLICATES = 1000  # bootstrap resamples of the images behind ECE's and MCE's intervals
CALIBRATION_SEED = 0  # the seed of those resamples
INTERVAL_LEVEL = 0.95  # the coverage of the nulls' and bootstraps' percentile intervals (overthinking, calibration)
COST_BATCH_SIZES = (1, 64)  # `cost`'s batch sizes: latency (1) and throughput
JOINT_MIN_CONF = 0.5  # the joint criterion's confidence threshold where compare and the report show it
FIGURE_FORMATS = ("png", "svg", "pdf")  # `report --figures`: publication figures beside the page, by matplotlib
PER_PAIR = 4  # `compare`: disagreeing images listed per pair of definitions
DDB_VARIANTS = ("global", "deep", "out")  # DDB's variants, the first the default (sql/ddb.sql's too)
CSS_DISTANCES = ("srcc", "cosine", "l2", "jaccard", "laplacian", "netlsd")  # CSS's, the first the default (sql/css.sql)
DEMO_DATASET = "layouts"  # the demo's generated image set
WEIGHTS = "auto"  # a model's weights: the paper's for the paper's five models, else the library's default
DEVICE = "auto"  # where a job computes: the first CUDA device, else the CPU (featstore.runtime)
TIMM_WEIGHTS = "default"  # circuits and zoo models: a timm checkpoint's default pretrained tag
SCOPES = ("auto", "all", "train", "val", "test")  # which images a summary counts (sql/in_scope.sql)
SCOPE = SCOPES[0]  # auto: the test split, or every image of a cross-fit run (all its predictions are out of sample)
BANDS = ("paper", "window")  # a sweep's early/mid/late thresholds (sql/band_window.sql)
BAND = BANDS[0]  # paper: the thirds of T, never-stable images (placed at T) counted late, as the source paper counts
SPLITS = ("train", "val", "test")  # a probe database's image split (featstore.probing.split)
GATE_SPLIT = SPLITS[0]  # the images an exit gate learns from
KS = (1, 2, 3, 4)  # the stability windows k of a sweep, a simulation and the report
K = 2  # the one window shown where one is (compare, timeline --image, the report's one-k sections)
MIN_CONF = 0.0  # the joint criterion's confidence threshold of a query: 0 is stability alone
IMAGE_SIZE_MIN = 16  # the smallest crop featstore takes from an image (featstore.images.preprocessing)

# The values every option, record field and file key of that name takes (the CLI flag is --name-with-dashes).
FIELDS: dict[str, Value] = {
    "batch_size": Int(ge=1),
    "workers": Int(ge=0),
    "threads": Int(ge=1),
    "seed": Int(ge=0, default=0),
    "split_seed": Int(ge=0, default=0),
    "limit": Int(ge=1),
    "image_size": Int(ge=IMAGE_SIZE_MIN),
    "chunk_rows": Int(ge=1, default=CHUNK_ROWS),
    "cross_fit": Int(ge=2, also=(0,), default=0),
    "val_frac": Real(gt=0, lt=1, default=VAL_FRAC),
    "memory_budget": Size(default=MEMORY_BUDGET),
    "view": Names(default=VIEW),  # a view, a comma list of views, or all
    "views": Names(default=VIEW),
    "train_on_view": Names(),
    "k": Int(ge=1, default=K),
    "tau": Real(gt=0, lt=0.5, default=TAU),
    "ig_steps": Int(ge=1, default=IG_STEPS),
    "top_n": Int(ge=1, default=TOP_N),
    "repeats": Int(ge=1, default=REPEATS),
    "epochs": Int(ge=1),
    "project_dim": Int(ge=1),
    "precision": Text(choices=PRECISIONS, default=PRECISIONS[0]),
    "decode": Text(choices=DECODES, default=DECODES[0]),
    "pool": Text(choices=("cls", "mean")),  # how token anchors are pooled
    "store_dtype": Text(choices=STORE_DTYPES, default=STORE_DTYPES[0]),  # featstore.nets.stored_types
    "min_age": Real(ge=0, default=MIN_AGE_S),
    "min_conf": Real(ge=0, le=1),  # conf >= this at l*, beside stability (the joint criterion)
    "per_pair": Int(ge=0, default=PER_PAIR),
    "scope": Text(choices=SCOPES, default=SCOPE),
    "band": Text(choices=BANDS, default=BAND),
    "split": Text(choices=SPLITS, default=GATE_SPLIT),
}


def default(name: str) -> Any:
    """The declared default of field `name` (`FIELDS`), for a record's field and the option that fills it."""
    return FIELDS[name].default


def comma_list(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']: the one reading of every comma list (views, anchors, taps, runs, numbers)."""
    return [v.strip() for v in text.split(",") if v.strip()]


def check_field(name: str, value: Any) -> Any:
    """`value` checked as `FIELDS[name]`; else one FeatstoreError that names the field as a caller sets it
    (`val_frac=1.5: must be ...`), carrying the field, the value and the reason."""
    try:
        return FIELDS[name].check(value)
    except ValueError as e:
        raise FeatstoreError(str(e), field=name, value=value) from None


def check_fields(record: object, names: Sequence[str]) -> None:
    """Every named field of `record` that is set (not None), checked as `FIELDS` says."""
    for name in names:
        value = getattr(record, name)
        if value is not None:
            check_field(name, value)
