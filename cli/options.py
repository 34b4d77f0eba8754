"""Every option of the `featstore` command, declared once.

`OPTIONS` maps an option name to its declaration; a name that means different things in different commands
(`--model` is a network for `build` and a store group for `probe`) has one declaration per role, side by side
here. Options that fill a record take their default and choices from the record or from `featstore.schema`
(`declared`), where the record reads them too, so the library and the CLI cannot disagree. Commands get options
only through `option` and the record decorators below; tests/test_every_option.py checks that no other
`click.option` call exists and that no option repeats a declared default or choice. `option_for` finds the option
that sets a field a library error names, and `typed_value` what the user typed for it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from featstore.api.declared import (
    COST_BATCH_SIZES,
    CSS_DISTANCES,
    DDB_VARIANTS,
    DEFAULT_POLICIES,
    DEMO_DATASET,
    FIELDS,
    FIGURE_FORMATS,
    JOINT_MIN_CONF,
    MAX_THRESHOLDS,
    MIN_CONF,
    TIMM_WEIGHTS,
    VARIANT,
    VIEW,
    ImageSource,
    Int,
    K,
    ModelSpec,
    Number,
    Real,
    RunOptions,
    Size,
    Text,
    Value,
    comma_list,
    shown,
)

PATH = click.Path(path_type=Path)


class LocalPath(click.Path):
    """A database file (`folder=False`) or an output folder (`folder=True`) on local disk, refused in one line
    before anything opens or writes it when no command could use it: a symlink loop (DuckDB and mkdir fail deep
    inside, and a failed first write removed the link), a path under a file, a folder, a FIFO, a socket or a
    device given as a database (DuckDB would wait forever on a FIFO; /dev/null keeps nothing), a file given as an
    output folder."""

    def __init__(self, folder: bool):
        super().__init__(path_type=Path)
        self.folder = folder

    def convert(self, value: str | os.PathLike[str], param: click.Parameter | None, ctx: click.Context | None) -> Path:
        path = super().convert(value, param, ctx)
        assert isinstance(path, Path)  # path_type=Path
        what, fix = ("an output folder", "give a new folder") if self.folder else ("a database file",
                                                                                   "give the DuckDB file itself")
        try:
            os.stat(path)
        except OSError as e:
            if e.errno == errno.ELOOP:
                self.fail(f"{value}: a symlink loop (it never reaches {what}); {fix}", param, ctx)
            if e.errno == errno.ENOTDIR:
                self.fail(f"{value}: a part of the path is a file, not a folder; {fix}", param, ctx)
            return path  # not there yet: the command creates it
        if self.folder and not path.is_dir():
            self.fail(f"{value}: a file, not {what}; give a new folder (or an existing folder)", param, ctx)
        if not self.folder and path.is_dir():
            self.fail(f"{value}: a folder, not {what}; {fix}", param, ctx)
        if not self.folder and not path.is_file():  # a FIFO would make DuckDB wait for a writer forever
            kind = next((k for k in ("fifo", "socket", "char_device", "block_device") if getattr(path, f"is_{k}")()),
                        "no regular file")
            self.fail(f"{value}: {_KINDS.get(kind, kind)}, not {what}; {fix}", param, ctx)
        return path


_KINDS = {"fifo": "a FIFO (named pipe)", "socket": "a socket", "char_device": "a character device",
          "block_device": "a block device"}
DB_PATH, OUT_FOLDER = LocalPath(folder=False), LocalPath(folder=True)


class Checked(click.ParamType):
    """A click type that parses and checks an option as `featstore.schema` declares the value of that name, so
    the option, the record it fills and the study/zoo key of the same name accept the same values; a bad one is
    the records' own line: `--val-frac 1.5: must be a number > 0 and < 1`."""

    def __init__(self, value: Value):
        self.value = value
        self.name = "integer" if isinstance(value, Int) else "float" if isinstance(value, Real) else (
            "size" if isinstance(value, Size) else "text")

    def convert(self, given, param, ctx):
        try:
            return self.value.parse(given) if isinstance(given, str) else self.value.check(given)
        except ValueError as e:
            text = given if isinstance(given, str) and given.strip() == given and given else shown(given)
            raise click.UsageError(f"{param.opts[0] if param else 'value'} {text}: {e}", ctx) from None


