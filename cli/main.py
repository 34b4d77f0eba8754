"""The `featstore` command: parses options, calls the library, prints. No logic lives here."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from featstore.analytics.scopes import SCOPES
from featstore.errors import FeatstoreError


def user_errors(fn):
    """Turn FeatstoreError into one line on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except FeatstoreError as e:
            click.echo(f"featstore: error: {e}", err=True)
            sys.exit(2)

    return wrapper


def _list_parser(kind: str, example: str, minimum: int):
    """A click callback turning '1,2,3' into sorted distinct ints >= minimum, with an error of its own kind."""

    def parse(_ctx, param, text: str) -> list[int]:
        try:
            values = sorted({int(v) for v in text.split(",") if v.strip()})
        except ValueError:
            raise click.BadParameter(f"{text!r}: give {kind} such as {example}", param=param) from None
        if not values or values[0] < minimum:
            raise click.BadParameter(f"{text!r}: {kind} are whole numbers >= {minimum}", param=param)
        return values

    return parse


def _threshold_parser(_ctx, param, text: str) -> list[float]:
    """'0.5:0.99:0.01' (start:stop:step, stop included) or '0.5,0.9' -> confidence thresholds."""
    try:
        if ":" in text:
            start, stop, step = (float(v) for v in text.split(":"))
            count = int(round((stop - start) / step)) + 1
            values = [round(start + i * step, 10) for i in range(count)]
        else:
            values = [float(v) for v in text.split(",") if v.strip()]
    except (ValueError, ZeroDivisionError):
        raise click.BadParameter(f"{text!r}: give start:stop:step (e.g. 0.5:0.99:0.01) or a comma list",
                                 param=param) from None
    if not values or not all(0 <= v <= 1 for v in values):
        raise click.BadParameter(f"{text!r}: confidences lie in [0, 1]", param=param)
    return values


def db_option(help: str = "A database filled by featstore probe."):
    return click.option("--db", required=True, type=click.Path(path_type=Path), help=help)


format_option = click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
                             help="Output format.")
scope_option = click.option("--scope", type=click.Choice(SCOPES), default="auto",
                            help="Images counted: auto = the test split, or all images of cross-fit runs.")
ks_option = click.option("--k", "ks", default="1,2,3,4", callback=_list_parser("stability windows", "1,2,3,4", 1),
                         help="Stability windows k (k anchors after the first).")


