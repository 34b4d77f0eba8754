"""The `featstore` command: parses options, calls the library, prints. No logic lives here."""

from __future__ import annotations

import errno
import functools
import gc as cyclic_gc  # the module: `gc` names the command below
import json
import os
import signal
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from featstore.api.declared import ImageSource, ModelSpec, RunOptions, split_options
from featstore.cli.options import (
    DB_PATH,
    Command,
    image_source_options,
    model_spec_options,
    option,
    option_for,
    options,
    run_options,
    typed_value,
)
from featstore.errors import (
    FeatstoreError,
    FeatstoreWarning,
    Interrupted,
    Refusal,
    RunReplaced,
    Step,
    interrupted,
    shown,
    storage_failure,
)

if TYPE_CHECKING:
    from featstore.api.store import StoreInfo


def in_flags(refusal: Refusal) -> str:
    """A featstore error or warning as this command says it: each field it names as the option that sets it
    (found in this command's declarations, else in another command's: `--anchors` of build in a probe's advice),
    the value as the user typed it where it is the value they gave, and a next step as the command that takes
    it."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return str(refusal)
    root = ctx.find_root().command
    commands = [ctx.command, *(root.commands.values() if isinstance(root, click.Group) else ())]

    def flag(field: str) -> str | None:
        found = next((o for o in (option_for(c, field) for c in commands) if o is not None), None)
        return found.opts[0] if found is not None else None

    def as_typed(field: str, held: object) -> str:
        found = option_for(ctx.command, field)
        typed = None if found is None else typed_value(ctx, found)
        if typed is not None and found is not None and _same(held, ctx.params.get(found.name or "")):
            return typed
        if found is None:
            return shown(held)
        return ",".join(map(str, held)) if isinstance(held, list | tuple) else str(held)

    def command(next_step: Step) -> str:
        if not (isinstance(root, click.Group) and next_step.function in root.commands):
            return next_step.call
        target = root.commands[next_step.function]
        switches = [found.opts[0] for found in (option_for(target, name) for name in next_step.switches) if found]
        return f"`{' '.join(['featstore', next_step.function, *switches])}`"

    return refusal.one_line(flag, as_typed, command)


def _same(value: object, given: object) -> bool:
    """Whether an error's value is the value the command was given (a path the library made absolute, a list it
    read from a comma list, a number it normalised)."""
    if isinstance(given, list | tuple) and not isinstance(value, list | tuple):
        given = ",".join(map(str, given))
    if value == given or str(value) == str(given):
        return True
    if given is None or isinstance(value, list | tuple) or "://" in f"{value}{given}":
        return False
    return Path(str(value)).expanduser().absolute() == Path(str(given)).expanduser().absolute()


def user_errors(fn):
    """Turn FeatstoreError (its fields as the options that set them), object storage that stopped answering and
    a full disk into one line on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except FeatstoreError as e:  # the library names fields; the CLI says the options that set them
            click.echo(f"featstore: error: {in_flags(e)}", err=True)
            sys.exit(2)
        except Interrupted as e:
            click.echo(f"featstore: error: {e}", err=True)
            sys.exit(2)
        except Exception as e:
            if interrupted(e):  # DuckDB's own Ctrl-C, as every other Ctrl-C: one line, exit status 130
                raise KeyboardInterrupt from e
            failure = storage_failure(e)
            if failure is not None:
                click.echo(f"featstore: error: the object store stopped answering ({failure}); what was committed "
                           f"before stays: rerun the command to resume once it answers", err=True)
                sys.exit(2)
            full = disk_full(e)
            if full is None:
                raise
            click.echo(f"featstore: error: {full} writing {_written_path(e, kwargs)}; free some space there or "
                       f"give {_output_flag(e, kwargs)} on another disk, then rerun (what was committed before "
                       f"stays)", err=True)
            sys.exit(2)

    return wrapper


FULL_DISK = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded",
             errno.EFBIG: "the file size limit is reached"}


def disk_full(error: BaseException) -> str | None:
    """When `error` (or what it was raised from) is a write refused for lack of space (ENOSPC, EDQUOT, EFBIG, from
    Python or inside DuckDB), what the disk said; None otherwise. Every command's writes commit atomically (a chunk
    and its done mark, a transaction, a folder renamed into place), so one line is all a full disk needs."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in FULL_DISK:
            return FULL_DISK[current.errno]
        text = str(current)
        for number, words in FULL_DISK.items():
            if f'"errno":"{number}"' in text or os.strerror(number) in text:  # DuckDB's IO errors carry the errno
                return words
        current = current.__cause__ or current.__context__
    return None


OUTPUT_FLAGS = ("out", "store", "db")  # what a command writes, by the name click gives its option


def _written_path(error: BaseException, given: dict) -> str:
    """The file the refused write was for, where the error names it, else the command's output."""
    current: BaseException | None = error
    while current is not None:
        if isinstance(current, OSError) and current.filename:
            return str(current.filename)
        current = current.__cause__ or current.__context__
    return next((str(given[f]) for f in OUTPUT_FLAGS if given.get(f) is not None), "its output")


