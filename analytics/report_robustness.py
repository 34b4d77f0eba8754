"""The report's opening section, "What of this timeline is the network's": the k-sweep's band fractions under a set
of probes (analytics/robustness.py), each with its bootstrap interval, their range over the set and the share of
images whose band every probe agrees on; and `spread_table`, the same figures as text (`timeline --spread`)."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import numpy as np
import polars as pl

from featstore.analytics import queries as q
from featstore.analytics import robustness as rb
from featstore.analytics.report_figures import _slug, _table
from featstore.records import RunIdentity

SHOWN = ("f_early", "f_mid", "f_late", "never_stable")  # the fractions a row shows with their intervals


def _with_interval(name: str, digits: int = 3) -> pl.Expr:
    """'0.412 [0.361, 0.466]': a figure and its bootstrap interval as one cell; '-' where there is no figure (a set
    of one family agrees with itself by construction), the figure alone where there is no interval."""
    value, low, high = (pl.col(c).round(digits) for c in (name, f"{name}_lo", f"{name}_hi"))
    return (pl.when(pl.col(name).is_null()).then(pl.lit("-"))
            .when(pl.col(f"{name}_lo").is_null()).then(value.cast(pl.String))
            .otherwise(pl.format("{} [{}, {}]", value, low, high)).alias(name))


def _set_name(sweep: pl.DataFrame) -> pl.Expr:
    """'4 families (one vote each: head-probe, knn, linear, paper) of 6 runs': what a set row's figures count."""
    names = pl.col("probe_set").map_elements(lambda runs: "; ".join(RunIdentity.parse(r).probe_id for r in runs),
                                             return_dtype=pl.String)
    families = pl.format("{} famil{}", "families", pl.when(pl.col("families") == 1).then(pl.lit("y"))
                         .otherwise(pl.lit("ies")))
    return pl.format("set: {} (votes: {}) of {} run{}", families, names, "probes",
                     pl.when(pl.col("probes") == 1).then(pl.lit("")).otherwise(pl.lit("s")))


def spread_table(sweep: pl.DataFrame) -> pl.DataFrame:
    """Per model, view and k: one row per run of the set (each fraction with its interval, and `family`: the share
    whose band is the same under every member of its family), then one row for the set: each fraction's range over
    its runs, the share whose band holds under every family's vote, Fleiss' kappa of those votes and the share
    independent voters would agree on by chance; late = never stable where no stable l*(k) can be late."""
    flag = pl.when(pl.col("late_is_never_stable")).then(pl.lit("yes")).otherwise(pl.lit("")).alias("late=never")
    probes = sweep.select("model", "view", "k", "run_id", "n", *(_with_interval(name) for name in SHOWN),
                          pl.col("family_holds").round(3).cast(pl.String).fill_null("-").alias("family"),
                          pl.lit("").alias("holds"), pl.lit("").alias("kappa"), pl.lit("").alias("chance"), flag,
                          pl.lit(0).alias("order"))
    ranges = (sweep.group_by("model", "view", "k", maintain_order=True).first()
              .select("model", "view", "k", _set_name(sweep).alias("run_id"), "n",
                      *(pl.format("{}..{}", pl.col(f"{name}_min").round(3), pl.col(f"{name}_max").round(3)).alias(name)
                        for name in SHOWN), pl.lit("").alias("family"),
                      _with_interval("band_holds").alias("holds"), _with_interval("kappa"),
                      pl.col("band_holds_chance").round(3).cast(pl.String).fill_null("-").alias("chance"), flag,
                      pl.lit(1).alias("order")))
    return pl.concat([probes, ranges.cast(probes.schema)]).sort("model", "view", "k", "order",
                                                                 maintain_order=True).drop("order")


def robustness_section(figs, con, ks: Sequence[int], k: int, scope: str,
                       caveat: Callable[[int, int], str] = lambda t, k: "",
                       runs: Sequence[str] | None = None) -> str:
    """The section on the clean view of every model: a headline at `k`, the table over `ks` and one figure per
    model (early and late share per probe and k, the agreement and kappa, with intervals). `caveat(T, k)`: the
    report's note where no stable l* can be late. `runs`: the declared set (default: every run of probe seed 0
    without cross-fit)."""
    sweep = rb.robust_sweep(con, ks, scope, runs).filter(pl.col("view") == "clean")
    parts = ["<h2 id='robustness'>What of this timeline is the network's</h2>",
             "<p>l*(k) is read off a probe's predictions, so part of every figure below is the probe's. Here each "
             "model's clean timeline is read by a set of probes, every run of probe seed 0 on one split, grouped in "
             "families: a family is one probe and its near-duplicates, the runs that differ from it only in the "
             "regularisation strength (the linear probe at the C its val rows chose and its neighbour-C runs, "
             "<code>linear:C_step=±1</code>) or the probe seed. Each family casts one vote, its lead run's (the one "
             "at the chosen C), so adding near-duplicates moves no agreement figure; <em>family</em> is the share of "
             "images whose band is the same under every run of a family. For the set, <em>holds</em> is the share "
             "of images whose early/mid/late band is the same under every family's vote; <em>kappa</em> is Fleiss' "
             "kappa of those votes (0: no more agreement than votes at the families' own band shares would reach "
             "by chance, 1: complete), and <em>chance</em> the share that independent votes at those shares would "
             "all agree on. Every interval is a 95% percentile bootstrap over images "
             f"(seed {rb.SEED}, {rb.REPLICATES:,} resamples; all probes count the same images) with each probe's "
             "fit fixed: it does not cover refitting the probes (<code>featstore timeline --spread --refits</code> "
             "adds their seeds). A set of one family has no agreement figure (-). What these figures measure is "
             "how far the probe families available here agree on each image's band, not the band's truth "
             "(<code>robust_bands</code>, <code>robust_sweep</code>; docs/design.md §5).</p>"]
    if sweep.is_empty():
        return "".join(parts) + "<p>No clean run to read.</p>"
    for model in sweep["model"].unique(maintain_order=True).to_list():
        part = sweep.filter(pl.col("model") == model)
        t = len(q.anchor_names(con, model)) - 1
        notes = "".join(f"<p>Note: {html.escape(note)}.</p>" for note in
                        dict.fromkeys(caveat(t, k) for k in sorted(set(part["k"].to_list()))) if note)
        parts += [_headline(part, k, model, caveat(t, k)), _table(spread_table(part).drop("model", "view")), notes,
                  _figure(figs, part, model)]
    return "".join(parts)