class _OneLineErrors(click.Group):
    """Usage errors (a bad choice, an unknown option) as one line and exit status 2, like every bad input."""

    def main(self, *args, **kwargs):
        kwargs.pop("standalone_mode", None)
        try:
            super().main(*args, standalone_mode=False, **kwargs)
        except click.ClickException as e:
            click.echo(f"featstore: error: {e.format_message()} (featstore COMMAND -h lists the options)", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(0)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(package_name="featstore")
def cli() -> None:
    """Map when a frozen classifier makes up its mind: build a feature store, probe it, query it."""


@cli.command()
@click.option("--model", required=True, help="torchvision or timm model name (timm/NAME forces timm).")
@click.option("--data", required=True, type=click.Path(path_type=Path), help="ImageFolder root, or flat folder.")
@click.option("--store", required=True, type=click.Path(path_type=Path), help="Zarr store to create or extend.")
@click.option("--labels", type=click.Path(path_type=Path), help="CSV filename,label for a flat folder.")
@click.option("--views", default="clean", help="Comma list: clean, gaussian_noise-S, gaussian_blur-S, brightness-S.")
@click.option("--weights", default="auto", help="auto (paper for the paper's five models, else default) | paper | "
              "default | a torchvision weights name or timm pretrained tag | PATH | none.")
@click.option("--anchors", help="Comma list of module names (X.mid inside ResNet blocks); default: preset.")
@click.option("--taps", help="Transformer module taps per block: all, or a list of ln1,attn,resid_mid,ln2,fc1,act,"
              "fc2,resid (timm ViTs); anchors become (block, tap) pairs.")
@click.option("--pool", type=click.Choice(["cls", "mean"]), help="Token pooling for ViTs [default: cls; mean "
              "with --taps].")
@click.option("--image-size", type=int, help="Crop size override; resizes to S*256/224 first.")
@click.option("--limit", type=int, help="Deterministic subset of N images (ids stay those of the full set).")
@click.option("--chunk-rows", default=1024, help="Store chunk size along images; the unit of resume.")
@click.option("--batch-size", default=64, help="Images per forward pass.")
@click.option("--device", default="auto", help="auto | cpu | cuda | cuda:N.")
@click.option("--workers", type=int, help="Decoders [default: a thread per core on CPU, taking turns with the forward; "
              "up to 8 DataLoader processes overlapping it on CUDA]; 0 decodes serially.")
@click.option("--precision", type=click.Choice(["auto", "fp32", "fp16", "bf16"]), default="auto",
              help="auto = fp16 autocast on CUDA, fp32 on CPU.")
@click.option("--decode", type=click.Choice(["auto", "cpu", "gpu"]), default="auto", help="auto = gpu on CUDA: "
              "decode, crop and views on the device; cpu = PIL in the loader (the reference).")
@click.option("--skip-bad", is_flag=True, help="Record corrupt images as skipped instead of stopping.")
@click.option("--seed", default=0, help="Seed for random init, --limit and noise views.")
@click.option("--name", help="Store group for this model config [default: the model name].")
@click.option("--progress/--no-progress", default=True)
@user_errors
def build(**options) -> None:
    """Extract pooled anchor activations (and logits) of MODEL over DATA into STORE; resumable."""
    from featstore.build import BuildConfig
    from featstore.build import build as run_build

    result = run_build(BuildConfig(**options))
    if result.damaged:
        click.echo(f"re-did {len(result.damaged)} damaged chunk(s) found by the integrity check: "
                   f"{'; '.join(result.damaged[:3])}{' …' if len(result.damaged) > 3 else ''}", err=True)
    if result.bad_images:
        click.echo(f"skipped {len(result.bad_images)} unreadable image(s), recorded in the store: "
                   f"{', '.join(result.bad_images[:3])}{' …' if len(result.bad_images) > 3 else ''}", err=True)
    rate = result.images_processed / result.seconds if result.seconds > 0 and result.images_processed else 0.0
    click.echo(f"{result.key}: {result.chunks_written} chunk(s) written, {result.chunks_skipped} already done, "
               f"{result.images} images ({rate:.1f} img/s)")


@cli.command()
@click.option("--store", required=True, type=click.Path(path_type=Path), help="A store made by featstore build.")
@click.option("--model", required=True, help="Model (store group) whose anchors to probe.")
@db_option("DuckDB file to create or extend.")
@click.option("--view", default="clean", help="View(s) to predict: a name, a comma list, or all.")
@click.option("--variant", default="linear", help="linear | paper | projected[:dim=N] (or a registered one).")
@click.option("--train-on-view", help="Train the probes on this view [default: clean].")
@click.option("--cross-fit", default=0, help="K >= 2: K folds, every image predicted out of sample.")
@click.option("--project-dim", type=int, help="Capacity control: the projected variant at this width (a seeded "
              "random projection of wider anchors); results coexist with the raw variant's.")
@click.option("--seed", default=0, help="Probe seed (initialisation, shuffling, projections); runs of several "
              "seeds land side by side (macro seed_spread).")
@click.option("--split-seed", default=0, help="Seed of the train/val/test split and cross-fit folds (fixed per "
              "database).")
@click.option("--val-frac", default=0.1, help="Share of the train split carved out as val (fixed per database).")
@click.option("--memory-budget", default="4GB", help="Keep features in memory up to this size, else stream chunks.")
@click.option("--device", default="auto", help="auto | cpu | cuda | cuda:N.")
@click.option("--threads", type=click.IntRange(min=1), help="CPU threads for fitting [default: the cores idle "
              "when the fit starts]; recorded per fit in probe_fits.")
@click.option("--progress/--no-progress", default=True)
@user_errors
def probe(**options) -> None:
    """Train one linear probe per anchor from the store and land every prediction in DuckDB."""
    from featstore.workflows.probe import ProbeConfig
    from featstore.workflows.probe import probe as run_probe

    project_dim = options.pop("project_dim")
    if project_dim is not None:
        if options["variant"] != "linear":
            raise FeatstoreError("--project-dim and --variant exclude each other (it means projected:dim=D)")
        options["variant"] = f"projected:dim={project_dim}"
    for run_id in run_probe(ProbeConfig(**options)):
        click.echo(f"wrote run {run_id}")


def print_frame(frame, fmt: str = "table") -> None:
    import polars as pl

    if fmt == "csv":
        click.echo(frame.write_csv(), nl=False)
    elif fmt == "json":
        click.echo(frame.write_json())
    else:
        with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=240, fmt_str_lengths=80,
                       tbl_hide_dataframe_shape=True, float_precision=4):
            click.echo(frame)