def _output_flag(error: BaseException, given: dict) -> str:
    """The option that moves the refused write elsewhere: the one whose path holds the file, else the first
    output option the command has."""
    written = _written_path(error, given)
    flags = [f for f in OUTPUT_FLAGS if given.get(f) is not None]
    for f in flags:
        if os.path.abspath(written).startswith(os.path.abspath(str(given[f]))):
            return f"--{f}"
    return f"--{flags[0]}" if flags else "an output"


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """featstore's own warnings as `featstore: warning: ...` on stderr; any other as Python shows it."""
    if issubclass(category, FeatstoreWarning):
        click.echo(f"featstore: warning: {in_flags(message) if isinstance(message, Refusal) else message}", err=True)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning


def _visible_options(command: click.Command) -> set[str]:
    """The option spellings `command -h` shows."""
    return {o for p in command.params if isinstance(p, click.Option) and not p.hidden for o in (*p.opts,
                                                                                                 *p.secondary_opts)}


class _OneLineErrors(click.Group):
    """Usage errors (a bad choice, an unknown option) as one line and exit status 2, like every bad input;
    featstore's warnings as one line each. Its commands record the arguments they were given (`Command`)."""

    command_class = Command

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> NoReturn:
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _one_line_warning
                super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as e:
            ctx = getattr(e, "ctx", None)
            if isinstance(e, click.NoSuchOption) and ctx is not None:  # never suggest a hidden (old) spelling
                visible = [o for o in e.possibilities or () if o in _visible_options(ctx.command)]
                e = click.NoSuchOption(e.option_name, e.message, visible, ctx)
            command = self._command_named(ctx, args)
            click.echo(f"featstore: error: {e.format_message()} ({command} -h lists the options)", err=True)
            sys.exit(e.exit_code)
        except click.Abort:  # Ctrl-C outside a write (a write rolls back and says so itself), or EOF at a prompt
            click.echo("featstore: interrupted", err=True)
            sys.exit(130)
        sys.exit(0)

    def _command_named(self, ctx: click.Context | None, args) -> str:
        """`featstore NAME` of the command whose options were wrong (its context, else its name on the command
        line), or `featstore` where none was named."""
        if ctx is not None and ctx.command is not self:
            return " ".join(["featstore", *ctx.command_path.split()[1:]])
        given = [str(a) for a in (sys.argv[1:] if args is None else args)]
        name = next((a for a in given if not a.startswith("-")), None)
        return f"featstore {name}" if name in self.commands else "featstore"


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(package_name="featstore")
def cli() -> None:
    """Map when a frozen classifier makes up its mind: build a feature store, probe it, query it."""


@cli.command()
@model_spec_options()
@image_source_options()
@option("--store", "create")
@options(option("--views"), option("--anchors"), option("--taps"), option("--pool"), option("--chunk-rows"))
@run_options("batch_size", "device", "workers", "seed", "threads", "progress")
@options(option("--precision"), option("--store-dtype"), option("--decode"), option("--skip-bad"),
         option("--rebuild-changed"), option("--name"), option("--compile"))
@user_errors
def build(**given) -> None:
    """Extract pooled anchor activations (and logits) of MODEL over DATA into STORE; resumable."""
    (model, images, run), rest = split_options(given, ModelSpec, ImageSource, RunOptions)
    images.check_exists()  # before torch and the model load
    from featstore.api.jobs import build as run_build
    from featstore.api.jobs import check_build_choices

    check_build_choices(rest["views"], rest["anchors"], rest["taps"])

    result = run_build(model=model, images=images, run=run, **rest)
    if result.repaired:
        click.echo(f"repaired {len(result.repaired)} damaged part(s) of the store: "
                   f"{'; '.join(result.repaired[:3])}{' …' if len(result.repaired) > 3 else ''}", err=True)
    if result.damaged:
        click.echo(f"re-did {len(result.damaged)} damaged chunk(s) found by the integrity check: "
                   f"{'; '.join(result.damaged[:3])}{' …' if len(result.damaged) > 3 else ''}", err=True)
    if result.changed_images:
        click.echo(f"{len(result.changed_images)} image file(s) changed since the store was built (first: "
                   f"{result.changed_images[0]}): their chunks were recomputed here and marked to be in every other "
                   f"model and view of the store", err=True)
    if result.bad_images:
        click.echo(f"skipped {len(result.bad_images)} unreadable image(s), recorded in the store: "
                   f"{', '.join(result.bad_images[:3])}{' …' if len(result.bad_images) > 3 else ''}", err=True)
    rate = result.images_processed / result.seconds if result.seconds > 0 and result.images_processed else 0.0
    click.echo(f"{result.key}: {result.chunks_written} chunk(s) written, {result.chunks_skipped} already done, "
               f"{result.images} images ({rate:.1f} img/s)")


@cli.command()
@option("--store", "read")
@option("--model", "group")
@option("--db", "write")
@options(option("--view", "predict"), option("--variant", "probe"), option("--train-on-view"), option("--cross-fit"),
         option("--project-dim"))