def checked(name: str) -> Checked:
    """The click type of every option named `name` (`FIELDS[name]`)."""
    return Checked(FIELDS[name])


def declared(name: str, **kwargs) -> dict:
    """The click keyword arguments of an option that sets field `name`: its type (a choice where `FIELDS[name]` has
    choices) and its default, both as `featstore.schema` declares them, so no option repeats them."""
    value = FIELDS[name]
    kind = click.Choice(value.choices) if isinstance(value, Text) and value.choices else Checked(value)
    return dict(type=kind, **({} if value.default is None else {"default": value.default}), **kwargs)


def _default(record: type, name: str):
    return next(f.default for f in fields(record) if f.name == name)


def _list_parser(kind: str, example: str, minimum: int):
    """A click callback turning '1,2,3' into sorted distinct ints >= minimum, with an error of its own kind."""

    def parse(_ctx, param, text: str) -> list[int]:
        try:
            values = sorted({int(v) for v in comma_list(text)})
        except ValueError:
            raise click.BadParameter(f"{text!r}: give {kind} such as {example}", param=param) from None
        if not values or values[0] < minimum:
            raise click.BadParameter(f"{text!r}: {kind} are whole numbers >= {minimum}", param=param)
        return values

    return parse




def _threshold_parser(_ctx, param, text: str) -> list[float]:
    """'0.5:0.99:0.01' (start:stop:step, stop included) or '0.5,0.9' -> confidence thresholds. A range is counted
    before it is built: 0:1:0.0000001 (10 million policies) grew to 15.8 GB."""
    try:
        if ":" in text:
            start, stop, step = (float(v) for v in text.split(":"))
            count = int(round((stop - start) / step)) + 1
            if count < 1:
                raise click.BadParameter(f"{text!r}: an empty range (a step of {step:g} never goes from {start:g} "
                                         f"to {stop:g}); give start <= stop for a positive step, e.g. "
                                         f"{min(start, stop):g}:{max(start, stop):g}:{abs(step):g}", param=param)
            if count > MAX_THRESHOLDS:
                many = f"{count:,}" if count < 10**9 else f"{count:.1e}"
                raise click.BadParameter(f"{text!r}: {many} thresholds, at most {MAX_THRESHOLDS:,}: give a larger "
                                         f"step", param=param)
            values = [round(start + i * step, 10) for i in range(count)]
        else:
            values = [float(v) for v in comma_list(text)]
    except (ValueError, ZeroDivisionError, OverflowError):
        raise click.BadParameter(f"{text!r}: give start:stop:step (e.g. 0.5:0.99:0.01) or a comma list",
                                 param=param) from None
    if not values or not all(0 <= v <= 1 for v in values):
        raise click.BadParameter(f"{text!r}: confidences lie in [0, 1]", param=param)
    return values


def _thresholds_text(values: tuple[float, ...]) -> str:
    """The command-line spelling of a threshold list: start:stop:step when evenly spaced."""
    steps = {round(b - a, 10) for a, b in zip(values, values[1:], strict=False)}
    if len(values) > 5 and len(steps) == 1:
        return f"{values[0]:g}:{values[-1]:g}:{steps.pop():g}"
    return ",".join(f"{v:g}" for v in values)


D = RunOptions  # record defaults below read from here and from ModelSpec / ImageSource