@cli.command()
@db_option()
@click.argument("statement")
@format_option
@user_errors
def sql(db: Path, statement: str, fmt: str) -> None:
    """Run STATEMENT on the database, read-only (macros: decision_summary(k), decision_layers(k), …)."""
    from featstore.analytics.queries import query

    print_frame(query(db, statement), fmt)


@cli.command()
@db_option()
@ks_option
@scope_option
@format_option
@user_errors
def timeline(db: Path, ks: list[int], scope: str, fmt: str) -> None:
    """The k-sweep of decision layers per run: mean, median, std, early/mid/late, never-stable, stable-but-wrong."""
    from featstore.analytics.queries import k_sweep

    frame = k_sweep(db, ks, scope)
    print_frame(frame.drop("model", "view", "probe"), fmt)


@cli.command()
@db_option()
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder for report.html and PNGs.")
@ks_option
@scope_option
@user_errors
def report(db: Path, out: Path, ks: list[int], scope: str) -> None:
    """One self-contained HTML page of plots and tables of every run in the database."""
    from featstore.analytics.report import write_report

    path = write_report(db, out, ks, scope)
    click.echo(f"wrote {path}")


@cli.command()
@click.option("--model", required=True, help="Model (store group / DB model) to measure.")
@db_option("DuckDB file to keep the costs in.")
@click.option("--store", type=click.Path(path_type=Path), help="Read anchors, crop and head width from this store.")
@click.option("--device", default="auto", help="auto | cpu | cuda | cuda:N.")
@click.option("--batch-size", "batch_sizes", default="1,64", callback=_list_parser("batch sizes", "1,64", 1),
              help="Batch sizes: latency (1) and throughput.")
@click.option("--repeats", default=20, help="Timed runs per measurement (median), after 3 warm-up runs.")
@click.option("--image-size", type=int, help="Input crop when no --store is given [default: the model's].")
@user_errors
def cost(model: str, db: Path, store: Path | None, device: str, batch_sizes: list[int], repeats: int,
         image_size: int | None) -> None:
    """Measure the cost of exiting at each anchor: network prefix + probes, ms and FLOPs, into DuckDB."""
    from featstore.workflows.cost import measure_model

    for c in measure_model(model, db, store, device, batch_sizes, repeats, image_size):
        click.echo(f"{model} on {c.device}, batch {c.batch_size}: full model {c.ms:.2f} ms, {c.flops / 1e9:.3f} GFLOP")
        for a in c.anchors:
            click.echo(f"  anchor {a.anchor:2d}: prefix {a.ms:8.3f} ms {a.flops / 1e9:8.3f} GFLOP  "
                       f"probe {a.probe_ms:.3f} ms")


@cli.command("exit-sim")
@db_option()
@click.option("--run", "run_id", required=True, help="A run id (see `featstore sql \"SELECT run_id FROM runs\"`).")
@ks_option
@click.option("--thresholds", default="0.5:0.99:0.01", callback=_threshold_parser,
              help="Confidence thresholds: start:stop:step or a list.")
@click.option("--combined-thresholds", default="0.5,0.7,0.9", callback=_threshold_parser,
              help="Thresholds of the stability AND confidence gate.")