@run_options("seed", "device", "threads", "progress", roles={"seed": "probe"})
@options(option("--split-seed"), option("--val-frac"), option("--memory-budget"))
@user_errors
def probe(**given) -> None:
    """Train a probe per anchor from the store (linear by default, or any --variant) and land every prediction in
    DuckDB."""
    from featstore.api.declared import VARIANT
    from featstore.api.store import open_store

    (run,), rest = split_options(given, RunOptions)
    project_dim = rest.pop("project_dim")
    if project_dim is not None:
        if rest["variant"] != VARIANT:
            raise FeatstoreError("--project-dim and --variant exclude each other (it means projected:dim=D)")
        rest["variant"] = f"projected:dim={project_dim}"
    open_store(rest["store"])  # a missing or foreign store is refused before torch loads
    from featstore.api.jobs import probe as run_probe
    from featstore.api.results import connect, runs_written

    before = runs_written(rest["db"])
    with warnings.catch_warnings():  # this command says "replaced" in its own line below
        warnings.simplefilter("ignore", RunReplaced)
        result = run_probe(run=run, **rest)
    for run_id in result:
        replaced = f" (replaced the run of that name written {before[run_id]})" if run_id in before else ""
        click.echo(f"wrote run {run_id}{replaced}")
        print_frame(connect(rest["db"]).probe_summary(run_id))


def print_frame(frame, fmt: str = "table", full: bool = False) -> None:
    """csv (nested columns as JSON text), json, or a table; `full` shows whole lists and strings."""
    if fmt == "csv":
        click.echo(csv_ready(frame).write_csv(), nl=False)
    elif fmt == "json":
        click.echo(json_ready(frame).write_json())
    else:
        from featstore.cli.tables import frame_text

        click.echo(frame_text(frame, full))


def csv_ready(frame):
    """CSV holds no nested data: list and struct columns become JSON text (one cell: '[7, 2, 4]'; decimals, dates
    and times in it as their text, '"1.50"', as the json format writes them), and bytes (BLOB) hex text."""
    import polars as pl

    nested = {c: t for c, t in frame.schema.items() if t.is_nested()}
    return _hex_bytes(frame.with_columns(
        pl.Series(c, [None if v is None else json.dumps(_plain(v, "Float32" in str(t)), default=str)
                      for v in frame[c].to_list()], dtype=pl.Utf8) for c, t in nested.items()))


def json_ready(frame):
    """Polars writes no bytes (BLOB) to JSON (a Rust panic): bytes at any depth become hex text."""
    import polars as pl

    nested = [c for c, t in frame.schema.items() if _holds_bytes(t) and t != pl.Binary]
    return _hex_bytes(frame.with_columns(pl.Series(c, [_plain(v, False) for v in frame[c].to_list()], strict=False)
                                         for c in nested))


def _hex_bytes(frame):
    import polars as pl

    return frame.with_columns(pl.col(c).bin.encode("hex") for c, t in frame.schema.items() if t == pl.Binary)


def _holds_bytes(dtype) -> bool:
    """Whether a column's values are, or nest, bytes (a nested type that merely names 'Binary' is converted too:
    harmless)."""
    import polars as pl

    return dtype == pl.Binary or (dtype.is_nested() and "Binary" in str(dtype))


def _plain(value, single: bool):
    """A nested cell as JSON-ready Python; float32 values (`single`) written as their shortest float32 text (0.9, not
    0.8999999761581421), as DuckDB shows them; bytes as hex text."""
    if isinstance(value, list | tuple):
        return [_plain(v, single) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v, single) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.hex()
    if single and isinstance(value, float):
        import numpy as np

        return float(str(np.float32(value)))
    return value


@cli.command()
@option("--db", "several")
@click.argument("statement")
@option("--format")
@option("--full")
@user_errors
def sql(dbs: tuple[Path, ...], statement: str, fmt: str, full: bool) -> None:
    """Run STATEMENT on the database(s), read-only (macros: decision_summary(k), decision_layers(k), …)."""
    from featstore.api.results import connect, stream_rows

    try:  # the table format opens the database once, and reads plain results without Arrow or Polars
        print_stream(stream_rows(list(dbs), statement) if fmt == "table" else connect(list(dbs)).stream(statement),
                     fmt, full)
    except BaseException as e:  # KeyboardInterrupt is no Exception
        if not interrupted(e):
            raise
        click.echo("featstore: interrupted: the query was cancelled; the database is unchanged", err=True)
        sys.exit(130)


SHOWN_ROWS = 40  # rows the table format shows of a streamed result (as a terminal shows them at once)
TABLE_ROWS = 10_000  # with --full (csv and json print every row)


def print_stream(frames, fmt: str = "table", full: bool = False) -> None:
    """Print a result as it streams in (Polars frames, or for the table format plain `Rows`), holding one batch at a
    time: csv and json row by row as `print_frame` would print the whole frame; the table format shows the first
    SHOWN_ROWS rows (TABLE_ROWS with `full`) and counts the others."""
    from featstore.api.results import Rows
    from featstore.cli.tables import frame_text, table_text

    first, limit = next(frames), TABLE_ROWS if full else SHOWN_ROWS
    if fmt == "csv":
        click.echo(csv_ready(first).write_csv(), nl=False)
        for frame in frames:
            click.echo(csv_ready(frame).write_csv(include_header=False), nl=False)
    elif fmt == "json":
        pieces = (json_ready(f).write_json()[1:-1] for f in (first, *frames) if f.height)
        click.echo("[", nl=False)
        for i, piece in enumerate(pieces):
            click.echo(("," if i else "") + piece, nl=False)
        click.echo("]")
    else:
        shown, more = [first], 0
        for frame in frames:
            room = limit - sum(f.height for f in shown)
            if room > 0:
                shown.append(frame.head(room))
            more += frame.height - min(max(room, 0), frame.height)
        head = _joined(shown)
        if head.height > limit:
            more += head.height - limit
            head = head.head(limit)
        click.echo(table_text(head, full) if isinstance(head, Rows) else frame_text(head, full))
        if more:
            see = "--format csv or json prints every row" if full else \
                f"--full shows up to {TABLE_ROWS:,}; --format csv or json prints every row"
            click.echo(f"… {more:,} more row(s) not shown; {see}", err=True)