def _headline(sweep: pl.DataFrame, k: int, model: str, caveat: str = "") -> str:
    """The section's sentence at `k`: exactly what was measured, on which probes, over how many images."""
    at_k = sweep.filter(pl.col("k") == k)
    if at_k.is_empty():
        return ""
    r = at_k.row(0, named=True)
    late = " (late = never stable at this k)" if r["late_is_never_stable"] else ""
    if r["families"] < 2:
        others = r["probes"] - 1
        return (f"<p class='headline'>{html.escape(model)}: one probe family only ({html.escape(r['probe_set'][0])}"
                f"{f', with {others} near-duplicate run(s)' if others else ''}), so no "
                f"agreement between probes is measured; land another family (<code>featstore probe --variant "
                f"knn</code>, <code>--variant paper</code>) to see how much of its timeline the probe decides.</p>")
    voters = "; ".join(html.escape(RunIdentity.parse(run).label) for run in r["probe_set"])
    return (f"<p class='headline'>{html.escape(model)}, k = {k}: of the {r['n']} images every run counts, "
            f"{_share(r['band_holds'])} [{_share(r['band_holds_lo'])}, {_share(r['band_holds_hi'])}] fall in the "
            f"same early/mid/late band under all {r['families']} probe families ({voters}; one vote each, "
            f"{r['probes']} runs in all); independent probes at their own band shares would agree on "
            f"{_share(r['band_holds_chance'])}; Fleiss' kappa = {_kappa(r['kappa'])} [{_kappa(r['kappa_lo'])}, "
            f"{_kappa(r['kappa_hi'])}]{' (undefined: every vote in one band)' if _kappa(r['kappa']) == '-' else ''}. "
            f"Over the runs the early share "
            f"ranges {_share(r['f_early_min'])}..{_share(r['f_early_max'])} and the late share{late} "
            f"{_share(r['f_late_min'])}..{_share(r['f_late_max'])}. Intervals: 95% bootstrap over "
            f"{html.escape(r['interval_over'])}.</p>")


def _share(value: float | None) -> str:
    """A share as a whole percentage; '-' where it is undefined (NULL or NaN)."""
    return "-" if value is None or value != value else f"{value:.0%}"


def _kappa(value: float | None) -> str:
    """Fleiss' kappa to two places; '-' where it is undefined (every vote in one band: no chance to correct)."""
    return "-" if value is None or value != value else f"{value:.2f}"


def _errorbar(ax, rows: pl.DataFrame, name: str, x: list[float], **style) -> None:
    """One figure over k with its bootstrap interval as error bars."""
    value = rows[name].to_numpy()
    error = np.clip([value - rows[f"{name}_lo"].to_numpy(), rows[f"{name}_hi"].to_numpy() - value], 0, None)
    ax.errorbar(x, value, yerr=error, marker="o", ms=3, capsize=2, **style)


def _figure(figs, sweep: pl.DataFrame, model: str) -> str:
    fig, axes = figs.plt.subplots(1, 3, figsize=(10, 3.2))
    runs = sweep["run_id"].unique(maintain_order=True).to_list()
    for ax, name in zip(axes, ("f_early", "f_late"), strict=False):
        for i, run_id in enumerate(runs):
            rows = sweep.filter(pl.col("run_id") == run_id).sort("k")
            _errorbar(ax, rows, name, [k + (i - (len(runs) - 1) / 2) * 0.06 for k in rows["k"].to_list()],
                      label=RunIdentity.parse(run_id).label)
    agreement = sweep.group_by("k").first().sort("k")
    ks = agreement["k"].to_list()
    if agreement["families"].max() > 1:
        _errorbar(axes[2], agreement, "band_holds", [k - 0.05 for k in ks], label="band holds under every vote")
        _errorbar(axes[2], agreement, "kappa", [k + 0.05 for k in ks], label="Fleiss' kappa")
        axes[2].plot(ks, agreement["band_holds_chance"].to_list(), ls=":", marker="x", color="grey",
                     label="holds by chance")
        axes[2].legend(fontsize=8, loc="best")
    else:
        axes[2].text(0.5, 0.5, "one probe family:\nnothing to agree", ha="center", va="center",
                     transform=axes[2].transAxes)
    axes[2].set_title(f"agreement of {agreement['families'][0]} families")
    for ax in axes:
        ax.set_xlabel("k")
        ax.set_xticks(ks)
        ax.set_ylim(min([0, *(v for v in agreement["kappa_lo"].to_list() if v is not None)]) - 0.02, 1.02)
    axes[0].set_title("early share")
    axes[1].set_title("late share (never stable included)")
    axes[0].set_ylabel("share of images")
    axes[1].legend(fontsize=8, loc="best")
    return figs.save(fig, f"{_slug(model)}_robustness",
                     f"{model} (clean): early and late shares per run of the set and k; the share whose band every "
                     f"family's vote agrees on, Fleiss' kappa of those votes and the share independent votes would "
                     f"agree on; 95% bootstrap intervals over {sweep['interval_over'][0]}")