@click.option("--device", help="Device the costs were measured on [default: the only one in the DB].")
@click.option("--batch-size", default=1, help="Which measured batch size prices the exits.")
@scope_option
@format_option
@user_errors
def exit_sim(db: Path, run_id: str, ks: list[int], thresholds: list[float], combined_thresholds: list[float],
             device: str | None, batch_size: int, scope: str, fmt: str) -> None:
    """Simulate early exit from stored predictions: stability, confidence, combined gates, oracle, Pareto front."""
    from featstore.analytics.queries import early_exit

    result = early_exit(db, run_id, device, batch_size, ks=ks, thresholds=thresholds,
                        combined=combined_thresholds, scope=scope)
    if fmt != "table":
        print_frame(result.simulation, fmt)
        return
    click.echo(f"early exit for {run_id}, costs measured on {result.device}, batch {batch_size} (ms per image):")
    print_frame(result.simulation)
    click.echo("\nPareto front (accuracy vs mean latency):")
    print_frame(result.pareto)


@cli.command()
@db_option()
@click.option("--run", "run_id", required=True, help="A run of a store built with --taps.")
@scope_option
@format_option
@user_errors
def taps(db: Path, run_id: str, scope: str, fmt: str) -> None:
    """Layer x module probing: accuracy grid (block x tap), best pairs, act@100 / ln2@60 and gain recovered."""
    import polars as pl

    from featstore.analytics import queries as q

    grid = q.tap_grid(db, run_id, scope)
    if grid.is_empty():
        raise FeatstoreError(f"run {run_id!r} in {db} has no (block, tap) anchors; build the store with --taps")
    wide = grid.pivot(on="tap", index="block", values="accuracy", aggregate_function="first")
    if fmt != "table":
        print_frame(grid, fmt)
        return
    click.echo(f"probe accuracy, block x tap ({run_id}, scope {scope}):")
    print_frame(wide.sort("block"))
    click.echo("\nstrategies (gain recovered G = (A_S - A_base) / (A_oracle - A_base)):")
    print_frame(q.tap_gains(db, run_id, scope).with_columns(pl.col("accuracy").round(4)))


@cli.command()
@click.option("--model", required=True, help="A timm VisionTransformer name (any depth/heads).")
@click.option("--data", required=True, type=click.Path(path_type=Path))
@db_option("DuckDB file to create or extend.")
@click.option("--view", default="clean", help="clean or a corruption view (the OOD set).")
@click.option("--labels", type=click.Path(path_type=Path), help="CSV filename,label for a flat folder.")
@click.option("--weights", default="default", help="default | PATH | none.")
@click.option("--image-size", type=int)
@click.option("--ig-steps", default=5, help="m: integrated-gradient steps (left Riemann sum).")
@click.option("--limit", default=500, help="Images (a seeded subset with stable ids).")
@click.option("--batch-size", default=32)
@click.option("--device", default="auto")
@click.option("--workers", type=int)
@click.option("--seed", default=0)
@click.option("--progress/--no-progress", default=True)
@user_errors
def circuits(**options) -> None:
    """EAP-IG edge scores of a ViT on one view (label-free) into DuckDB's edges table."""
    from featstore.circuits import CircuitConfig
    from featstore.workflows.circuits import run_circuits

    db = options.pop("db")
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in options.items()}
    click.echo(f"wrote circuit {run_circuits(CircuitConfig(**options), db).run['run_id']}")


@cli.command()
@db_option("A database filled by featstore circuits.")
@click.option("--tau", default=0.3, help="Shallow = blocks < tau L, deep = blocks >= (1 - tau) L.")
@click.option("--variant", type=click.Choice(["global", "deep", "out"]), default="global")
@format_option
@user_errors
def ddb(db: Path, tau: float, variant: str, fmt: str) -> None:
    """Dependency Depth Bias of every circuit run (higher: the model leans on deep computation)."""
    from featstore.analytics.queries import query

    print_frame(query(db, "SELECT * FROM ddb(tau := ?, variant := ?)", [tau, variant]), fmt)


@cli.command()
@db_option("A database filled by featstore circuits.")
@click.option("--id", "id_run", required=True, help="Circuit run on in-distribution images.")
@click.option("--ood", "ood_run", required=True, help="Circuit run of the same model on shifted images.")
@click.option("--distance", type=click.Choice(["srcc", "cosine", "l2", "jaccard", "laplacian", "netlsd"]),
              default="srcc")