def _joined(batches: list):
    """Batches of one result as one: `Rows` joined row by row, Polars frames concatenated."""
    from featstore.api.results import Rows

    if isinstance(batches[0], Rows):
        return replace(batches[0], rows=[row for batch in batches for row in batch.rows])
    import polars as pl

    return pl.concat(batches)


@cli.command()
@option("--db", "target")
@click.argument("sources", nargs=-1, type=DB_PATH)
@option("--replace")
@user_errors
def merge(db: Path, sources: tuple[Path, ...], replace: bool) -> None:
    """Fold SOURCES (databases of jobs that ran at the same time) into DB, all or nothing; merging a source twice
    changes nothing. Refuses sources of another image set, split or anchor list, and results that differ."""
    from featstore.api.tasks import merge as run_merge

    result = run_merge(db, sources, replace)
    replaced = f"; replaced {len(result.replaced)} result(s)" if result.replaced else ""
    click.echo(f"{db}: {len(sources)} source(s) folded in, {result.runs} probe run(s) and {result.circuit_runs} "
               f"circuit run(s) now{replaced}")


@cli.command()
@option("--db", "read")
@option("--out", "export")
@user_errors
def export(db: Path, out: Path) -> None:
    """Every table of DB as Parquet under OUT: per-image rows partitioned by run (run_id=...), the rest one
    file each, for any engine (DuckDB, Polars, Spark)."""
    from featstore.api.tasks import export as run_export

    written = run_export(db, out)
    click.echo(f"wrote {len(written)} table(s) under {out}")


@cli.command()
@option("--db", "read")
@options(option("--run", "any"), option("--k"), option("--min-conf"), option("--scope"), option("--band"),
         option("--format"), option("--image"), option("--spread"), option("--refits"))
@user_errors
def timeline(db: Path, run_id: str | None, ks: list[int], min_conf: float, scope: str, band: str, fmt: str,
             image_id: int | None, spread: bool, refits: bool) -> None:
    """The k-sweep of decision layers per run: mean, median, std, early/mid/late, never-stable, stable-but-wrong
    (--image ID: that image's class and confidence at every anchor of every run instead; --run: only those runs;
    --spread: the sweep over a set of probes, with intervals, the range over the set, the agreement of its probe
    families and Fleiss' kappa)."""
    from featstore.api.results import connect

    if spread and image_id is not None:
        raise FeatstoreError("--spread and --image exclude each other: the sweep's spread, or one image's timeline")
    if refits and not spread:
        raise FeatstoreError("--refits needs --spread: it widens the spread's intervals to the probe seeds")
    if fmt == "table" and image_id is None and not spread:  # one open, plain rows: no Arrow or Polars imported
        from featstore.api.results import k_sweep_rows
        from featstore.cli.tables import table_text

        plain = k_sweep_rows(db, ks, scope, min_conf, run_id, band)
        click.echo(table_text(plain.shown))
        for note in plain.notes:
            click.echo(f"note: {note}")
        return
    results = connect(db)
    if image_id is not None:
        shown = results.image_timeline(image_id, ks, run_id)
        if fmt == "table":
            click.echo(f"image {image_id}: {shown.label} ({shown.path}, {shown.split}); each cell: class and "
                       f"confidence, ◆ at l*({shown.k}) (none in a run headed never stable)")
            print_frame(shown.shown, full=True)
        else:
            print_frame(shown.table, fmt)
        return
    if spread:
        sweep = results.spread(ks, scope, run_id, min_conf, refits)
        if fmt != "table":
            print_frame(sweep.table, fmt)
            return
        click.echo(f"band fractions per run, [95% bootstrap interval over {sweep.table['interval_over'][0]}]; family "
                   "= share whose band is the same under every run of its family (C neighbours, seeds); set rows: "
                   "range = min..max over the runs, holds = share whose band is the same under every family's vote, "
                   "kappa = Fleiss' kappa of those votes (0 = chance), chance = the share independent votes would "
                   "agree on; - = one family, nothing to agree")
        print_frame(sweep.shown, full=True)
    else:
        sweep = results.k_sweep(ks, scope, min_conf, run_id, band)
        print_frame(sweep.shown, fmt)
    for note in sweep.notes:
        click.echo(f"note: {note}", err=fmt != "table")


@cli.command()
@option("--db", "read")
@options(option("--run", "several"), option("--k"), option("--min-conf", "compare"), option("--per-pair"),
         option("--part"), option("--scope"), option("--format"))