# name -> role -> (extra declarations, click keyword arguments); role "" when the name has one meaning
OPTIONS: dict[str, dict[str, tuple[tuple[str, ...], dict]]] = {
    # ModelSpec
    "--model": {
        "network": ((), dict(required=True, help="torchvision or timm model name (timm/NAME forces timm).")),
        "vit": ((), dict(required=True, help="A timm VisionTransformer name (any depth/heads).")),
        "group": ((), dict(required=True, help="Model (store group) whose anchors to use.")),
        "measured": ((), dict(required=True, help="Model (store group / DB model) to measure.")),
        "only": ((), dict(help="Check only this model (store group) [default: every model].")),
    },
    "--weights": {
        "auto": ((), dict(default=_default(ModelSpec, "weights"), help="auto (paper for the paper's five models, "
                          "else default) | paper | default | a torchvision weights name or timm pretrained tag | "
                          "PATH | none.")),
        "timm": ((), dict(default=TIMM_WEIGHTS, help="default | PATH | none.")),
    },
    "--image-size": {"": ((), dict(type=checked("image_size"), default=_default(ModelSpec, "image_size"),
                                   help="Crop size override; resizes to S*256/224 first [default: the model's, or the "
                                        "store's].")),
                     },
    # ImageSource
    "--data": {
        "": ((), dict(required=True, type=PATH, help="ImageFolder root, or flat folder (with --labels).")),
        "override": ((), dict(type=PATH, help="Image folder [default: the study's data.path].")),
    },
    "--labels": {"": ((), dict(type=PATH, default=_default(ImageSource, "labels"),
                               help="Labels of a flat folder: a CSV filename,label, or ImageNet's val labels as "
                                    "they ship (ILSVRC2012_validation_ground_truth.txt with meta.mat beside it, or "
                                    "LOC_val_solution.csv).  See docs/build.md."))},
    "--limit": {
        "": ((), dict(type=checked("limit"), default=_default(ImageSource, "limit"),
                      help="Deterministic subset of N images (ids stay those of the full set) [default: all].")),
        "circuits": ((), dict(type=checked("limit"), default=_default(ImageSource, "limit"),
                              help="Deterministic subset of N images (ids stay those of the full set) whose edges "
                                   "are scored [default: 500].")),
        "demo": ((), dict(type=checked("limit"), help="Use only about N images (a quick run, e.g. in CI).")),
    },
    # RunOptions
    "--device": {
        "": ((), dict(default=D.device, help="auto | cpu | cuda | cuda:N.")),
        "measured": ((), dict(help="Device the costs were measured on [default: the only one in the DB].")),
    },
    "--workers": {"": ((), dict(type=checked("workers"), default=D.workers,
                                help="Image decoders [default: a thread per core on CPU, taking turns with the "
                                     "compute; up to 8 DataLoader processes on CUDA]; 0 decodes serially."))},
    "--batch-size": {
        "": ((), dict(type=checked("batch_size"), default=D.batch_size,
                      help="Images per forward pass [default: 64].")),
        "circuits": ((), dict(type=checked("batch_size"), default=D.batch_size,
                              help="Images per EAP-IG pass [default: 32]; its memory grows linearly with it.")),
        "measured": (("batch_sizes",), dict(default=",".join(map(str, COST_BATCH_SIZES)),
                                            callback=_list_parser("batch sizes", "1,64", 1),
                                            help="Batch sizes to measure: latency (1) and throughput.")),
        "price": ((), dict(type=checked("batch_size"), default=COST_BATCH_SIZES[0],
                            help="Which measured batch size prices the exits.")),
    },
    "--seed": {
        "": ((), dict(type=checked("seed"), default=D.seed,
                      help="Seed of the random init (--weights none) and of the --limit subset (view noise depends on "
                           "the image id alone).")),
        "probe": ((), dict(type=checked("seed"), default=D.seed,
                           help="Seed of the probes: SGD's shuffling (paper; linear:full_batch=0), the sample sizing "
                                "the steps, and projections; linear's default full-batch L-BFGS solve reaches the "
                                "same probe whatever the seed (runs of several probe seeds land side by side: macro "
                                "seed_spread).")),
    },
    "--threads": {"": ((), dict(type=checked("threads"), default=D.threads,
                                help="CPU threads for the compute [default: one per idle core, looked at again at "
                                     "each chunk, epoch or batch]; recorded with the results."))},
    "--progress/--no-progress": {"": ((), dict(default=D.progress, help="Progress bars on stderr."))},
    # stores and databases
    # a store is a folder or an object-store URL (s3://BUCKET/PREFIX, gs://, az://; featstore.store.location): a plain
    # string, since a click.Path would fold s3:// into s3:/
    "--store": {
        "create": ((), dict(required=True, help="Zarr store to create or extend: a folder or an object-store URL "
                            "(s3://BUCKET/PREFIX, gs://, az://; credentials from the standard environment, e.g. "
                            "AWS_*).")),
        "read": ((), dict(required=True, help="A store made by featstore build (a folder or s3://... URL).")),
        "optional": ((), dict(help="Read anchors, crop and head width from this store (a folder or s3://... URL).")),
        "study": ((), dict(help="Where the study's store lives: a folder or an object-store URL (s3://...) "
                           "[default: <out>/store.zarr].")),
    },
    "--db": {
        "read": ((), dict(required=True, type=DB_PATH, help="A database filled by featstore probe.")),
        "several": (("dbs",), dict(required=True, type=DB_PATH, multiple=True, help="A database filled by featstore "
                                   "probe; repeat to query several (attached read-only, as one: same image set).")),
        "target": ((), dict(required=True, type=DB_PATH, help="Database to fold the sources into (created if "
                            "missing).")),
        "circuits": ((), dict(required=True, type=DB_PATH, help="A database filled by featstore circuits.")),
        "verified": (("dbs",), dict(type=DB_PATH, multiple=True, help="A database probed from this store: list its "
                                    "runs whose stored weights are missing (repeat for several).")),
        "kept": (("dbs",), dict(type=DB_PATH, multiple=True, help="A database probed from this store beside the one "
                                "each version records: the versions its runs name are kept (repeat for several).")),
        "write": ((), dict(required=True, type=DB_PATH, help="DuckDB file to create or extend.")),
        "costs": ((), dict(required=True, type=DB_PATH, help="DuckDB file to keep the costs in.")),
        "gate": ((), dict(required=True, type=DB_PATH, help="A database filled by featstore probe (the gate and its "
                          "scores are written into it).")),
    },
    "--format": {"": (("fmt",), dict(type=click.Choice(["table", "csv", "json"]), default="table",
                                     help="Output format."))},
    "--figures": {"": ((), dict(type=click.Choice(FIGURE_FORMATS), default=None,
                                help="Also write every figure as a file of this format, drawn by matplotlib (for a "
                                     "paper); the page draws its own plots either way."))},
    "--scope": {"": ((), declared("scope",
                              help="Images counted: auto = the test split, or all images of cross-fit runs."))},
    "--k": {"": (("ks",), dict(default=",".join(map(str, DEFAULT_POLICIES.ks)),
                               callback=_list_parser("stability windows", "1,2,3,4", 1),
                               help="Stability windows k (k anchors after the first); where one is shown "
                                    "(compare, timeline --image, the report's one-k sections): the one given, else "
                                    f"{K} (a list without {K} is refused)."))},
    "--min-conf": {
        "": ((), dict(type=checked("min_conf"), default=MIN_CONF, help="Joint criterion: l* must also be confident "
                      "(conf >= this at l*); 0 = stability alone.")),
        "compare": ((), dict(type=checked("min_conf"), default=JOINT_MIN_CONF,
                             help="Threshold of the joint criterion (stable from l* and conf >= this at l*) among the "
                                  "definitions compared; 0 leaves it out.")),
    },
    "--band": {"": ((), declared("band",
                             help="Early/mid/late of the sweep: paper = thirds of T, never-stable images (at T) "
                                  "counted late; window = thirds of T - k, the anchors a stable l*(k) can take, "
                                  "never-stable images apart (docs/design.md §5)."))},
    "--image": {"": (("image_id",), dict(type=click.IntRange(min=0), help="Print this image's timeline instead: "
                                         "class and confidence at every anchor of every run (or of --run's), "
                                         f"l*(k) marked (k: the one --k given, else {K})."))},
    "--spread": {"": ((), dict(is_flag=True, help="Print the sweep over a set of probes instead (--run's, else "
                                             "every run of probe seed 0 without cross-fit), grouped in families (a "
                                             "probe with its neighbour-C runs and seeds votes once): each run's band "
                                             "fractions with 95% bootstrap intervals over images (seed 0, 1,000 "
                                             "resamples, probes fixed), their range over the set, the share of "
                                             "images whose band holds under every family's vote, the share chance "
                                             "would give and Fleiss' kappa."))},
    "--refits": {"": ((), dict(is_flag=True, help="With --spread: every probe seed of each run joins the set and "
                                             "each resample also draws one seed per run, so the intervals cover "
                                             "refitting the probes as well as the images."))},
    "--full": {"": ((), dict(is_flag=True, help="Show every row and whole lists (timelines) in the table format."))},
    # compare
    "--per-pair": {"": ((), declared("per_pair",
                                 help="Disagreeing images listed per pair."))},
    "--part": {"": ((), dict(type=click.Choice(["summary", "agreement", "crosstab", "matrix", "disagreements"]),
                             help="Print only this part: summary, agreement (every pair), crosstab (3x3 per pair), "
                                  "matrix (table format only) or disagreements [default: the summary and the pairs "
                                  "that disagree most; csv/json: agreement]."))},
    "--out": {
        "report": ((), dict(type=OUT_FOLDER, help="Folder for report.html (and --figures' files) [default: "
                            "report/ beside the database].")),
        "export": ((), dict(required=True, type=OUT_FOLDER, help="New folder for the Parquet files.")),
        "demo": ((), dict(type=OUT_FOLDER, default=Path("featstore-demo"), help="Folder for the images, the cached "
                          "network, the store, the database and the report (one subfolder per --dataset).")),
        "study": ((), dict(type=OUT_FOLDER, help="Folder for the store, database, report and study state "
                           "[default: ./study-<name>].")),
    },
    "--replace": {"": ((), dict(is_flag=True, help="A result a source holds under a key the target holds with other "
                                "content replaces the target's (default: the merge is refused)."))},
    # build
    "--views": {"": ((), declared("views",
                                  help="Comma list: clean, gaussian_noise-S, gaussian_blur-S, brightness-S."))},
    "--anchors": {"": ((), dict(help="Comma list of module names (X.mid inside ResNet blocks, X.input what enters "
                                "X; input, first: the image on an 8x8 grid; default: the defaults, e.g. "
                                "input,default); default: the preset, else traced places ending at what the head "
                                "reads."))},
    "--taps": {"": ((), dict(help="Transformer module taps per block: all, or a list of ln1,attn,resid_mid,ln2,fc1,"
                             "act,fc2,resid (timm ViTs); anchors become (block, tap) pairs."))},
    "--pool": {"": ((), declared("pool", help="Token pooling for ViTs [default: cls where the model has a class "
                                              "token, else mean; mean with --taps]."))},
    "--chunk-rows": {"": ((), declared("chunk_rows",
                                       help="Store chunk size along images; the unit of resume."))},
    "--precision": {"": ((), declared("precision",
                                      help="auto = fp16 autocast on CUDA, fp32 on CPU."))},
    "--store-dtype": {"": ((), declared("store_dtype",
                                        help="Stored type of anchors and logits; auto = float16, float32 for an array "
                                         "whose values float16 cannot hold."))},
    "--decode": {"": ((), declared("decode", help="auto = gpu on CUDA: "
                               "decode, crop and views on the device; cpu = PIL in the loader (the reference)."))},
    "--skip-bad": {"": ((), dict(is_flag=True, help="Record corrupt images as skipped instead of stopping."))},
    "--rebuild-changed": {"": ((), dict(is_flag=True, help="Image files changed since the store was built: recompute "
                                        "the chunks holding them, in every model and view of the store [default: "
                                        "refuse, naming the file]."))},
    "--name": {"": ((), dict(help="Store group for this model config [default: the model name]."))},
    "--compile": {"": ((), dict(is_flag=True, help="Run the tapped forward under torch.compile (faster on a GPU after "
                                "a compile of a minute or so; recorded, so a resume must use it too)."))},
    # probe
    "--view": {
        "predict": ((), declared("view",
                                 help="View(s) to predict: a name, a comma list, or all.")),
        "circuit": ((), declared("view", help="clean or a corruption view (the OOD set).")),
        "cka": ((), dict(default=VIEW, help="The view whose stored features are compared.")),
    },
    "--variant": {
        "probe": ((), dict(default=VARIANT, help="linear | paper | projected[:dim=N] | "
                           "knn[:k=30,metric=euclidean|cosine,ties=lowest|nearer,leave_out=self|none,"
                           "refs=STORE] | head-probe | tuned-lens[:steps=250] | lens-direct (or a registered one; "
                           "lens: the old name of head-probe).")),
        "ddb": ((), dict(type=click.Choice(DDB_VARIANTS), default=DDB_VARIANTS[0])),
    },
    "--train-on-view": {"": ((), dict(type=checked("train_on_view"),
                                      help="Train the probes on this view [default: clean]."))},
    "--cross-fit": {"": ((), declared("cross_fit",
                                      help="K >= 2: K folds, every image predicted out of sample."))},
    "--project-dim": {"": ((), dict(type=checked("project_dim"),
                                    help="Capacity control: the projected variant at this width (a seeded random "
                                         "projection of wider anchors); results coexist with the raw variant's."))},
    "--split-seed": {"": ((), declared("split_seed", help="Seed of the train/val/test split and cross-fit folds "
                                                          "(fixed per database)."))},
    "--val-frac": {"": ((), declared("val_frac",
                                     help="Share of the train split carved out as val (fixed per database)."))},
    "--memory-budget": {"": ((), declared("memory_budget",
                                          help="Keep features in memory up to this size, else stream chunks."))},
    # cost and early exit
    "--repeats": {"": ((), declared("repeats",
                                    help="Timed runs per measurement (median), after 3 warm-up runs."))},
    "--run": {
        "one": (("run_id",), dict(help="A run id (see `featstore sql \"SELECT run_id FROM runs\"`) [default: the "
                                  "database's only run].")),
        "several": (("run_id",), dict(help="A run id, or a comma list of them [default: every clean run].")),
        "any": (("run_id",), dict(help="A run id, or a comma list of them [default: every run].")),
    },
    "--thresholds": {"": ((), dict(default=_thresholds_text(DEFAULT_POLICIES.thresholds),
                                   callback=_threshold_parser,
                                   help="Confidence thresholds: start:stop:step (at most 10,000 values) or a list."))},
    "--combined-thresholds": {"": ((), dict(default=_thresholds_text(DEFAULT_POLICIES.combined),
                                            callback=_threshold_parser,
                                            help="Thresholds of the stability AND confidence gate."))},
    "--split": {"": ((), declared("split",
                              help="The images the gate learns from; exit-sim evaluates it on the others."))},
    "--no-gate": {"": ((), dict(is_flag=True, help="Leave the learned gate out of the comparison, so that every "
                                "policy counts every image of --scope [default: with a gate, every policy counts "
                                "only the images it did not learn from]."))},
    # circuits
    "--ig-steps": {"": ((), declared("ig_steps",
                                     help="m: integrated-gradient steps (left Riemann sum)."))},
    "--tau": {
        "ddb": ((), declared("tau",
                             help="Shallow = blocks < tau L, deep = blocks >= (1 - tau) L.")),
        "zoo": ((), declared("tau",
                             help="DDB's shallow/deep split in the printed table (zoo_tau_sweep: all).")),
    },
    "--top-n": {"": ((), declared("top_n",
                                  help="Edges of the top-n graphs (jaccard, laplacian, netlsd)."))},
    "--id": {"": (("id_run",), dict(required=True, help="Circuit run on in-distribution images."))},
    "--ood": {"": (("ood_run",), dict(required=True, help="Circuit run of the same model on shifted images."))},
    "--distance": {"": ((), dict(type=click.Choice(CSS_DISTANCES),
                                 default=CSS_DISTANCES[0]))},
    # cka
    "--unbiased": {"": ((), dict(is_flag=True, help="The unbiased HSIC estimator (Song et al. 2012) instead of the "
                                 "biased one of Kornblith et al.; both kept, side by side."))},
    # store inspection
    "--all": {"": (("every",), dict(is_flag=True, help="List every name --anchors (and --taps) accepts "
                                       "instead."))},
    "--quick": {"": ((), dict(is_flag=True, help="Only look for missing chunk files (no chunk is read)."))},
    # gc
    "--min-age": {"": ((), declared("min_age", help="Seconds since a version was last "
                                "written before it may be removed (a probe may still be committing a newer one)."))},
    "--dry-run": {"": ((), dict(is_flag=True, help="List what would be removed; remove nothing."))},
    # demo
    "--dataset": {"": ((), dict(default=DEMO_DATASET, help="layouts: generated dot layouts, class colour in half the "
                                "images (decided at the stem or later); digits: scikit-learn's 8x8 digits (nearly all "
                                "decided at the stem)."))},
    "--epochs": {"": ((), dict(type=checked("epochs"),
                               help="Training epochs of the ResNet-18 (cached per value; default per dataset)."))},
}


