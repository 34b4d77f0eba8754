"""`featstore report`: one self-contained HTML page of every run, whose plots the browser draws from the data
embedded in it (plotly.js inlined: it works offline); publication figures (PNG, SVG or PDF by matplotlib) beside it
on request (`figures=`).

Everything drawn comes from the SQL macros through `analytics.queries`, each asked once per report (`_Memo`); this
module only lays it out. The sections draw on matplotlib-like axes (`report_plots`) that record Plotly specs; the
same calls draw the publication figures on matplotlib's own axes.
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from featstore.analytics import queries
from featstore.analytics.bands import late_caveat, late_notes
from featstore.analytics.db import connect, connect_several
from featstore.analytics.exit_policies import DEFAULT_POLICIES
from featstore.analytics.report_figures import PAGE_PX, _Figures, _slug, _table
from featstore.analytics.report_plots import PlotlyFigures, page_scripts
from featstore.analytics.report_readouts import readout_sections
from featstore.analytics.report_robustness import robustness_section
from featstore.errors import FeatstoreError, Step
from featstore.schema import FIGURE_FORMATS, JOINT_MIN_CONF, SCOPE, K


class _Memo:
    """`analytics.queries` with each call answered once per argument list while a report is written: the run
    sections ask for the all-run tables (decision mass, curves, anchor names, meta) once per run, and the
    publication-figure pass asks for everything again. `forget` empties it when the report is done."""

    def __init__(self, module):
        self._module, self._answers = module, {}

    def __getattr__(self, name: str):
        value = getattr(self._module, name)
        if not callable(value) or isinstance(value, type):
            return value

        def answer(*args, **kwargs):
            plain = (str, int, float, bool, list, tuple, type(None), Path)
            key = (name, repr([a if isinstance(a, plain) else id(a) for a in args]), repr(sorted(kwargs.items())))
            if key not in self._answers:
                self._answers[key] = value(*args, **kwargs)
            return self._answers[key]

        return answer

    def forget(self) -> None:
        self._answers.clear()


q = _Memo(queries)


@dataclass(frozen=True)
class ReportContext:
    """What a section renderer gets: the open database, the figure saver and the report's choices."""

    figs: _Figures | PlotlyFigures
    con: object
    runs: pl.DataFrame
    ks: Sequence[int]
    k: int
    scope: str
    min_conf: float


# Extra sections, appended after the built-in ones in this order (e.g. analytics/report_readouts.py appends its
# renderer here): each takes the ReportContext and returns HTML ("" for nothing).
def _readouts(context: ReportContext) -> str:
    """Calibration, overthinking and the CKA matrix (analytics/report_readouts.py) of the clean runs."""
    clean = context.runs.filter(pl.col("view") == "clean")["run_id"].to_list()
    return readout_sections(context.con, clean, scope=context.scope, figs=context.figs)


SECTION_RENDERERS: list[Callable[[ReportContext], str]] = [_readouts]


def check_figures(figures: str | None) -> str | None:
    """The publication figures' format (png, svg or pdf), or None for none."""
    if figures is not None and figures not in FIGURE_FORMATS:
        raise FeatstoreError(f"choose one of {', '.join(FIGURE_FORMATS)} (or none)", field="figures", value=figures)
    return figures