@user_errors
def compare(db: Path, run_id: str | None, ks: list[int], min_conf: float, per_pair: int, part: str | None,
            scope: str, fmt: str) -> None:
    """When does the network decide, by every established definition: l*(k), prediction depth (Baldock et al.)
    and the joint stable-and-confident criterion, per run; Spearman, early/late cross-tables, disagreeing images."""
    from featstore.api.results import connect

    results = connect(db)
    k = results.window(ks, run_id)
    if part == "matrix" and fmt != "table":
        raise FeatstoreError(f"--part matrix: the matrices are a table; --format {fmt} writes the same numbers "
                             "with --part agreement")
    result = results.compare(run_id, k, min_conf, scope, per_pair).shortened()
    if fmt != "table":
        print_frame(getattr(result, part or "agreement"), fmt)
    elif part == "matrix":
        click.echo("Spearman correlation of the layers, image by image (columns #i: the row #i's definition):")
        print_frame(result.matrix("spearman"))
        click.echo("\nimages early (l < 0.3T) by the row's definition and late (l >= 0.7T) by the column's:")
        print_frame(result.matrix("early_late"))
    else:
        click.echo("\n".join(result.lines(part, k, min_conf)))


@cli.command()
@option("--db", "read")
@option("--out", "report")
@options(option("--k"), option("--min-conf", "compare"), option("--scope"), option("--figures"))
@user_errors
def report(db: Path, out: Path | None, ks: list[int], min_conf: float, scope: str, figures: str | None) -> None:
    """One self-contained HTML page of every run in the database: its plots drawn in the browser from the data in
    it (hover, zoom; a histogram bar lists its images), and its tables."""
    from featstore.api.results import connect

    path = connect(db).report(out, ks, scope, min_conf, progress=lambda step: click.echo(f"report: {step} …",
                                                                                           err=True), figures=figures)
    click.echo(f"wrote {path}")


@cli.command()
@option("--model", "measured")
@option("--db", "costs")
@option("--store", "optional")
@run_options("device", "threads")
@option("--batch-size", "measured")
@option("--repeats")
@option("--image-size")
@user_errors
def cost(model: str, db: Path, store: str | None, device: str, threads: int | None, batch_sizes: list[int],
         repeats: int, image_size: int | None) -> None:
    """Measure the cost of exiting at each anchor: network prefix + probes, ms and FLOPs, into DuckDB."""
    from featstore.api.tasks import cost as measure

    for c in measure(model, db, store, device=device, batch_sizes=batch_sizes, repeats=repeats,
                     image_size=image_size, threads=threads, on_start=lambda: click.echo(
                         f"cost: timing every prefix and probe of {model} on {device}, batch size(s) "
                         f"{', '.join(map(str, batch_sizes))}, {repeats} repeats each …", err=True)):
        click.echo(f"{model} on {c.device}, batch {c.batch_size}: full model {c.ms:.2f} ms, {c.flops / 1e9:.3f} GFLOP")
        for a in c.anchors:
            click.echo(f"  anchor {a.anchor:2d}: prefix {a.ms:8.3f} ms {a.flops / 1e9:8.3f} GFLOP  "
                       f"probe {a.probe_ms:.3f} ms")


@cli.command("exit-sim")
@option("--db", "read")
@option("--run", "one")
@options(option("--k"), option("--thresholds"), option("--combined-thresholds"))
@option("--device", "measured")
@option("--batch-size", "price")
@options(option("--scope"), option("--no-gate"), option("--format"), option("--full"))
@user_errors
def exit_sim(db: Path, run_id: str, ks: list[int], thresholds: list[float], combined_thresholds: list[float],
             device: str | None, batch_size: int, scope: str, no_gate: bool, fmt: str, full: bool) -> None:
    """Simulate early exit from stored predictions: stability, confidence, combined and learned gates (the learned
    one where `featstore gate` fitted one; its thresholds are --thresholds), oracle, Pareto front, every policy
    counted on the same images (printed first: with a gate, those it did not learn from)."""
    from featstore.api.results import connect

    result = connect(db).early_exit(run_id, ks, thresholds, combined_thresholds, device, batch_size, scope,
                                    gate=not no_gate)
    run_id, population = result.run_id, result.population
    if fmt != "table":
        click.echo(population, err=True)  # stdout stays the machine-readable table (its column n says it too)
        print_frame(result.simulation, fmt)
        return
    click.echo(f"early exit for {run_id}, costs measured on {result.device}, batch {batch_size} (ms per image):")
    click.echo(population)
    click.echo("Pareto front (accuracy vs mean latency; identical points merged):")
    print_frame(result.pareto)
    for base in result.simulation.filter(result.simulation["policy"].is_in(["full depth", "oracle"])).iter_rows(
            named=True):
        click.echo(f"{base['policy']}: accuracy {base['accuracy']:.3f}, {base['mean_ms']:.3f} ms per image"
                   + (" (needs the label: an upper bound)" if base["policy"] == "oracle" else ""))
    if full:
        click.echo("\nevery policy:")
        print_frame(result.simulation)
    else:
        click.echo(f"({result.simulation.height} policies simulated; --full lists them all)")