# The one name of each concept that several commands share, and the old spellings each still accepts, hidden from
# --help: alias -> what it stands for (None: its value as given; a text: that value, the alias being a flag).
CONCEPTS = {"store": "--store", "run": "--run", "k": "--k", "output folder": "--out", "format": "--format"}
ALIASES: dict[str, dict[str, str | None]] = {
    "--run": {"--runs": None},
    "--out": {"--to": None},
    "--format": {"--json": "json"},
}


class Invocation(click.Context):
    """A command's context that keeps the arguments of this invocation as the user typed them (`typed`), so that
    a refusal can say the user's value as given (`./val`, not the absolute path the library made of it)."""

    typed: tuple[str, ...] = ()


class Command(click.Command):
    """Every featstore command: its context records the arguments it was given (`Invocation.typed`)."""

    context_class = Invocation

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if isinstance(ctx, Invocation):
            ctx.typed = tuple(args)
        return super().parse_args(ctx, args)


def _field_names(param: click.Parameter) -> set[str]:
    """The field names `param` sets: the name click hands the command (`run_id`), its flags' own names (`run`)
    and those of its old spellings (`runs`)."""
    names = {param.name or ""} | {o.lstrip("-").replace("-", "_") for o in param.opts if o.startswith("--")}
    return names | {dest.removeprefix("alias_") for dest in getattr(param, "aliases", {})}