def write_report(db: str | Path, out: str | Path, ks: Sequence[int] | None = None, scope: str = SCOPE,
                 k: int | None = None, min_conf: float = JOINT_MIN_CONF, progress: Callable[[str], None] | None = None,
                 runs: Sequence[str] | None = None, figures: str | None = None) -> Path:
    """Write `out/report.html` for every run in `db`: the k-sweep over `ks`, and the single-k sections (cross-model
    table, headline, decision mass, gallery, the comparison of definitions) at `k` (default 2, or the first k);
    `min_conf` is the joint criterion's threshold in that comparison. `progress` is told each step as it starts
    (the CLI prints them). `runs`: report only these probe runs (a study's declared ones), though the database
    holds others. `figures` ('png', 'svg' or 'pdf'): also every figure as a file of that format drawn by
    matplotlib, for a paper. The page and its figures are written into a folder beside `out` and moved in once the
    page is written, so a failure (a full disk) leaves no figures without their page."""
    check_figures(figures)
    con = connect(db, read_only=True) if runs is None else connect_several([db], runs=runs)
    try:
        q.check_scope(scope)
        ks = q.stability_windows(con, ks)
        if k is not None and k not in ks:
            ks = sorted({*ks, *q.stability_windows(con, [k])})
        if q.runs(con).is_empty() and q.circuit_runs(con).is_empty():
            raise FeatstoreError(f"database {db} has no probe or circuit runs yet; run ",
                                 Step("fs.probe(db=db, ...)", "probe"), " or ",
                                 Step("fs.circuits(db=db, ...)", "circuits"),
                                 " first")
        real = Path(os.path.realpath(out))  # staged beside where the files land: moved in by rename, never copied
        real.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{real.name}.partial-", dir=real.parent))
        try:
            say = progress or (lambda step: None)
            if figures is not None:  # the same sections on matplotlib's axes: the files; their page is dropped
                _write_page(con, db, staging, ks, scope, k, min_conf, lambda step: say(f"{figures} figures: {step}"),
                            _Figures(staging, figures))
            _write_page(con, db, staging, ks, scope, k, min_conf, say, PlotlyFigures())
            real.mkdir(exist_ok=True)
            for made in sorted(staging.iterdir(), key=lambda p: p.name == "report.html"):  # the page last
                os.replace(made, real / made.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        q.forget()
        con.close()
    return Path(out) / "report.html"


def _write_page(con, db: str | Path, out: Path, ks: Sequence[int], scope: str, k: int | None, min_conf: float,
                say: Callable[[str], None], figs: _Figures | PlotlyFigures) -> None:
    """The page, written into `out` (`write_report`'s staging folder), its figures drawn by `figs`."""
    runs = q.runs(con)
    circuit_runs = q.circuit_runs(con)
    if runs.is_empty():
        (out / "report.html").write_text(_page(db, scope, _circuits(figs, con, circuit_runs)))
        return
    say("k-sweep and tables")
    sweep = q.k_sweep(con, ks, scope)
    accuracy = q.probe_accuracy(con, scope)
    k_mid = k if k is not None else K if K in ks else ks[0]
    lasts = sorted({n - 1 for n in runs["n_anchors"].to_list()})  # every run's T
    sections = _unconverged(q.unconverged_probes(con)) + [
        "<h2>k-sweep (decision-layer statistics per run)</h2>",
        _table(sweep.drop("model", "probe")), _notes(late_notes(lasts, ks)), _window_sweep(con, ks, scope),
        f"<h2>Cross-model table (k = {k_mid}, shaped like the paper's Table 1)</h2>",
        _table(q.paper_table(con, k_mid, scope)), _notes(late_notes(lasts, [k_mid])),
    ] + _seeds_and_population(con, k_mid, scope)
    clean = runs.filter(pl.col("view") == "clean")
    sections.insert(0, robustness_section(figs, con, ks, k_mid, scope, late_caveat))
    sections.insert(0, _when_it_decides(figs, con, clean, ks, k_mid, scope, sweep))  # the page opens with it
    for model in clean["model"].unique(maintain_order=True).to_list():
        sections.append(_probe_accuracy(figs, accuracy.filter(pl.col("model") == model), model,
                                        q.anchor_names(con, model)))
    gallery_images: list[int] = []
    for i, run in enumerate(clean.iter_rows(named=True)):
        say(f"run {i + 1}/{clean.height}: {run['run_id']}")
        names = q.anchor_names(con, run["model"])
        run_sweep = sweep.filter(pl.col("run_id") == run["run_id"])
        parts = [f"<h2>{html.escape(run['run_id'])}</h2>", _headline(run_sweep, k_mid, len(names) - 1),
                 f"<p>Its decision-layer histograms open the page: <a href='#hist-{_slug(run['run_id'])}'>"
                 f"{html.escape(run['run_id'])}</a>.</p>",
                 _gallery(figs, con, run, k_mid, scope, names, gallery_images),
                 _cumulative(figs, con, run["run_id"], ks, scope, names),
                 _k_sensitivity(figs, run_sweep, run["run_id"]), _early_exit(figs, con, run, scope),
                 _tap_heatmap(figs, con, run["run_id"], scope)]
        sections.append(f"<section class='run' id='run-{_slug(run['run_id'])}' "
                        f"data-run='{html.escape(run['run_id'])}'>{''.join(parts)}</section>")
    comparisons = []  # drawn before the per-image timelines, whose list their galleries extend; shown after them
    for model in clean["model"].unique(maintain_order=True).to_list():
        say(f"definitions and probe sensitivity of {model}")
        model_runs = clean.filter(pl.col("model") == model)
        comparisons.append(_definitions(figs, con, model, model_runs["run_id"].to_list(), k_mid, min_conf, scope,
                                        gallery_images))
        comparisons.append(_probe_sensitivity(figs, con, model, model_runs, k_mid, scope))
    say(f"per-image timelines ({len(gallery_images)} images)")
    sections.append(_image_timelines(con, gallery_images, k_mid))
    shift = pl.concat([q.corruption_shift(con, k, scope).with_columns(pl.lit(k).alias("k")) for k in ks])
    if not shift.is_empty():
        sections.append("<h2>Corruption shift Δd̄ (view minus clean, same images and probes)</h2>")
        sections.append(_shift(figs, shift))
        sections.append(_table(shift.select("model", "view", "probe", "k", "n", "mean_layer",
                                            "clean_mean_layer", "delta")))
    sections += comparisons
    if clean["model"].n_unique() > 1:
        sections.append("<h2>Cross-model comparison</h2>")
        sections.append(_cross_model(figs, sweep.filter(pl.col("view") == "clean")))
    sections += _circuits(figs, con, circuit_runs)
    context = ReportContext(figs, con, runs, ks, k_mid, scope, min_conf)
    sections += [render(context) for render in SECTION_RENDERERS]
    (out / "report.html").write_text(_page(db, scope, sections))


def _seeds_and_population(con, k: int, scope: str) -> list[str]:
    """Which images each clean run counts, and, where runs differ only in their probe seed, every figure of the
    table as its mean over the seeds beside their spread: a gap to a published figure is told from seed noise."""
    population = q.population(con, scope).filter(pl.col("view") == "clean")
    sections = ["<h2>Population (the images each clean run counts)</h2>",
                _table(population.select("run_id", "cross_fit", "seed", "source", "images", "counted", "classes"))]
    spread = q.paper_table_spread(con, k, scope)
    if not spread.is_empty() and int(spread["seeds"].max()) > 1:
        sections += [f"<h2>Across probe seeds (k = {k}): mean, sample std, min and max of each figure</h2>",
                     _table(spread.drop("seed_list"))]
    return sections


def _notes(notes: Sequence[str]) -> str:
    """Notes under a table, one paragraph each ('' for none)."""
    return "".join(f"<p class='note'>Note: {html.escape(note)}.</p>" for note in notes)


def _window_sweep(con, ks: Sequence[int], scope: str) -> str:
    """The sweep's bands again in the window-aware band (docs/design.md §5), beside the paper's above."""
    window = q.k_sweep(con, ks, scope, band="window")
    return ("<h3>The same sweep in the window-aware band</h3><p>A stable l*(k) is at most T - k, so here early and "
            "late are the first and the last 30% of the anchors 0..T-k a stable l*(k) can take (l* &lt; 0.3(T-k), "
            "l* &ge; 0.7(T-k)) and never-stable images are in no band: f_early + f_mid + f_late + never_stable = 1. "
            "The table above is the paper's band (thirds of T, never-stable images counted late).</p>"
            + _table(window.select("run_id", "view", "k", "n", "f_early", "f_mid", "f_late", "never_stable")))


def _unconverged(fits: pl.DataFrame) -> list[str]:
    """A warning first thing on the page when some probe stopped at its cap unconverged."""
    if fits.is_empty():
        return []
    return ["<h2>Warning: unconverged probes</h2>",
            f"<p class='warn'>{len(fits)} probe(s) hit their cap (epochs, or L-BFGS iterations) before their "
            "stopping criterion was met; every statistic computed from their predictions may be off. Rerun with a "
            "higher cap, e.g. <code>--variant linear:max_iterations=1000</code> (or <code>max_epochs</code> where "
            "the rows are streamed), <code>--variant paper:epochs=200</code>.</p>", _table(fits)]


def _anchor_axis(ax, names: Sequence[str], label: str = "anchor") -> None:
    """Integer anchor ticks, each with the anchor's name, so a bar reads as a place in the network."""
    ax.set_xticks(range(len(names)), [f"{i} {n}" for i, n in enumerate(names)], rotation=90)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_xlabel(label)


def _shade_thirds(ax, t: int) -> None:
    """The early (l* < 0.3T) and late (l* >= 0.7T) bands that f_early and f_late count."""
    bands = q.band_limits(t)
    early_end = (-1 if bands.last_early is None else bands.last_early) + 0.5
    late_start = bands.first_late - 0.5
    ax.axvspan(-0.6, early_end, color="#4c9a5f", alpha=0.08, lw=0)
    ax.axvspan(late_start, t + 0.4, color="#b5533c", alpha=0.08, lw=0)


def _headline(sweep: pl.DataFrame, k: int, t: int) -> str:
    """One sentence with the shares deciding early and late, so the finding is readable without a figure."""
    row = sweep.filter(pl.col("k") == k)
    if row.is_empty():
        return ""
    r = row.row(0, named=True)
    caveat = late_caveat(t, k)
    caveat = f" Note: {caveat}." if caveat else ""
    bands = q.band_limits(t)
    return (f"<p class='headline'>At k = {k}, {r['f_early']:.0%} of the {r['n']} images settle in the first "
            f"30% of the {t + 1} anchors (l* &le; {bands.last_early}) and {r['f_late']:.0%} only in the last 30% "
            f"(l* &ge; {bands.first_late}, never-stable ones included: {r['never_stable']:.0%}); mean l* = "
            f"{r['mean']:.2f}.{caveat}</p>")


HOVER_IDS = 12  # image ids a histogram bar's hover names
CLICK_IDS = 200  # image ids a click on a bar lists (the page carries no more per bar)


def _when_it_decides(figs, con, clean: pl.DataFrame, ks: Sequence[int], k: int, scope: str,
                     sweep: pl.DataFrame) -> str:
    """The page's first section: each clean run's decision-layer histograms, one panel per k, with its headline."""
    parts = ["<h2 id='when'>When does it decide</h2>",
             "<p>Per clean run, the share of images whose decision layer l*(k) is each anchor, one panel per k "
             "(orange: never stable, counted at T). Hover a bar for its images; click it to list up to "
             f"{CLICK_IDS} of their ids, linked to their per-image timelines where this page has one.</p>"]
    for run in clean.iter_rows(named=True):
        names = q.anchor_names(con, run["model"])
        run_sweep = sweep.filter(pl.col("run_id") == run["run_id"])
        parts += [f"<h3 id='hist-{_slug(run['run_id'])}'>{html.escape(run['run_id'])}</h3>",
                  _headline(run_sweep, k, len(names) - 1),
                  _histograms(figs, con, run["run_id"], ks, scope, names, run_sweep)]
    return "".join(parts)


def _decision_mass(con, run_id: str, k: int, scope: str, t: int) -> pl.DataFrame:
    """decision_mass's figures of one run (n and never-stable images per layer 0..T, share of the run's images),
    derived from its per-image layers (asked once per k for every run), with the ids of the images in each bar:
    `ids` (decided) and `never_ids` (never stable), the first CLICK_IDS of each."""
    rows = q.decision_layers(con, k, scope).filter(pl.col("run_id") == run_id)
    total = max(1, rows.height)
    counts = rows.group_by("layer").agg(
        pl.len().alias("n"), pl.col("never_stable").cast(pl.Int64).sum().alias("never_stable"),
        pl.col("image_id").filter(~pl.col("never_stable")).sort().head(CLICK_IDS).alias("ids"),
        pl.col("image_id").filter(pl.col("never_stable")).sort().head(CLICK_IDS).alias("never_ids"))
    grid = pl.DataFrame({"layer": list(range(t + 1))}).cast({"layer": rows.schema["layer"]})
    return (grid.join(counts, on="layer", how="left")
            .with_columns(pl.col("n", "never_stable").fill_null(0),
                          pl.col("ids", "never_ids").fill_null(pl.lit([], dtype=pl.List(rows.schema["image_id"]))))
            .with_columns((pl.col("n") / total).alias("share"), pl.lit(total).alias("total")).sort("layer"))


def _bar_hover(run_id: str, k: int, names: Sequence[str], what: str, layers: list[int], counts: list[int],
               ids: list[list[int]], total: int) -> tuple[list[str], list[list]]:
    """Each bar's hover text (run, k, anchor, images and share, the first ids) and the data a click lists."""
    texts, data = [], []
    for layer, n, shown in zip(layers, counts, ids, strict=True):
        listed = ", ".join(map(str, shown[:HOVER_IDS])) + (", …" if n > HOVER_IDS else "")
        texts.append(f"{html.escape(run_id)}, k = {k}<br>l* = {layer} {html.escape(names[layer])}: {n} {what} "
                     f"({n / total:.1%})" + (f"<br>images {listed}<br>(click to list them)" if n else ""))
        data.append([n, list(shown)])
    return texts, data


def _histograms(figs, con, run_id: str, ks: Sequence[int], scope: str, names: Sequence[str],
                sweep: pl.DataFrame) -> str:
    fig, axes = figs.plt.subplots(1, len(ks), figsize=(3.1 * len(ks), 3.4), squeeze=False, sharey=True)
    t, top = len(names) - 1, 0.0
    for ax, k in zip(axes[0], ks, strict=True):
        mass = _decision_mass(con, run_id, k, scope, t)
        layers, share = mass["layer"].to_list(), mass["share"].to_list()
        total = int(mass["total"][0])
        never = [n / total for n in mass["never_stable"].to_list()]
        stable = [s - v for s, v in zip(share, never, strict=True)]
        _shade_thirds(ax, t)
        decided_n = [n - v for n, v in zip(mass["n"].to_list(), mass["never_stable"].to_list(), strict=True)]
        hover: list[dict] = [{}, {}]
        if figs.interactive:  # the images each bar counts, named on hover, listed on a click
            for i, (what, counts, ids) in enumerate((("decided", decided_n, mass["ids"].to_list()),
                                                     ("never stable", mass["never_stable"].to_list(),
                                                      mass["never_ids"].to_list()))):
                texts, data = _bar_hover(run_id, k, names, what, layers, counts, ids, total)
                hover[i] = {"hovertext": texts, "customdata": data}
        ax.bar(layers, stable, color="#3b6ea8", label="decided", **hover[0])
        ax.bar(layers, never, bottom=stable, color="#d98c3a", label="never stable (at T)", **hover[1])
        top = max(top, max(share, default=0.0))
        row = sweep.filter(pl.col("k") == k)
        if not row.is_empty():
            r = row.row(0, named=True)
            never = "\n(late = never stable: T - k < 0.7T)" if r["late_is_never_stable"] else ""
            ax.set_title(f"k = {k}: early {r['f_early']:.0%}, late {r['f_late']:.0%}{never}")
        _anchor_axis(ax, names, "decision layer l*")
    axes[0][0].set_ylim(0, top * 1.12 or 1)  # shared y: the tallest bar stays clear of the frame
    axes[0][0].set_ylabel("share of images")
    axes[0][-1].legend()
    return figs.save(fig, f"{run_id}_histograms", f"Decision-layer histograms of {run_id} (green band: early, "
                                                  f"l* < 0.3T; red band: late, l* >= 0.7T){_truncated_late(sweep)}")


def _cumulative(figs, con, run_id: str, ks: Sequence[int], scope: str, names: Sequence[str]) -> str:
    fig, ax = figs.plt.subplots(figsize=(6, 3.8))
    _shade_thirds(ax, len(names) - 1)
    for k in ks:
        curve = _decision_mass(con, run_id, k, scope, len(names) - 1).select(
            "layer", pl.col("share").cum_sum().alias("f"))  # F_k(l): the share with l* <= l (cumulative_curve)
        ax.step(curve["layer"].to_list(), curve["f"].to_list(), where="post", marker="o", ms=3, label=f"k = {k}")
    _anchor_axis(ax, names)
    ax.set_ylabel("F_k(l) = share with l* <= l")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower right")
    return figs.save(fig, f"{run_id}_cumulative", f"Cumulative decision curves F_k(l) of {run_id}")


def _probe_accuracy(figs, accuracy: pl.DataFrame, model: str, names: Sequence[str]) -> str:
    """One figure per model: α(l) of every run (probe and view in the legend), so the probes are compared on one
    set of axes rather than repeated in each run's section."""
    if accuracy.is_empty():
        return ""
    fig, ax = figs.plt.subplots(figsize=(8, 4.2))
    labels = []
    for run_id in accuracy["run_id"].unique(maintain_order=True).to_list():
        part = accuracy.filter(pl.col("run_id") == run_id)
        probe, view = part["probe"][0], part["view"][0]
        ax.plot(part["anchor"].to_list(), part["accuracy"].to_list(), marker="o", ms=3, label=f"{probe} on {view}",
                lw=2.2 if view == "clean" else 1.0, ls="-" if view == "clean" else "--")
        labels.append(f"{probe} on {view}: {run_id}")
    _anchor_axis(ax, names)
    ax.set_ylabel("probe accuracy")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    caption = f"Probe accuracy per anchor of {model}, one line per run ({'; '.join(labels)})"
    return f"<h2>Probe accuracy of {html.escape(model)}</h2>" + figs.save(fig, f"{model}_accuracy", caption)


def _k_sensitivity(figs, sweep: pl.DataFrame, run_id: str) -> str:
    """How the statistics move with k; a series flat across every k is named in the caption, not drawn."""
    fig, (left, right) = figs.plt.subplots(1, 2, figsize=(9, 3.4))
    flat = []
    for ax, columns in ((left, {"mean": "mean l*", "median": "median l*"}),
                        (right, {"f_early": "f_early", "f_mid": "f_mid", "f_late": "f_late",
                                 "never_stable": "never stable"})):
        for col, label in columns.items():
            values = sweep[col].to_list()
            if len(values) > 1 and max(values) - min(values) < 1e-12:
                flat.append(f"{label} = {values[0]:.3g} at every k")
                continue
            ax.plot(sweep["k"].to_list(), values, marker="o", label=label)
        ax.set_xlabel("k")
        ax.set_xticks(sweep["k"].to_list())  # k is a whole number of anchors
        if ax.get_lines():
            ax.legend()
    left.set_ylabel("decision layer")
    right.set_ylabel("share of images")
    right.set_ylim(0, 1.02)
    flat_note = f" (not drawn: {', '.join(flat)})" if flat else ""
    return figs.save(fig, f"{run_id}_k_sensitivity",
                     f"Sensitivity to the stability window k of {run_id}{flat_note}{_truncated_late(sweep)}")


def _truncated_late(sweep: pl.DataFrame) -> str:
    """A caption's note naming the k of a run's sweep at which late can only be never stable ('' for none)."""
    truncated = sweep.filter(pl.col("late_is_never_stable"))["k"].to_list()
    if not truncated:
        return ""
    return (f"; at k = {', '.join(map(str, truncated))} late = never stable (a stable l*(k) is at most T - k, "
            "short of 0.7T)")


def _early_exit(figs, con, run: dict, scope: str) -> str:
    """Accuracy vs mean latency of every realisable exit policy with their Pareto front; the oracle (which
    needs the label) is drawn apart as an upper bound, if costs were measured."""
    sizes = q.cost_settings(con, run["model"])
    if sizes.is_empty():
        return (f"<p>Early exit: no costs of {html.escape(run['model'])} measured yet "
                f"(<code>featstore cost --model {html.escape(run['model'])} --db …</code>).</p>")
    batch, device = sizes.row(0)
    population = q.exit_population(con, run["run_id"], scope=scope).row(0, named=True)
    counted = f"<p>{html.escape(q.describe_population(population))}.</p>"
    if population["n"] == 0:
        return f"<p>Early exit for {html.escape(run['run_id'])}: no image to simulate on.</p>" + counted
    sim, front = q.exit_frontier(con, run["run_id"], device, batch, DEFAULT_POLICIES, scope)
    oracle = sim.filter(pl.col("policy") == "oracle")
    fig, ax = figs.plt.subplots(figsize=(6.5, 4))
    colours = {"stability": "#3b6ea8", "confidence": "#4c9a5f", "combined": "#8e5ea2", "learned": "#c9a227",
               "full depth": "black"}
    for policy, colour in colours.items():
        part = sim.filter(pl.col("policy") == policy)
        if not part.is_empty():
            ax.scatter(part["mean_ms"].to_list(), part["accuracy"].to_list(), label=policy, color=colour,
                       marker="*" if policy == "full depth" else "o", s=90 if policy == "full depth" else 18,
                       zorder=3)
    ax.step(front["mean_ms"].to_list(), front["accuracy"].to_list(), where="post", color="black", lw=1.6,
            label="Pareto front (realisable policies)", zorder=4)  # above its points
    if not oracle.is_empty():
        o = oracle.row(0, named=True)
        ax.axhline(o["accuracy"], color="#b5533c", ls=":", lw=1)
        ax.scatter([o["mean_ms"]], [o["accuracy"]], marker="D", color="#b5533c", s=40, zorder=3,
                   label="oracle (needs the label: an upper bound)")
    ax.set_xlabel(f"mean latency per image (ms, batch {batch})")
    ax.set_ylabel("accuracy")
    ax.legend(loc="lower right")
    caption = f"Early exit for {run['run_id']}: costs measured on {device}, batch {batch}"
    bound = "" if oracle.is_empty() else ("<p>Oracle (exits at the first correct anchor; not a policy): "
                                          + _table(_readable_costs(oracle.drop("k", "theta"))) + "</p>")
    return (figs.save(fig, f"{run['run_id']}_early_exit", caption) + counted
            + "<h3>Pareto front of the realisable policies</h3>" + _table(pareto_rows(front), cls="pareto") + bound)


def _policy_name(policy: str, k, theta) -> str:
    return policy + (f" k={k}" if k is not None else "") + (f" θ={theta:.2f}" if theta is not None else "")


def pareto_rows(front: pl.DataFrame) -> pl.DataFrame:
    """The front as a reader wants it: policies with identical points merged into one row (in threshold order),
    rows by cost, latency in ms and compute in GFLOPs."""
    point = ["accuracy", "mean_ms", "mean_flops", "full_depth_share"]
    ordered = front.sort(["mean_ms", "policy", "k", "theta"], nulls_last=True)
    named = ordered.with_columns(pl.struct("policy", "k", "theta").map_elements(
        lambda r: _policy_name(r["policy"], r["k"], r["theta"]), return_dtype=pl.Utf8).alias("name"))
    merged = named.group_by(point, maintain_order=True).agg(pl.col("name"), pl.col("n").first())
    return _readable_costs(merged.select(
        pl.col("name").map_elements(_merge_names, return_dtype=pl.Utf8).alias("policies"), "n", "accuracy",
        "mean_ms", "mean_flops", "full_depth_share"))


def _readable_costs(frame: pl.DataFrame) -> pl.DataFrame:
    """Cost columns in the units a reader compares: ms and GFLOPs."""
    return frame.with_columns((pl.col("mean_flops") / 1e9).alias("mean_flops")).rename(
        {"mean_ms": "mean ms", "mean_flops": "mean GFLOPs"})


def _merge_names(names: pl.Series) -> str:
    """'confidence θ=0.51', 'confidence θ=0.52', 'confidence θ=0.53' -> 'confidence θ=0.51-0.53'."""
    names = list(names)
    groups: dict[str, list[str]] = {}
    for name in names:
        head, _, theta = name.partition(" θ=")
        groups.setdefault(head, []).append(theta)
    out = []
    for head, thetas in groups.items():
        thetas = [t for t in thetas if t]
        out.append(head if not thetas else f"{head} θ={thetas[0]}" if len(thetas) == 1
                   else f"{head} θ={thetas[0]}-{thetas[-1]} ({len(thetas)})")
    return "; ".join(out)


def _image_root(meta: dict[str, str]) -> Path | None:
    """Where the database's image paths are relative to: recorded by the demo, else an ImageFolder source. The
    report reads no image outside it (`_thumbnail`)."""
    if "image_root" in meta:
        return Path(meta["image_root"])
    source = meta.get("source", "")
    return Path(source.removeprefix("ImageFolder ")) if source.startswith("ImageFolder ") else None


def _thumbnail(root: Path | None, path: str):
    """The image a database names, read only from a regular file under its recorded image root (links resolved:
    an absolute path, `../` or a link that leaves the root is skipped, so a database cannot have the report embed
    any other local image) and opened without waiting (a FIFO or a device is never read: the report would hang);
    None for anything else, or a file that does not decode."""
    from PIL import Image

    if root is None:
        return None
    try:
        base = root.resolve(strict=True)
        file = (base / path).resolve(strict=True)
        if not file.is_relative_to(base) or not stat.S_ISREG(os.stat(file).st_mode):
            return None
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # swapped since it was looked at
                return None
            with Image.open(handle) as img:
                return img.convert("RGB").copy()
    except (OSError, RuntimeError, Image.DecompressionBombError):  # gone, unreadable, a link loop, not an image
        return None


def _gallery(figs, con, run: dict, k: int, scope: str, names: Sequence[str], shown: list[int],
             per_side: int = 4) -> str:
    """Thumbnails of correctly decided images that settle early and late, each with its prediction timeline
    (one cell per anchor: the probe's class, green where right); the image files are read from the paths
    recorded in the database. Adds the ids it shows to `shown` (their per-image timelines follow the runs)."""
    try:
        examples = q.decision_examples(con, k, per_side, scope).filter(pl.col("run_id") == run["run_id"])
    except FeatstoreError:  # a database written before the macro existed
        return ""
    if examples.is_empty():
        return ""
    meta = q.meta(con)
    root = _image_root(meta)
    classes = json.loads(meta.get("class_names", "[]"))
    sides = [side for side in ("early", "late") if side in examples["side"].to_list()]
    caption = (f"Images of {run['run_id']} that decide early (top) and late (below), with the probe's class at "
               f"every anchor (green: right, red: wrong; box: l*({k}); a never-stable image has none)")
    if figs.interactive:
        return (_gallery_html(root, classes, examples, sides, names, k, caption)
                + _timeline_links(examples["image_id"].to_list(), shown))
    rows = max(examples.filter(pl.col("side") == side).height for side in sides)
    height = 0.95 * rows + 1.6
    fig = figs.plt.figure(figsize=(6.0 * len(sides), height))
    grid = fig.add_gridspec(rows, 2 * len(sides), width_ratios=[1, 7] * len(sides), hspace=0.8, wspace=0.06,
                            left=0.02, right=0.98, top=1 - 0.3 / height, bottom=1.0 / height)
    cells = figs.colormap(["#f0b4a8", "#a8dca8"])
    for s, side in enumerate(sides):
        part = examples.filter(pl.col("side") == side)
        for r, ex in enumerate(part.iter_rows(named=True)):
            thumb = fig.add_subplot(grid[r, 2 * s])
            thumb.axis("off")
            image = _thumbnail(root, ex["path"])
            if image is not None:
                thumb.imshow(image, interpolation="nearest")
            strip = fig.add_subplot(grid[r, 2 * s + 1])
            strip.imshow([[p == ex["label"] for p in ex["preds"]]], cmap=cells, vmin=0, vmax=1, aspect="auto")
            for a, pred in enumerate(ex["preds"]):
                name = classes[pred] if pred < len(classes) else str(pred)
                strip.text(a, 0, name[:7], ha="center", va="center", fontsize=8.5, rotation=30)
            label = classes[ex["label"]] if ex["label"] < len(classes) else str(ex["label"])
            if ex["never_stable"]:  # no decision to box: T is where the sweep counts it, not where it settles
                settled = f"never stable (no l*({k}); counted at T = {ex['layer']})"
            else:
                strip.add_patch(figs.plt.Rectangle((ex["layer"] - 0.5, -0.5), 1, 1, fill=False, lw=2, color="black"))
                settled = f"l*({k}) = {ex['layer']}"
            strip.set_title(f"{side}: image {ex['image_id']}, {label}, {settled}", fontsize=9, loc="left", pad=2)
            strip.set_yticks([])
            last = r == part.height - 1
            strip.set_xticks(range(len(names)), [f"{i} {n}" for i, n in enumerate(names)] if last else [],
                             rotation=90)
    return (figs.save(fig, f"{run['run_id']}_gallery", caption.replace("(top)", "(left)").replace("(below)", "(right)"),
                      tight=False)
            + _timeline_links(examples["image_id"].to_list(), shown))


def _class_name(classes: Sequence[str], label: int) -> str:
    return classes[label] if label < len(classes) else str(label)


def _gallery_html(root: Path | None, classes: Sequence[str], examples: pl.DataFrame, sides: Sequence[str],
                  names: Sequence[str], k: int, caption: str) -> str:
    """The gallery as the page shows it: per image its thumbnail, a line naming it, and a strip of the probe's class
    at every anchor (green: right, red: wrong, boxed: l*(k)), each cell's hover naming its anchor."""
    rows = []
    for side in sides:
        for ex in examples.filter(pl.col("side") == side).iter_rows(named=True):
            label = _class_name(classes, ex["label"])
            settled = (f"never stable (no l*({k}); counted at T = {ex['layer']})" if ex["never_stable"]
                       else f"l*({k}) = {ex['layer']}")
            cells = "".join(
                f"<td class='{'right' if pred == ex['label'] else 'wrong'}"
                f"{' decided' if a == ex['layer'] and not ex['never_stable'] else ''}' "
                f"title='anchor {a} {html.escape(names[a] if a < len(names) else '')}: "
                f"{html.escape(_class_name(classes, pred))}'>{html.escape(_class_name(classes, pred)[:7])}</td>"
                for a, pred in enumerate(ex["preds"]))
            heads = "".join(f"<th>{a}</th>" for a in range(len(ex["preds"])))
            rows.append(f"<div class='strip-row'>{_thumbnail_tag(root, ex['path'], 64)}<div><p class='strip-title'>"
                        f"{side}: <a href='#image-{ex['image_id']}'>image {ex['image_id']}</a>, {html.escape(label)}, "
                        f"{settled}</p><div class='scroll'><table class='strip'><tr>{heads}</tr><tr>{cells}</tr>"
                        f"</table></div></div></div>")
    return f"<figure class='gallery'>{''.join(rows)}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _timeline_links(ids: Sequence[int], shown: list[int]) -> str:
    """Links to the per-image timelines of a gallery's images; their ids join `shown` (the page draws those)."""
    ids = list(dict.fromkeys(ids))
    shown.extend(i for i in ids if i not in shown)
    links = " ".join(f"<a href='#image-{i}'>{i}</a>" for i in ids)
    return f"<p>Per-image timelines of these images (<code>featstore timeline --image ID</code>): {links}</p>"


def image_timeline(db, image_id: int, k: int = K, runs: Sequence[str] | None = None) -> pl.DataFrame:
    """One image's timeline in every run, or in the runs named (sql/image_timeline.sql); refuses an unknown run
    and an id none of them predicted."""
    chosen = q.known_runs(db, runs) if runs else None
    q.stability_windows(db, [k], chosen)
    frame = q.query(db, "SELECT * FROM image_timeline(?, k := ?)", [image_id, k])
    if chosen is not None:
        frame = frame.filter(pl.col("run_id").is_in(chosen))
    if frame.is_empty():
        which = f"run {', '.join(chosen)}" if chosen else "run of this database"
        raise FeatstoreError(f"no {which} predicted an image of that id", field="image_id", value=image_id)
    return frame


def _image_timelines(con, image_ids: Sequence[int], k: int) -> str:
    """A small section per image (anchor #image-ID): the image, and for every run that predicted it the class and
    confidence at every anchor, its l*(k) marked; `featstore timeline --image ID` prints the same for any id."""
    if not image_ids:
        return ""
    root = _image_root(q.meta(con))
    parts = [f"<h2>Per-image timelines (k = {k})</h2><p>Each cell: the probe's class and confidence at that anchor; "
             f"<b>◆</b> marks the decision layer l*({k}), red a wrong class. A run headed <i>never stable</i> has no "
             f"◆: its prediction never holds for {k} more anchors, so it has no l*({k}) (the sweep counts it at T). "
             "Any other image: <code>featstore timeline --db … --image ID</code>.</p>"]
    for image_id in image_ids:
        frame = q.query(con, "SELECT * FROM image_timeline(?, k := ?)", [image_id, k])
        if frame.is_empty():
            continue
        first = frame.row(0, named=True)
        parts.append(f"<section class='image-timeline' id='image-{image_id}'><h3>Image {image_id}: "
                     f"{html.escape(str(first['label_name'] or first['label']))} "
                     f"<small>({html.escape(first['path'])}, {first['split']})</small></h3>"
                     f"<div class='timeline'>{_thumbnail_tag(root, first['path'])}"
                     f"{image_timeline_table(frame, html_cells=True)}</div></section>")
    return "".join(parts)


def image_timeline_table(frame: pl.DataFrame, html_cells: bool = False) -> str | pl.DataFrame:
    """One row per anchor, one column per run ('probe on view'): 'class conf', ◆ at the run's l*; a never-stable
    run has no ◆ and its heading says so. HTML (a table) for the report, or a DataFrame for the terminal."""
    runs = frame["run_id"].unique(maintain_order=True).to_list()
    anchors = frame.select("anchor", "name").unique(maintain_order=True).sort("anchor")
    columns: dict[str, list] = {"anchor": anchors["anchor"].to_list(), "name": anchors["name"].to_list()}
    for run_id in runs:
        part = frame.filter(pl.col("run_id") == run_id).sort("anchor")
        head = part.row(0, named=True)
        never = bool(head["never_stable"])  # placed at T by the sweep, which is no decision: no ◆ (not `decided`)
        cells = {r["anchor"]: (("◆ " if r["decided"] else "") + f"{r['pred_name'] or r['pred']} {r['conf']:.2f}",
                               r["correct"]) for r in part.iter_rows(named=True)}
        label = f"{head['probe']} on {head['view']}" + (" (never stable)" if never else "")
        label = label if label not in columns else f"{label} ({run_id})"
        columns[label] = [cells.get(a, ("", True)) for a in columns["anchor"]]
    if not html_cells:
        return pl.DataFrame({c: [v[0] if isinstance(v, tuple) else v for v in vs] for c, vs in columns.items()})
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for i in range(len(columns["anchor"])):
        cells = []
        for values in columns.values():
            value = values[i]
            text, right = value if isinstance(value, tuple) else (str(value), True)
            cells.append(f"<td{'' if right else ' class=wrong'}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<div class='scroll'><table class='timeline-table'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _thumbnail_tag(root: Path | None, path: str, size: int = 128) -> str:
    """The image itself, scaled to `size` px and embedded as a PNG ('' when its file is gone)."""
    import io

    image = _thumbnail(root, path)
    if image is None:
        return ""
    image.thumbnail((size, size))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    data = base64.b64encode(buffer.getvalue()).decode()
    return f"<img class='thumb' alt='{html.escape(path)}' src='data:image/png;base64,{data}'>"


def _definitions(figs, con, model: str, runs: list[str], k: int, min_conf: float, scope: str,
                 shown: list[int]) -> str:
    """Every definition of when the network decides (l*(k), the joint criterion, prediction depth) for the clean
    runs of one model, side by side: their band shares, Spearman correlations and early/late disagreements, and a
    few images early by one definition and late by another (their ids added to `shown`, whose per-image timelines
    the page carries)."""
    result = q.compare(con, runs, k, min_conf, scope, per_pair=2).shortened()
    if result.summary.is_empty():
        return ""
    names = result.summary["definition"].to_list()
    parts = [f"<h2>When does {html.escape(model)} decide? Every definition side by side</h2>",
             "<p>l*(k): first anchor from which the probe's prediction stays the same for k more anchors (the source "
             "paper); joint: the same, confident (conf &ge; "
             f"{min_conf:g}) at l* (the paper's proposed criterion); depth: prediction depth (Baldock et al., NeurIPS "
             "2021), the first anchor from which every later prediction is the model's own; computed for every "
             "probe, Baldock's own is the knn probe's. An image even the last anchor does not settle has no depth "
             "(T + 1 in the layer columns) and is counted unsettled (f_unsettled), not late. Per run below: its "
             "layer 0 (the input image where the build stored the `input` anchor, Baldock's layer 0; else the first "
             "stored anchor, not the input: docs/design.md §5) and the rows its probes learnt from (knn: the rows "
             "that vote).</p>",
             _table(result.summary.drop("kind", "run_id")),
             _table(result.depths.select("run_id", "layer0", "reference_rows", "t", "n", "unsettled",
                                         "f_unsettled"))]
    fig, axes = figs.plt.subplots(1, 2, figsize=(4.2 + 0.75 * len(names), 1.6 + 0.35 * len(names)))
    for ax, value, title, cmap in ((axes[0], "spearman", "Spearman ρ of the layers", "RdBu_r"),
                                   (axes[1], "early_late", "images early (row) and late (column)", "Oranges")):
        matrix = result.matrix(value).drop("definition").to_numpy().astype(float)
        image = ax.imshow(matrix, cmap=cmap, vmin=-1 if value == "spearman" else 0,
                          vmax=1 if value == "spearman" else None)
        ax.set_xticks(range(len(names)), [f"#{i + 1}" for i in range(len(names))])
        ax.set_yticks(range(len(names)), [f"#{i + 1} {n}" for i, n in enumerate(names)])
        ax.set_title(title)
        fig.colorbar(image, ax=ax, shrink=0.8)
    parts.append(figs.save(fig, f"{model}_definitions", f"Agreement between the definitions for {model}"))
    decided = result.decided.select("a", "b", pl.col("n").alias("early_late_decided")).unique(maintain_order=True)
    worst = decided.sort(["early_late_decided", "a", "b"], descending=[True, False, False]).head(3)
    parts.append("<h3>The pairs that disagree most: images early by one definition and late by the other, both "
                 "layers decisions</h3><p>Counted only where both layers are decisions: an l* or joint layer that "
                 "never settles is placed at T, late by construction, so the pairs it makes disagree say which "
                 "definition has a fallback, not where the network decides (early_a_late_b and late_a_early_b count "
                 "those too); an unsettled prediction depth is in no band.</p>")
    if worst.is_empty():
        return "".join(parts) + "<p>No pair has an image early by one definition and decided late by another.</p>"
    parts.append(_table(worst.join(result.agreement, on=["a", "b"]).select(
        "a", "b", "n", "spearman", "same_band", "early_late_decided", "early_a_late_b", "late_a_early_b")))
    parts.append(_disagreement_gallery(figs, con, model, result.decided.join(worst.select("a", "b"), on=["a", "b"]),
                                       shown))
    return "".join(parts)


def probe_identity(params: str | dict | None) -> dict:
    """A run's recorded parameters (the variant's and the job's settings; the seed, the probes' name and version
    are columns of its own): what two runs of one probe share whatever their seed, so that a second seed is found
    by what it computes."""
    return json.loads(params) if isinstance(params, str) else dict(params or {})


def _same_family(reference: dict, other: dict) -> bool:
    """Runs of one probe, parameters, split, training view and way of training (streamed or not): they can differ
    only in their probe seed."""
    return (other["probe"] == reference["probe"] and other["cross_fit"] == reference["cross_fit"]
            and other["train_view"] == reference["train_view"] and other["streamed"] == reference["streamed"]
            and probe_identity(other["params"]) == probe_identity(reference["params"]))


def _changed_params(reference: dict, other: dict) -> str:
    """The parameters whose values differ, each named with both values ('C 0.1 (reference 0)')."""
    a, b = probe_identity(reference["params"]), probe_identity(other["params"])
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    return ", ".join(f"{k} {b.get(k, 'unset')} (reference {a.get(k, 'unset')})" for k in keys)


def seed_dependence(probe: str, params: dict, streamed: bool = False) -> tuple[bool | None, str]:
    """Whether a second probe seed can change a run's predictions (`params`: its recorded parameters; `streamed`:
    whether its rows were streamed), and why (measured by probing twice, see docs/design.md §5); None for a
    variant, or a knn with references from another store, not measured."""
    sgd = bool(streamed) or params.get("full_batch", 1) == 0
    if probe == "knn":
        if params.get("refs"):
            return None, ""
        return True, ("only at ties: neighbours at exactly equal distance fall to the order the seed shuffles the "
                      "train rows into")
    if probe in ("linear", "lens-direct", "lens") and not sgd:
        return False, (f"{probe} is solved full-batch by L-BFGS to the one optimum of a strictly convex objective, "
                       "so another seed repeats it bit for bit")
    if probe in ("linear", "lens-direct"):
        return True, "SGD (rows streamed, or full_batch=0): the seed shuffles the batches and sizes the steps"
    if probe == "paper":
        return True, "SGD: the seed draws the initial weights and shuffles the batches"
    if probe == "projected":
        return True, "the seed draws the random projection of every wider anchor"
    return None, ""


def _seed_advice(runs: pl.DataFrame, reference: dict) -> tuple[list[str], str]:
    """Per probe family among `runs` with a single seed, a line advising a second one where its results depend on
    the seed; and, where the reference's do not, a paragraph saying why it has no seed spread."""
    lines, families, note = [], [], ""
    for run in runs.sort(["seed", "run_id"]).iter_rows(named=True):
        if not any(_same_family(f, run) for f in families):
            families.append(run)
    for family in families:
        if any(_same_family(family, r) and r["seed"] != family["seed"] for r in runs.iter_rows(named=True)):
            continue
        depends, why = seed_dependence(family["probe"], probe_identity(family["params"]), family["streamed"])
        variant = family["probe_id"]
        if depends:
            lines.append(f"no second seed of <code>{html.escape(family['run_id'])}</code>, whose results depend on "
                         f"it ({html.escape(why)}): <code>featstore probe --variant {html.escape(variant)} --seed "
                         f"{family['seed'] + 1}</code> with the same options adds one")
        elif depends is False and family["run_id"] == reference["run_id"]:
            note = (f"<p>The reference has no seed spread to show: {html.escape(why)}. What moves its timeline is the "
                    "probe family and its parameters (the rows below).</p>")
    return lines, note


def _differs(reference: dict, other: dict) -> str:
    """What sets a run apart from the reference run, in words ('probe paper', 'C 0.1 (reference 0)', 'seed 1')."""
    same_family = other["probe"] == reference["probe"]  # another family's params say nothing beside its name
    parts = [f"probe {other['probe']}" if not same_family else "",
             _changed_params(reference, other) if same_family else "",
             ("streamed" if other["streamed"] else "not streamed") if other["streamed"] != reference["streamed"]
             else "",
             f"trained on {other['train_view']}" if other["train_view"] != reference["train_view"] else "",
             (f"cross-fit {other['cross_fit']}" if other["cross_fit"] else "single split")
             if other["cross_fit"] != reference["cross_fit"] else "",
             f"seed {other['seed']}" if other["seed"] != reference["seed"] else ""]
    return ", ".join(p for p in parts if p) or "nothing recorded"


def _probe_sensitivity(figs, con, model: str, runs: pl.DataFrame, k: int, scope: str) -> str:
    """The default probe's run beside every other clean run of the model (paper, other families, another seed):
    how often they predict the same class at each anchor and give the same l*(k) and band, on the images both
    count, so a reader sees how much of the timeline is the probe's rather than the network's."""
    linear = [run for run in runs.iter_rows(named=True) if run["probe"] == "linear"]
    parts = [f"<h2>How much does the timeline depend on the probe? {html.escape(model)}</h2>"]
    if not linear:
        return "".join(parts) + "<p>No run of the default probe (linear) on clean to compare the others with.</p>"
    reference = min(linear, key=lambda run: (run["probe_id"] != "linear",
                                             run["seed"], -run["cross_fit"], run["run_id"]))  # unpinned first
    others = runs.filter(pl.col("run_id") != reference["run_id"]).sort("run_id")
    parts.append(f"<p>Reference: <code>{html.escape(reference['run_id'])}</code>. Each row counts the images both "
                 f"runs predicted that the scope (<code>{html.escape(scope)}</code>: by default the test split, or "
                 f"every image of two cross-fit runs) counts for both (n); same l*({k}) and same band are the shares "
                 f"of those with an identical decision layer and an identical early/mid/late band; mean and late are "
                 f"each run's mean l*({k}) and late share on those same images (<code>run_agreement</code>).</p>")
    missing = []
    if others.filter(pl.col("probe") == "paper").is_empty():
        missing.append(f"no paper run of {html.escape(model)} on clean (<code>featstore probe --variant paper</code> "
                       "adds one)")
    seeds, note = _seed_advice(runs, reference)
    missing += seeds
    if missing:
        parts.append(f"<p>This database has {'; '.join(missing)}.</p>")
    parts.append(note)
    if others.is_empty():
        return "".join(parts)
    rows, curves, never_late = [], {}, False
    for other in others.iter_rows(named=True):
        agreement = q.run_agreement(con, reference["run_id"], other["run_id"], k, scope)
        anchors = agreement.filter(pl.col("anchor").is_not_null())
        overall = agreement.filter(pl.col("anchor").is_null()).row(0, named=True)
        if not overall["n"]:
            continue
        worst = anchors.sort(["same_pred", "anchor"]).row(0, named=True)
        never_late |= bool(overall["late_is_never_stable"])
        curves[other["run_id"]] = anchors
        rows.append({"run": other["run_id"], "differs in": _differs(reference, other), "n": overall["n"],
                     "same pred, worst anchor": f"{worst['same_pred']:.3f} (anchor {worst['anchor']})",
                     "same pred, every anchor": overall["same_pred"], f"same l*({k})": overall["same_layer"],
                     "same band": overall["same_band"], "mean l* (ref)": overall["mean_a"],
                     "mean l* (run)": overall["mean_b"], "late (ref)": overall["late_a"],
                     "late (run)": overall["late_b"]})
    if not rows:
        return "".join(parts) + "<p>No other run shares images with the reference in this scope.</p>"
    parts.append(_table(pl.DataFrame(rows)))
    names = q.anchor_names(con, model)
    if never_late:  # the late columns count never-stable images only
        parts.append(_notes([late_caveat(len(names) - 1, k)]))
    fig, ax = figs.plt.subplots(figsize=(6.5, 3.6))
    for run_id, anchors in curves.items():
        ax.plot(anchors["anchor"].to_list(), anchors["same_pred"].to_list(), marker="o", ms=3, label=run_id)
    _anchor_axis(ax, names)
    ax.set_ylabel("share of identical predictions")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower right")
    parts.append(figs.save(fig, f"{model}_probe_sensitivity", f"Identical predictions per anchor of each clean run "
                                                              f"of {model} and {reference['run_id']}"))
    return "".join(parts)


def _disagreement_gallery(figs, con, model: str, picked: pl.DataFrame, shown: list[int]) -> str:
    """Thumbnails of images on which two definitions disagree most, each with its id, label and both layers, and
    links to their per-image timelines (the ids added to `shown`)."""
    if picked.is_empty():
        return ""
    meta = q.meta(con)
    root = _image_root(meta)
    classes = json.loads(meta.get("class_names", "[]"))
    caption = (f"Images of {model} early (l < 0.3T) by one definition and decided late (l >= 0.7T) by the other, "
               "for the pairs above (image id and layer per definition above each image)")
    if figs.interactive:
        cards = "".join(
            f"<div class='card'>{_thumbnail_tag(root, ex['path'], 96)}<p><a href='#image-{ex['image_id']}'>image "
            f"{ex['image_id']}</a>: {html.escape(_class_name(classes, ex['label']))}<br>"
            f"{html.escape(ex['a'][:24])}: {ex['layer_a']}<br>{html.escape(ex['b'][:24])}: {ex['layer_b']}</p></div>"
            for ex in picked.iter_rows(named=True))
        return (f"<figure class='cards'>{cards}<figcaption>{html.escape(caption)}</figcaption></figure>"
                + _timeline_links(picked["image_id"].to_list(), shown))
    cols = min(6, picked.height)
    rows = -(-picked.height // cols)
    fig, axes = figs.plt.subplots(rows, cols, figsize=(2.0 * cols, 2.6 * rows), squeeze=False)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.02, top=1 - 0.55 / (2.6 * rows), hspace=0.7, wspace=0.1)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, ex in zip(axes.ravel(), picked.iter_rows(named=True), strict=False):
        image = _thumbnail(root, ex["path"])
        if image is not None:
            ax.imshow(image, interpolation="nearest")
        label = classes[ex["label"]] if ex["label"] < len(classes) else str(ex["label"])
        ax.set_title(f"image {ex['image_id']}: {label}\n{ex['a'][:24]}: {ex['layer_a']}\n{ex['b'][:24]}: "
                     f"{ex['layer_b']}", fontsize=8.5)
    return (figs.save(fig, f"{model}_disagreements", caption, tight=False)
            + _timeline_links(picked["image_id"].to_list(), shown))


def _tap_heatmap(figs, con, run_id: str, scope: str) -> str:
    """Block x tap probe-accuracy heatmap and the fixed-tap strategies, for runs built with --taps."""
    grid = q.tap_grid(con, run_id, scope)
    if grid.is_empty():
        return ""
    taps = grid["tap"].unique(maintain_order=True).to_list()
    blocks = sorted(grid["block"].unique().to_list())
    values = [[None] * len(blocks) for _ in taps]
    for block, tap, acc in grid.select("block", "tap", "accuracy").rows():
        values[taps.index(tap)][blocks.index(block)] = acc
    fig, ax = figs.plt.subplots(figsize=(1.0 + 0.5 * len(blocks), 0.5 + 0.4 * len(taps)))
    image = ax.imshow(values, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(blocks)), blocks)
    ax.set_yticks(range(len(taps)), taps)
    ax.set_xlabel("block")
    fig.colorbar(image, ax=ax, label="probe accuracy")
    return (figs.save(fig, f"{run_id}_taps", f"Probe accuracy per block and module tap of {run_id}")
            + "<h3>Fixed taps and gain recovered</h3>" + _table(q.tap_gains(con, run_id, scope)))


def _circuits(figs, con, circuit_runs: pl.DataFrame) -> list[str]:
    """Inter-layer dependency matrices of every circuit run, with DDB (all variants) and CSS vs clean."""
    if circuit_runs.is_empty():
        return []
    parts = ["<h2>Circuits (EAP-IG)</h2>"]
    ddb = pl.concat([q.query(con, "SELECT * FROM ddb(variant := ?)", [v]) for v in ("global", "deep", "out")])
    parts.append(_table(ddb.select("run_id", "variant", "tau", "ddb")))
    css = q.query(con, "SELECT * FROM css_vs_clean() ORDER BY ood_run")
    if not css.is_empty():
        parts.append("<h3>Circuit shift score (1 - Spearman, vs the clean circuit)</h3>" + _table(css))
    for run in circuit_runs.iter_rows(named=True):
        idm = q.query(con, "SELECT * FROM idm(?)", [run["run_id"]])
        layers = run["layers"]
        grid = [[0.0] * (layers + 1) for _ in range(layers + 1)]  # rows: source -1..L-1, cols: target 0..L
        for src, dst, value in idm.rows():
            grid[src + 1][dst] = value
        fig, ax = figs.plt.subplots(figsize=(1.5 + 0.35 * layers, 1.2 + 0.35 * layers))
        image = ax.imshow(grid, cmap="magma", origin="lower")
        ax.set_xticks(range(layers + 1), [str(j) for j in range(layers)] + ["logits"])
        ax.set_yticks(range(layers + 1), ["input"] + [str(i) for i in range(layers)])
        ax.set_xlabel("target block")
        ax.set_ylabel("source block")
        fig.colorbar(image, ax=ax, label="Λ = Σ|c(e)|")
        parts.append(figs.save(fig, f"{run['run_id']}_idm", f"Inter-layer dependency matrix of {run['run_id']}"))
    return parts


def _shift(figs, shift: pl.DataFrame) -> str:
    fig, ax = figs.plt.subplots(figsize=(7, 3.2))
    labels = [f"{m}\n{v}" for m, v in shift.filter(pl.col("k") == shift["k"].min()).select("model", "view").rows()]
    ks = shift["k"].unique().sort().to_list()
    width = 0.8 / len(ks)
    for i, k in enumerate(ks):
        part = shift.filter(pl.col("k") == k)
        ax.bar([j + i * width for j in range(len(part))], part["delta"].to_list(), width, label=f"k = {k}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel("Δd̄ (anchors)")
    ax.legend()
    bars = "; ".join(f"{m} {v} ({p})" for m, v, p in shift.select("model", "view", "probe").unique(
        maintain_order=True).rows())
    return figs.save(fig, "corruption_shift", f"Corruption shift of the mean decision layer, one bar per k of: {bars}")


def _cross_model(figs, sweep: pl.DataFrame) -> str:
    fig, ax = figs.plt.subplots(figsize=(6, 3.2))
    for run_id in sweep["run_id"].unique(maintain_order=True).to_list():
        part = sweep.filter(pl.col("run_id") == run_id)
        ax.plot(part["k"].to_list(), part["mean"].to_list(), marker="o", label=run_id)
    ax.set_xlabel("k")
    ax.set_ylabel("mean decision layer")
    ax.legend()
    return figs.save(fig, "cross_model", "Mean decision layer per model and k")


def _page(db, scope: str, sections: list[str]) -> str:
    style = (f"body{{font-family:system-ui,sans-serif;max-width:{PAGE_PX}px;margin:2em auto;color:#222}}"
             "p,figcaption,h2,h3{overflow-wrap:anywhere}.scroll{overflow-x:auto;max-width:100%}"
             "table{border-collapse:collapse;font-size:12px;margin:1em 0}td,th{border:1px solid #ccc;"
             "padding:2px 6px;text-align:right}th{background:#f0f0f0}figure{margin:1em 0}img{max-width:100%}"
             "figcaption{font-size:13px;color:#555}.headline{font-size:16px;background:#f6f6ee;padding:.5em}"
             ".timeline-table td{white-space:nowrap}section.run{border-top:3px solid #3b6ea8;margin-top:2em}"
             "td.wrong{color:#b5533c}"
             ".timeline{display:flex;gap:1em;align-items:flex-start}img.thumb{width:128px;image-rendering:pixelated}"
             "div.plot{contain:layout paint;position:relative}"
             ".legend,.label{position:absolute;font-family:'Open Sans',verdana,arial,sans-serif;color:#444}"
             ".legend{font-size:10px;line-height:19px;white-space:nowrap}.label{white-space:pre;text-align:center;"
             "line-height:1.2;pointer-events:none}.label.top{transform:translate(-50%,0)}"
             ".label.bottom{transform:translate(-50%,-100%)}.label.left{transform:translate(-50%,-50%) rotate(-90deg)}"
             ".legend .key{cursor:pointer;user-select:none}.legend .key.off{opacity:.4}"
             ".swatch{display:inline-block;position:relative;width:30px;height:12px;margin-right:6px;"
             "vertical-align:middle;text-align:center}.swatch i{position:absolute;left:0;right:0;top:6px}"
             ".swatch i.bar{left:9px;right:9px;top:0;height:12px}.swatch b{position:relative;font-weight:normal;"
             "font-size:11px;line-height:12px;vertical-align:top}"
             ".bar-images{font-size:12px;max-height:8em;overflow-y:auto}"
             ".bar-images a,.bar-images span{margin-right:.3em}.strip-row{display:flex;gap:.6em;margin:.4em 0;"
             "align-items:flex-start}.strip-row img.thumb{width:64px}.strip-title{margin:0;font-size:13px}"
             "table.strip{margin:.2em 0;font-size:11px}table.strip td{text-align:center;white-space:nowrap}"
             "table.strip th{font-weight:normal;color:#666}table.strip td,table.strip th{min-width:52px}"
             "table.strip td.right{background:#a8dca8}"
             "table.strip td.wrong{background:#f0b4a8;color:#222}"
             "td.decided{outline:2px solid black;outline-offset:-2px}figure.cards{display:flex;flex-wrap:wrap;"
             "gap:.8em}figure.cards figcaption{flex-basis:100%}.card{width:150px;font-size:12px}"
             ".card img.thumb{width:96px}")
    intro = (f"<p>Database <code>{html.escape(str(db))}</code>; images counted: <code>{html.escape(scope)}</code> "
             "(auto = the test split, or every image of a cross-fit run). l*(k) is the first anchor from which "
             "the probe prediction stays the same for k more anchors; images that never settle are put at the "
             "last anchor T and counted as never stable.</p>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>featstore report</title>"
            f"<style>{style}</style></head><body><h1>featstore report</h1>{intro}{''.join(sections)}"
            f"{page_scripts()}</body></html>")