@cli.command()
@option("--db", "gate")
@option("--run", "one")
@option("--split")
@user_errors
def gate(db: Path, run_id: str, split: str) -> None:
    """Fit a learned early-exit gate from a run's stored prediction timelines (exit-sim then evaluates it)."""
    from featstore.api.tasks import gate as train_gate

    result = train_gate(db, run_id, split, on_start=lambda run: click.echo(
        f"gate: reading the timelines of {run} and fitting on its {split} images …", err=True))
    run_id = result.run_id
    top = sorted(result.weights.items(), key=lambda kv: -abs(kv[1]))[:4]
    click.echo(f"gate for {run_id}: fitted on {result.n_images} {split} images ({result.n_rows} anchors, "
               f"{result.positive_share:.0%} already final and right), {result.iterations} Newton steps; largest "
               f"weights {', '.join(f'{n} {w:+.2f}' for n, w in top)}")
    click.echo(f"evaluate it: featstore exit-sim --db {db} --run {run_id}")


@cli.command()
@option("--db", "read")
@option("--run", "one")
@options(option("--scope"), option("--format"))
@user_errors
def taps(db: Path, run_id: str, scope: str, fmt: str) -> None:
    """Layer x module probing: accuracy grid (block x tap), best pairs, act@100 / ln2@60 and gain recovered."""
    import polars as pl

    from featstore.api.results import connect

    result = connect(db).taps(run_id, scope)
    if fmt != "table":
        print_frame(result.grid, fmt)
        return
    click.echo(f"probe accuracy, block x tap ({result.run_id}, scope {scope}):")
    print_frame(result.table)
    click.echo("\nstrategies (gain recovered G = (A_S - A_base) / (A_oracle - A_base)):")
    print_frame(result.gains.with_columns(pl.col("accuracy").round(4)))


@cli.command()
@model_spec_options("vit", "timm")
@image_source_options(limit_role="circuits")
@option("--db", "write")
@options(option("--view", "circuit"), option("--ig-steps"))
@run_options("batch_size", "device", "workers", "seed", "threads", "progress", roles={"batch_size": "circuits"})
@user_errors
def circuits(**given) -> None:
    """EAP-IG edge scores of a ViT on one view (label-free) into DuckDB's edges table."""
    (model, images, run), rest = split_options(given, ModelSpec, ImageSource, RunOptions)
    images.check_exists()  # before torch and the model load
    from featstore.api.tasks import circuits as run_circuits

    db = rest.pop("db")
    result = run_circuits(model=model, images=images, run=run, db=db, **rest)
    click.echo(f"wrote circuit {result.run.run_id}")


@cli.command()
@option("--db", "circuits")
@options(option("--tau", "ddb"), option("--variant", "ddb"), option("--format"))
@user_errors
def ddb(db: Path, tau: float, variant: str, fmt: str) -> None:
    """Dependency Depth Bias of every circuit run (higher: the model leans on deep computation)."""
    from featstore.api.results import connect

    print_frame(connect(db).ddb(tau, variant), fmt)


@cli.command()
@option("--db", "circuits")
@options(option("--id"), option("--ood"), option("--distance"), option("--top-n"), option("--format"))
@user_errors
def css(db: Path, id_run: str, ood_run: str, distance: str, top_n: int, fmt: str) -> None:
    """Circuit Shift Score between an ID and an OOD circuit of one model."""
    from featstore.api.results import connect

    print_frame(connect(db).css(id_run, ood_run, distance, top_n), fmt)


@cli.command()
@option("--store", "read", positional="STORE")
@option("--format")
@user_errors
def info(store: str, fmt: str) -> None:
    """What the store holds: images, models, views, anchors, dims and completeness (--format json: all of it as
    JSON)."""
    if fmt == "csv":
        raise FeatstoreError("--format csv: info prints a table or json (--format json)")
    from featstore.api.store import open_store

    summary = open_store(store).info()
    if fmt == "json":
        click.echo(json.dumps(summary.to_dict(), indent=2))
        return
    click.echo(format_info(summary))


INFO_CLASSES = 10  # class names `featstore info` shows (its JSON lists them all)