def option_for(command: click.Command, field: str) -> click.Option | None:
    """The shown option of `command` that sets the library's field `field`, from its declarations; None when the
    command has none (the field is then said as a Python caller writes it)."""
    return next((p for p in command.params if isinstance(p, click.Option) and not p.hidden
                 and field in _field_names(p)), None)


def typed_value(ctx: click.Context, param: click.Option) -> str | None:
    """The value the user typed for `param` in this invocation (under its name or an old spelling), as typed;
    None when it was not given on the command line."""
    typed = getattr(ctx, "typed", ())
    if not typed:
        return None
    given, _, _ = ctx.command.make_parser(ctx).parse_args(list(typed))
    for dest in (param.name, *getattr(param, "aliases", {})):
        value = given.get(dest)
        if isinstance(value, list | tuple):
            value = ",".join(map(str, value)) if value else None
        if isinstance(value, str) and value:
            return value
    return None


def _alias_dest(flag: str) -> str:
    return "alias_" + flag.strip("-").replace("-", "_")


class Aliased(click.Option):
    """An option that also takes its value from an old spelling (a hidden option, or a positional argument) when it
    is not given under its own name, before click checks that a required option was given."""

    def __init__(self, *decls, aliases: dict[str, str | None], **kwargs):
        super().__init__(*decls, **kwargs)
        self.aliases = aliases

    def consume_value(self, ctx: click.Context, opts) -> tuple:
        value, source = super().consume_value(ctx, opts)
        if source is not click.core.ParameterSource.COMMANDLINE:
            for dest, means in self.aliases.items():
                given = opts.get(dest)
                if isinstance(given, str | bool) and given != "":
                    return (given if means is None else means), click.core.ParameterSource.COMMANDLINE
        return value, source


