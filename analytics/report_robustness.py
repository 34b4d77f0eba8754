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
from featstore.analytics.report_figures import _Figures, _slug, _table

_plural = pl.when(pl.col("probes") == 1).then(pl.lit("")).otherwise(pl.lit("s"))  # "1 probe", "6 probes"
SHOWN = ("f_early", "f_mid", "f_late", "never_stable")  # the fractions a row shows with their intervals


def _with_interval(name: str) -> pl.Expr:
    """'0.412 [0.361, 0.466]': a fraction and its bootstrap interval as one cell."""
    return pl.format("{} [{}, {}]", *(pl.col(c).round(3) for c in (name, f"{name}_lo", f"{name}_hi"))).alias(name)


def spread_table(sweep: pl.DataFrame) -> pl.DataFrame:
    """Per model, view and k: one row per probe of the set (each fraction with its interval), then one row with each
    fraction's range over the set and the share of images whose band holds under every probe."""
    probes = sweep.select("model", "view", "k", "run_id", "n", *(_with_interval(name) for name in SHOWN),
                          _with_interval("band_holds").alias("holds"), pl.lit(0).alias("order"))
    ranges = (sweep.group_by("model", "view", "k", maintain_order=True)
              .agg(pl.len().alias("probes"), pl.first("n"), pl.first("band_holds"), pl.first("band_holds_lo"),
                   pl.first("band_holds_hi"), *(pl.first(f"{name}_{end}") for name in SHOWN for end in ("min", "max")))
              .select("model", "view", "k", pl.format("range over {} probe{}", "probes", _plural).alias("run_id"), "n",
                      *(pl.format("{}..{}", pl.col(f"{name}_min").round(3), pl.col(f"{name}_max").round(3)).alias(name)
                        for name in SHOWN),
                      _with_interval("band_holds").alias("holds"), pl.lit(1).alias("order")))
    return pl.concat([probes, ranges.cast(probes.schema)]).sort("model", "view", "k", "order",
                                                                 maintain_order=True).drop("order")


def robustness_section(figs: _Figures, con, ks: Sequence[int], k: int, scope: str,
                       caveat: Callable[[int, int], str] = lambda t, k: "",
                       runs: Sequence[str] | None = None) -> str:
    """The section on the clean view of every model: a headline at `k`, the table over `ks` and one figure per
    model (early and late share per probe and k, with intervals). `caveat(T, k)`: the report's note where no stable
    l* can be late. `runs`: the declared set (default: every run of probe seed 0 without cross-fit)."""
    sweep = rb.robust_sweep(con, ks, scope, runs).filter(pl.col("view") == "clean")
    parts = ["<h2 id='robustness'>What of this timeline is the network's</h2>",
             "<p>l*(k) is read off a probe's predictions, so part of every figure below is the probe's. Here each "
             "model's clean timeline is read by a set of probes, every run of probe seed 0 on one split: the linear "
             "probe at the C its val rows chose, at the neighbouring values of its C grid where the database holds "
             "them (<code>linear:C_step=±1</code>), and every other probe family. Each share has a 95% bootstrap "
             "interval over images "
             f"(seed {rb.SEED}, {rb.REPLICATES:,} resamples; all probes count the same images); <em>holds</em> is the "
             "share of images whose early/mid/late band is the same under every probe: only that part of the "
             "timeline is the network's whatever the probe (<code>robust_bands</code>, <code>robust_sweep</code>; "
             "docs/design.md §5).</p>"]
    if sweep.is_empty():
        return "".join(parts) + "<p>No clean run to read.</p>"
    for model in sweep["model"].unique(maintain_order=True).to_list():
        part = sweep.filter(pl.col("model") == model)
        t = len(q.anchor_names(con, model)) - 1
        notes = "".join(f"<p>Note: {html.escape(note)}.</p>" for note in
                        dict.fromkeys(caveat(t, k) for k in sorted(set(part["k"].to_list()))) if note)
        parts += [_headline(part, k, model), _table(spread_table(part).drop("model", "view")), notes,
                  _figure(figs, part, model)]
    return "".join(parts)


def _headline(sweep: pl.DataFrame, k: int, model: str) -> str:
    at_k = sweep.filter(pl.col("k") == k)
    if at_k.is_empty():
        return ""
    r = at_k.row(0, named=True)
    if r["probes"] < 2:
        return (f"<p class='headline'>{html.escape(model)}: one probe only ({html.escape(r['run_id'])}); land a "
                f"neighbour-C run (<code>featstore probe --variant linear:C_step=1</code>) or another family to "
                f"see how much of its timeline the probe decides.</p>")
    return (f"<p class='headline'>{html.escape(model)}, k = {k}: the band of {r['band_holds']:.0%} "
            f"[{r['band_holds_lo']:.0%}, {r['band_holds_hi']:.0%}] of the {r['n']} images holds under all "
            f"{r['probes']} probes; the early share ranges {r['f_early_min']:.0%}..{r['f_early_max']:.0%} and the "
            f"late share {r['f_late_min']:.0%}..{r['f_late_max']:.0%} over the set.</p>")


def _figure(figs: _Figures, sweep: pl.DataFrame, model: str) -> str:
    fig, axes = figs.plt.subplots(1, 3, figsize=(10, 3.2), sharey=True)
    runs = sweep["run_id"].unique(maintain_order=True).to_list()
    for ax, name, title in zip(axes, ("f_early", "f_late", "band_holds"),
                               ("early share", "late share (never stable included)", "band holds under all"),
                               strict=True):
        for i, run_id in enumerate(runs if name != "band_holds" else runs[:1]):
            rows = sweep.filter(pl.col("run_id") == run_id).sort("k")
            x = [k + (i - (len(runs) - 1) / 2) * 0.06 * (name != "band_holds") for k in rows["k"].to_list()]
            value = rows[name].to_numpy()
            error = np.clip([value - rows[f"{name}_lo"].to_numpy(), rows[f"{name}_hi"].to_numpy() - value], 0, None)
            ax.errorbar(x, value, yerr=error, marker="o", ms=3, capsize=2,
                        label=run_id.split("/", 2)[-1] if name != "band_holds" else None)
        ax.set_title(title)
        ax.set_xlabel("k")
        ax.set_xticks(sorted(set(sweep["k"].to_list())))
    axes[0].set_ylabel("share of images")
    axes[0].set_ylim(0, 1.02)
    axes[1].legend(fontsize=8, loc="best")
    return figs.save(fig, f"{_slug(model)}_robustness", f"{model} (clean): early and late shares per probe of the "
                                                        f"set and k, and the share whose band every probe agrees "
                                                        f"on, with 95% bootstrap intervals")