@click.option("--top-n", default=200, help="Edges of the top-n graphs (jaccard, laplacian, netlsd).")
@format_option
@user_errors
def css(db: Path, id_run: str, ood_run: str, distance: str, top_n: int, fmt: str) -> None:
    """Circuit Shift Score between an ID and an OOD circuit of one model."""
    from featstore.analytics.circuit_graphs import circuit_shift

    print_frame(circuit_shift(db, id_run, ood_run, distance, top_n), fmt)


@cli.command()
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@user_errors
def info(store: Path, as_json: bool) -> None:
    """What STORE holds: images, models, views, anchors, dims and completeness."""
    from featstore.store import FeatureStore

    summary = FeatureStore(store).info()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(format_info(summary))


def format_info(summary: dict) -> str:
    lines = [f"store  {summary['path']}"]
    im = summary["images"]
    if im:
        space = " labelled as ImageNet-1k indices" if im.get("label_space") == "imagenet-1k" else ""
        lines.append(f"images {im['count']} in {im['classes']} classes{space} ({im['source']})")
    for key, m in summary["models"].items():
        p = m["preprocessing"]
        top1 = f" (published top-1 {m['published_top1']:.2f}%)" if m.get("published_top1") is not None else ""
        lines.append(f"\nmodel  {key}: {m['model']}  weights {m['weights']}{top1}  classes {m['num_classes']}")
        prep = f"resize {p['resize']} crop {p['crop']} {p['interpolation']}" if p else "none (written directly)"
        lines.append(f"  preprocessing {prep}  pool {m['token_pool']}  chunk rows {m['chunk_rows']}")
        lines.append("  anchors " + ", ".join(f"{i}:{name}[{dim}]" for i, name, _, dim in m["anchors"]))
        for view, v in m["views"].items():
            state = "complete" if v["chunks_done"] == v["chunks"] else "INCOMPLETE (rerun build to resume)"
            if v.get("damaged_chunks"):
                state = (f"DAMAGED (chunk files missing: {', '.join(map(str, v['damaged_chunks']))}; run featstore "
                         f"verify, then rerun build to re-do them)")
            lines.append(f"  view {view}: {v['chunks_done']}/{v['chunks']} chunks, {v['skipped']} skipped, {state}")
        if m.get("probes"):
            lines.append("  probes " + ", ".join(m["probes"]))
    return "\n".join(lines)


@cli.command()
@click.option("--model", required=True, help="torchvision or timm model name.")
@click.option("--all", "show_all", is_flag=True, help="List every name --anchors (and --taps) accepts instead.")
@user_errors
def anchors(model: str, show_all: bool) -> None:
    """The anchors MODEL gets by default, or (with --all) every name --anchors accepts, one per line."""
    from featstore.extraction import anchor_listing

    for line in anchor_listing(model, show_all):
        click.echo(line)


@cli.command()
@click.option("--out", type=click.Path(path_type=Path), default=Path("featstore-demo"),
              help="Folder for the images, the cached network, the store, the database and the report "
                   "(one subfolder per --dataset).")
@click.option("--dataset", default="layouts", show_default=True,
              help="layouts: generated dot layouts, class colour in half the images (decided at the stem or "
                   "later); digits: scikit-learn's 8x8 digits (nearly all decided at the stem).")
@click.option("--epochs", type=int, help="Training epochs of the ResNet-18 (cached per value; default per dataset).")
@click.option("--limit", type=int, help="Use only about N images (a quick run, e.g. in CI).")
@click.option("--progress/--no-progress", default=True)
@user_errors
def demo(out: Path, dataset: str, epochs: int | None, limit: int | None, progress: bool) -> None:
    """The whole pipeline offline: images -> trained ResNet-18 -> store -> probes -> DuckDB -> k-sweep, report."""
    from featstore.workflows.demo import run_demo

    result = run_demo(out, dataset=dataset, epochs=epochs, limit=limit, progress=progress)
    click.echo(f"\nWhere the clean test images decide (l*(k), {result.sweep['n'][0]} images, anchors 0..11):")
    print_frame(result.sweep.select("k", "mean", "median", "f_early", "f_mid", "f_late", "never_stable",
                                    "stable_but_wrong"))
    shifts = ", ".join(f"{v} {d:+.2f}" for v, d in result.shift.select("view", "delta").rows())
    click.echo(f"corruption shift of mean l* (k = 2): {shifts}")
    timing = ", ".join(f"{k} {v:.0f}s" for k, v in result.seconds.items())
    click.echo(f"time: {timing} (total {sum(result.seconds.values()):.0f}s)")
    click.echo(f"\nreport: {result.report}\ntry:    featstore sql --db {result.db} \"SELECT layer, count(*) AS images "
               f"FROM decision_layers(2) WHERE view = 'clean' GROUP BY layer ORDER BY layer\"")