class OldPositional(click.Argument):
    """A positional old spelling of an option (`featstore info STORE`): still read, never shown, so that --help
    shows one way to name the store or model (the option) rather than both."""

    def get_usage_pieces(self, ctx: click.Context) -> list[str]:
        return []


def option(name: str, role: str = "", positional: str | None = None) -> Callable:
    """The declaration of option `name` (in `role`, where its meaning depends on the command), with its old
    spellings (`ALIASES`) and, where a command took it positionally before, that positional form (`positional`,
    e.g. `featstore info STORE` for `featstore info --store STORE`)."""
    extra, kwargs = OPTIONS[name][role]
    kind = kwargs.get("type")
    if isinstance(kind, Checked) and isinstance(kind.value, Number):  # the range in --help, as click shows its own
        kwargs = {**kwargs, "help": f"{kwargs.get('help', '')}  [{kind.value.bounds()}]".lstrip()}
    old = {_alias_dest(flag): means for flag, means in ALIASES.get(name, {}).items()}
    declared: list[tuple[tuple[str, ...], dict[str, Any]]] = [
        ((flag, _alias_dest(flag)), dict(hidden=True, expose_value=False, is_flag=means is not None,
                                         help=f"Old spelling of {name}."))
        for flag, means in ALIASES.get(name, {}).items()]
    if positional:
        old[f"positional_{positional.lower()}"] = None
    declared.insert(0, ((name, *extra), {**kwargs, **({"cls": Aliased, "aliases": old} if old else {})}))
    decorators = [click.option(*decls, **kw) for decls, kw in declared]
    if positional:
        decorators.append(click.argument(f"positional_{positional.lower()}", required=False, expose_value=False,
                                         cls=OldPositional))
    return options(*decorators)