def format_info(summary: StoreInfo) -> str:
    """`featstore info`'s table: the images, then per model its network, anchors, views and probes."""
    from featstore.api.store import Damaged

    lines = [f"store  {summary.path}"]
    im = summary.images
    repair = "run featstore verify, then the same featstore build to repair it"
    if isinstance(im, Damaged):
        lines.append(f"images DAMAGED: {im.what}; {repair}")
    elif im:
        space = " labelled as ImageNet-1k indices" if im.label_space == "imagenet-1k" else ""
        lines.append(f"images {im.count} in {im.classes} classes{space} ({im.source})")
        if im.class_names:
            shown = ", ".join(im.class_names[:INFO_CLASSES])
            more = (f" … ({len(im.class_names)} in all: --format json lists them)"
                    if len(im.class_names) > INFO_CLASSES else "")
            lines.append(f"classes {shown}{more}")
    for key, m in summary.models.items():
        if isinstance(m, Damaged):
            lines.append(f"\nmodel  {key}: DAMAGED: {m.what}")
            continue
        p = m.preprocessing
        top1 = f" (published top-1 {m.published_top1:.2f}%)" if m.published_top1 is not None else ""
        lines.append(f"\nmodel  {key}: {m.model}  weights {m.weights}{top1}  classes {m.num_classes}")
        prep = f"resize {p.resize} crop {p.crop} {p.interpolation}" if p else "none (written directly)"
        pool = f"  pool {m.token_pool}" if m.reads_tokens else ""
        lines.append(f"  preprocessing {prep}{pool}  chunk rows {m.chunk_rows}")
        lines.append("  anchors " + ", ".join(f"{a.index}:{a.name}[{a.dim}]" for a in m.anchors))
        for view, v in m.views.items():
            if isinstance(v, Damaged):
                lines.append(f"  view {view}: DAMAGED: {v.what}; {repair}")
                continue
            state = "complete" if v.complete else "INCOMPLETE (rerun build to resume)"
            if v.damaged_chunks:
                state = (f"DAMAGED (chunk files missing: {', '.join(map(str, v.damaged_chunks))}; run featstore "
                         f"verify, then rerun build to re-do them)")
            threads = f" (CPU threads {', '.join(map(str, v.threads))})" if v.threads else ""
            lines.append(f"  view {view}: {v.chunks_done}/{v.chunks} chunks, {v.skipped} skipped, {state}{threads}")
        if m.probes:
            lines.append("  probes " + ", ".join(m.probes))
        if m.foreign:
            lines.append("  not featstore's (ignored): " + ", ".join(m.foreign))
    return "\n".join(lines)


@cli.command()
@option("--model", "network", positional="MODEL")
@option("--all")
@user_errors
def anchors(model: str, every: bool) -> None:
    """The anchors the model gets by default, or (with --all) every name --anchors accepts, one per line (a
    preset's defaults without loading the model)."""
    from featstore.api.tasks import anchors as anchor_listing

    for line in anchor_listing(model, every):
        click.echo(line)


@cli.command()
@option("--out", "demo")
@options(option("--dataset"), option("--epochs"), option("--limit", "demo"))
@run_options("threads", "progress")
@user_errors
def demo(out: Path, dataset: str, epochs: int | None, limit: int | None, threads: int | None, progress: bool) -> None:
    """The whole pipeline offline: images -> trained ResNet-18 -> store -> probes -> DuckDB -> k-sweep, report."""
    from featstore.api.results import connect
    from featstore.api.tasks import demo as run_demo
    from featstore.api.tasks import load_demo

    with lasting_imports():
        load_demo()
    result = run_demo(out, dataset=dataset, epochs=epochs, limit=limit,
                      run=RunOptions(threads=threads, progress=progress))
    run_id = result.sweep["run_id"][0]  # one run: the images of one probe, not every probe's summed
    results = connect(result.db)
    shown = results.runs
    t = shown.filter(shown["run_id"] == run_id)["n_anchors"][0] - 1
    click.echo(f"\nWhere the clean test images decide (l*(k), {result.sweep['n'][0]} images, anchors 0..{t}):")
    print_frame(result.sweep.select("k", "mean", "median", "f_early", "f_mid", "f_late", "never_stable",
                                    "stable_but_wrong"))
    for note in results.notes(result.sweep["k"].to_list(), [run_id]):
        click.echo(f"note: {note}")
    shifts = ", ".join(f"{v} {d:+.2f}" for v, d in result.shift.select("view", "delta").rows())
    click.echo(f"corruption shift of mean l* (k = 2): {shifts}")
    timing = ", ".join(f"{k} {v:.0f}s" for k, v in result.seconds.items())
    click.echo(f"time: {timing} (total {sum(result.seconds.values()):.0f}s)")
    click.echo(f"\nreport: {result.report}\ntry:    featstore sql --db {result.db} \"SELECT layer, count(*) AS images "
               f"FROM decision_layers(2) WHERE run_id = '{run_id}' GROUP BY layer ORDER BY layer\"")


@cli.command()
@option("--store", "read", positional="STORE")
@option("--model", "only")
@option("--quick")
@option("--db", "verified")
@user_errors
def verify(store: str, model: str | None, quick: bool, dbs: tuple[Path, ...]) -> None:
    """Check everything the store holds: the image table, each model's and array's metadata, and every chunk
    marked done (its files present and decodable, its values those its commit wrote, no NaN or infinity in rows
    not marked skipped); with --db, that every probe run of those databases finds its weights in the store.
    Lists each problem; exit status 1 if any (the same build repairs what it can). Also lists the probe weight
    versions no run names (`featstore gc` removes them; they are no damage)."""
    from featstore.api.store import open_store

    found = open_store(store).verify(model, deep=not quick, dbs=dbs)
    problems, leftovers = found.problems, found.unreferenced
    for problem in problems:
        click.echo(str(problem))
    for u in leftovers:
        click.echo(str(u))
    if any(u.removable for u in leftovers):
        click.echo(f"{sum(u.removable for u in leftovers)} probe weight version(s) no run names: `featstore gc "
                   f"--store {store}` removes them", err=True)
    if problems:
        click.echo(f"{len(problems)} problem(s); rerun the same `featstore build` to repair what it can recompute, "
                   f"and the same `featstore probe` for a run whose weights are missing", err=True)
        sys.exit(1)
    weights = f"; every probe run of {len(dbs)} database(s) finds its weights" if dbs else ""
    click.echo(f"{store}: the image table and all metadata are sound, every done chunk is intact{weights}")