@cli.command()
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--model", help="Check only this model (store group) [default: every model].")
@click.option("--quick", is_flag=True, help="Only look for missing chunk files (no chunk is read).")
@user_errors
def verify(store: Path, model: str | None, quick: bool) -> None:
    """Check that every chunk marked done can be trusted: its files present and decodable, no NaN in rows that
    are not marked skipped. Lists each bad (array, chunk); exit status 1 if any (rerun build to re-do them)."""
    from featstore.store import FeatureStore

    problems = FeatureStore(store).verify(model, deep=not quick)
    for problem in problems:
        click.echo(str(problem))
    if problems:
        click.echo(f"{len(problems)} damaged chunk array(s); rerun the same `featstore build` to re-do exactly "
                   f"those chunks", err=True)
        sys.exit(1)
    click.echo(f"{store}: every done chunk is intact")


@cli.command()
@click.argument("config", type=click.Path(path_type=Path))
@db_option("DuckDB file to create or extend.")
@click.option("--ig-steps", default=5, help="m: integrated-gradient steps (left Riemann sum).")
@click.option("--limit", default=500, help="Images per set (a seeded subset with stable ids).")
@click.option("--batch-size", default=32, help="Images per EAP-IG batch (memory grows linearly with it).")
@click.option("--device", default="auto", help="auto | cpu | cuda | cuda:N.")
@click.option("--workers", type=int, help="Image decoders [default: as featstore circuits].")
@click.option("--seed", default=0, help="Seed for --limit, noise views and random-init models.")
@click.option("--tau", default=0.3, help="DDB's shallow/deep split in the printed table (zoo_tau_sweep: all).")
@click.option("--top-n", default=200, help="Edges of the top-n graphs (jaccard, laplacian, netlsd).")
@format_option
@click.option("--progress/--no-progress", default=True)
@user_errors
def zoo(config: Path, fmt: str, **options) -> None:
    """A model zoo's ID/OOD accuracies and circuits, then how well DDB and CSS predict OOD accuracy and the
    accuracy drop (CONFIG: a TOML file of models and image sets)."""
    from featstore.workflows.zoo import ZooConfig, run_zoo

    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in options.items()}
    print_frame(run_zoo(ZooConfig(config=str(config), **options)).table, fmt)


@cli.command()
@click.argument("study_file", type=click.Path(path_type=Path))
@click.option("--data", type=click.Path(path_type=Path), help="Image folder [default: the study's data.path].")
@click.option("--out", type=click.Path(path_type=Path), help="Folder for the store, database, report and study "
              "state [default: ./study-<name>].")
@click.option("--progress/--no-progress", default=True)
@user_errors
def study(study_file: Path, data: Path | None, out: Path | None, progress: bool) -> None:
    """Run a declared grid (models x weights x views x probes, a TOML file) end to end; reruns skip finished steps."""
    from featstore.workflows.study import run_study

    result = run_study(study_file, data, out, progress)
    click.echo(f"{len(result.ran)} step(s) run, {len(result.skipped)} already done")
    click.echo(f"\nthe paper's Table 1 shape beside its published figures ({result.published_source or 'none'}):")
    print_frame(result.table)
    click.echo(f"\nreport: {result.report}\ndatabase: {result.db}\nstore: {result.store}")


def main() -> None:
    cli(prog_name="featstore")


if __name__ == "__main__":
    main()