def options(*decorators: Callable) -> Callable:
    """Several option decorators as one, listed in the order `--help` shows them."""

    def apply(fn: Callable) -> Callable:
        for decorator in reversed(decorators):
            fn = decorator(fn)
        return fn

    return apply


def model_spec_options(model_role: str = "network", weights_role: str = "auto") -> Callable:
    """--model, --weights, --image-size: a `ModelSpec`."""
    return options(option("--model", model_role), option("--weights", weights_role), option("--image-size"))


def image_source_options(data_role: str = "", limit_role: str = "") -> Callable:
    """--data, --labels, --limit: an `ImageSource`."""
    return options(option("--data", data_role), option("--labels"), option("--limit", limit_role))


RUN_FLAGS = {"device": "--device", "workers": "--workers", "batch_size": "--batch-size", "seed": "--seed",
             "threads": "--threads", "progress": "--progress/--no-progress"}


def run_options(*names: str, roles: dict[str, str] | None = None) -> Callable:
    """The `RunOptions` fields a command takes (all by default), declared as above; `roles`: the role of a field
    whose meaning is the command's own (--seed of a probe, --batch-size of EAP-IG)."""
    return options(*(option(RUN_FLAGS[n], (roles or {}).get(n, "")) for n in names or RUN_FLAGS))