@cli.command()
@option("--store", "read", positional="STORE")
@option("--model", "only")
@option("--db", "kept")
@options(option("--min-age"), option("--dry-run"))
@user_errors
def gc(store: str, model: str | None, dbs: tuple[Path, ...], min_age: float, dry_run: bool) -> None:
    """Remove the probe weight versions no run names (a probe stopped between saving its weights and committing its
    runs left them): only where every database in reach (the one each version was saved for, and --db) can be read
    and names none of them, and nothing of it was written for --min-age seconds. Lists what it kept and why."""
    from featstore.api.tasks import gc as collect

    found = collect(store, dbs, model, min_age, dry_run)
    for u in found:
        verb = ("would remove" if dry_run else "removed") if u.removable else "kept"
        click.echo(f"{verb} {u}")
    removed = sum(u.removable for u in found)
    click.echo(f"{store}: {removed} probe weight version(s) {'to remove' if dry_run else 'removed'}, "
               f"{len(found) - removed} kept")


@cli.command()
@click.argument("config", type=click.Path(path_type=Path))
@option("--db", "write")
@options(option("--ig-steps"), option("--limit", "circuits"))
@run_options("batch_size", "device", "workers", "seed", "threads", roles={"batch_size": "circuits"})
@options(option("--tau", "zoo"), option("--top-n"), option("--format"))
@run_options("progress")
@user_errors
def zoo(config: Path, fmt: str, **given) -> None:
    """A model zoo's ID/OOD accuracies and circuits, then how well DDB and CSS predict OOD accuracy and the
    accuracy drop (CONFIG: a TOML file of models and image sets)."""
    from featstore.api.tasks import zoo as run_zoo

    (run,), rest = split_options(given, RunOptions)
    print_frame(run_zoo(config=config, run=run, **rest).table, fmt)


@cli.command()
@click.argument("study_file", type=click.Path(path_type=Path))
@option("--data", "override")
@option("--out", "study")
@option("--store", "study")
@run_options("threads", "progress")
@user_errors
def study(study_file: Path, data: Path | None, out: Path | None, store: str | None, threads: int | None,
          progress: bool) -> None:
    """Run a declared grid (models x weights x views x probes, a TOML file) end to end; reruns skip finished steps."""
    from featstore.api.tasks import study as run_study

    result = run_study(study_file, data, out, progress, store, threads)
    click.echo(f"{len(result.ran)} step(s) run, {len(result.skipped)} already done")
    click.echo(f"\nthe paper's Table 1 shape beside its published figures ({result.published_source or 'none'});")
    click.echo("featstore = mean over the probe seeds, seed_std/min/max their spread, n = images counted")
    click.echo(result.population)
    print_frame(result.table)
    click.echo(f"\nreport: {result.report}\ndatabase: {result.db}\nstore: {result.store}")


@cli.command()
@option("--store", "read")
@option("--model", "group")
@option("--db", "write")
@options(option("--view", "cka"), option("--unbiased"))
@run_options("threads", "progress")
@user_errors
def cka(store: str, model: str, db: Path, view: str, unbiased: bool, threads: int | None, progress: bool) -> None:
    """Linear CKA between every pair of a model's anchors, from the stored features, into DuckDB's anchor_cka."""
    from featstore.api.tasks import cka as compute_cka

    result = compute_cka(store, model, db, view, unbiased, threads, progress)
    click.echo(f"wrote the {result.estimator} CKA of {len(result.anchors)} anchors of {result.key}/{view} "
               f"({result.n_images} images, {result.passes} pass(es) over the store) into {db}")


_OWN_PROCESS = {"is": False}  # set by `main`: the command is the process, not a call in a test or a notebook


@contextmanager
def lasting_imports() -> Iterator[None]:
    """Import a command's libraries with Python's cyclic collector paused, then freeze what they made. torch,
    torchvision, zarr and featstore make ~370,000 objects that live as long as the process; collecting while they
    arrive passes over all of them again and again (a third of the demo's import time), and a frozen object is
    never looked at again by the collections of what the command itself makes. Only where the command is the
    process (`main`): a test or a notebook that calls it keeps its collector as it was."""
    if not _OWN_PROCESS["is"]:
        yield
        return
    was_enabled = cyclic_gc.isenabled()
    cyclic_gc.disable()
    try:
        yield
    finally:
        cyclic_gc.freeze()
        if was_enabled:
            cyclic_gc.enable()


def main() -> None:
    """The `featstore` command. Once it has ended (its writes committed or rolled back, its line said), a Ctrl-C
    can only interrupt Python's own cleanup at exit, which prints a traceback of it: it is ignored from then on.
    Its objects are frozen for that cleanup: Python still frees by their counts of references what it frees as
    it empties its modules, and only skips the collector's passes over them, which took seconds with torch
    loaded (an object in a reference cycle that is still alive at exit gets no finaliser, as Python allows)."""
    _OWN_PROCESS["is"] = True
    try:
        cli(prog_name="featstore")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cyclic_gc.freeze()


if __name__ == "__main__":
    main()

