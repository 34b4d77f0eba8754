"""The report's sections on the readouts beside the timeline (analytics/readouts.py): a reliability diagram and
ECE and MCE per anchor of each run with their bootstrap intervals, the overthinking shares against the model's head
beside their label-blind permutation nulls, and the CKA matrix of each model's anchors where `featstore cka`
computed one. `readout_sections` returns the HTML; the report places it.

Figures are drawn as the rest of the report draws them (`report_plots.PlotlyFigures` for the page, or
`report_figures._Figures` for publication figures); every one names its runs or model in its legend and caption.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import polars as pl

from featstore.analytics import readouts as r
from featstore.analytics.report_figures import _Figures, _table
from featstore.analytics.report_plots import PlotlyFigures
from featstore.schema import CALIBRATION_MIN_N, SCOPE

TICKS = 9  # pt: 14 px at the report's 110 dpi


def readout_sections(con, run_ids: Sequence[str], scope: str = SCOPE, bins: int = 15,
                     figs: _Figures | PlotlyFigures | None = None) -> str:
    """HTML of the calibration, overthinking and CKA sections for `run_ids`, drawn through the report's own `figs`
    (by default plots the page draws from their embedded data)."""
    if figs is None:
        figs = PlotlyFigures()
    parts = [_calibration(figs, con, run_id, bins, scope) for run_id in run_ids]
    parts.append(_overthinking(figs, con, run_ids, scope))
    parts.extend(_cka(figs, con, model) for model in _models(con, run_ids))
    return "".join(p for p in parts if p)


def _models(con, run_ids: Sequence[str]) -> list[str]:
    from featstore.analytics.queries import models_of_runs

    return models_of_runs(con, run_ids) if run_ids else []


def _anchor_ticks(ax, names: Sequence[str], axis: str = "x") -> None:
    labels = [f"{i} {n}" for i, n in enumerate(names)]
    if axis == "x":
        ax.set_xticks(range(len(names)), labels, rotation=90, fontsize=TICKS)
        ax.set_xlabel("anchor", fontsize=TICKS + 1)
    else:
        ax.set_yticks(range(len(names)), labels, fontsize=TICKS)
        ax.set_ylabel("anchor", fontsize=TICKS + 1)


def _calibration(figs, con, run_id: str, bins: int, scope: str) -> str:
    """Reliability diagram of four anchors (first, a third, two thirds, last), and ECE and MCE of every anchor with
    their bootstrap intervals; bins too small to set MCE are drawn hollow."""
    per_anchor = r.calibration(con, run_id, bins, scope)
    if per_anchor.is_empty():
        return ""
    cells = r.calibration_bins(con, run_id, bins, scope)
    t = int(per_anchor["anchor"].max())
    shown = sorted({0, round(t / 3), round(2 * t / 3), t})
    fig, (left, right) = figs.plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot([0, 1], [0, 1], color="#999999", lw=1, ls="--", label="perfect calibration")
    for anchor in shown:
        part = cells.filter(pl.col("anchor") == anchor)
        name = per_anchor.filter(pl.col("anchor") == anchor)
        line = left.plot(part["confidence"].to_list(), part["accuracy"].to_list(), ms=0, lw=1,
                         label=f"anchor {anchor} {name['name'][0] or ''} (ECE {name['ece'][0]:.3f})")[0]
        for counted, fill in ((True, line.get_color()), (False, "none")):
            cell = part.filter(pl.col("sets_mce") == counted)
            left.plot(cell["confidence"].to_list(), cell["accuracy"].to_list(), ls="", marker="o", ms=4,
                      color=line.get_color(), markerfacecolor=fill)
    left.set_xlabel("mean confidence in bin", fontsize=TICKS + 1)
    left.set_ylabel("accuracy in bin", fontsize=TICKS + 1)
    left.set_xlim(0, 1)
    left.set_ylim(0, 1)
    left.tick_params(labelsize=TICKS)
    left.legend(fontsize=TICKS - 1, loc="upper left")
    anchors = per_anchor["anchor"].to_numpy()
    for column, marker, shift in (("ece", "o", -0.1), ("mce", "s", 0.1)):  # a percentile interval need not hold
        line = right.plot(anchors + shift, per_anchor[column].to_numpy().astype(float), marker=marker, ms=3, lw=1,
                          label=column.upper() + " (95% bootstrap interval)")[0]
        right.vlines(anchors + shift, per_anchor[f"{column}_lo"].to_numpy().astype(float),
                     per_anchor[f"{column}_hi"].to_numpy().astype(float), color=line.get_color(), lw=1)
    _anchor_ticks(right, [n or "" for n in per_anchor["name"].to_list()])
    right.tick_params(axis="y", labelsize=TICKS)
    right.set_ylabel("calibration error", fontsize=TICKS + 1)
    right.legend(fontsize=TICKS - 1)
    replicates = per_anchor["replicates"][0]
    caption = (f"Reliability of the probes of {run_id} ({bins} equal-width bins, {per_anchor['n'][0]} images, "
               f"scope {scope}): accuracy against confidence at four anchors (left; hollow: a bin of fewer than "
               f"{CALIBRATION_MIN_N} images, which does not set MCE), ECE and MCE per anchor with their 95% "
               f"bootstrap intervals over {replicates} resamples of the images (right)")
    table = per_anchor.select("anchor", "name", "ece", "ece_lo", "ece_hi", "mce", "mce_lo", "mce_hi", "mce_n",
                              "bins_used", "small_bins", "min_bin_n", "accuracy", "confidence", "n")
    return (f"<h2>Calibration of {html.escape(run_id)}</h2>"
            f"<p>ECE: the bins' gaps |accuracy - confidence| weighted by their share of the images; MCE: the largest "
            f"gap of a bin of at least {CALIBRATION_MIN_N} images (mce_n: its images), so a nearly empty bin "
            f"cannot set it (small_bins: the non-empty bins below that, min_bin_n: the smallest bin). "
            f"[lo, hi]: the 95% percentile interval over {replicates} bootstrap resamples of the images, each "
            f"image carrying all its anchors. On a few hundred images both errors are biased upward (a bin's "
            f"accuracy is noisy, and its gap is an absolute value), so compare anchors by their intervals, not "
            f"their point figures (docs/design.md §7).</p>"
            + figs.save(fig, f"{run_id}_reliability", caption) + _table(table))


def _overthinking(figs, con, run_ids: Sequence[str], scope: str) -> str:
    """Share right at some anchor <= l per run beside its label-blind permutation null, the head's accuracy, and
    the run-wide shares with their nulls and p-values."""
    frames = r.overthinking_runs(con, run_ids, scope)
    frames = {k: v for k, v in frames.items() if not v.is_empty() and v["n"][0]}
    if not frames:
        return ""
    fig, ax = figs.plt.subplots(figsize=(11, 4.2))
    names: list[str] = []
    one_head = len({v["head_accuracy"][0] for v in frames.values()}) == 1  # the same head on the same images
    for run_id, frame in frames.items():
        anchors = frame["anchor"].to_list()
        line = ax.plot(anchors, frame["correct_by"].to_list(), marker="o", ms=3, label=run_id)[0]
        ax.plot(anchors, frame["correct_by_null"].to_list(), color=line.get_color(), ls="--", lw=1)
        ax.fill_between(anchors, frame["correct_by_null_lo"].to_list(), frame["correct_by_null_hi"].to_list(),
                        color=line.get_color(), alpha=0.12, lw=0)
        if not one_head:
            ax.axhline(frame["head_accuracy"][0], color=line.get_color(), ls=":", lw=1)
        if len(frame) > len(names):
            names = [n or "" for n in frame["name"].to_list()]
    if one_head:
        ax.axhline(next(iter(frames.values()))["head_accuracy"][0], color="0.4", ls=":", lw=1)
    style = [figs.handle(color="0.3", marker="o", ms=3, label="right at some anchor <= l"),
             figs.handle(color="0.3", ls="--", lw=1, label="labels shuffled: mean (band: 95%)"),
             figs.handle(color="0.4", ls=":", lw=1, label="the model's head")]
    ax.legend(handles=[*ax.get_legend_handles_labels()[0], *style], fontsize=TICKS - 1, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    _anchor_ticks(ax, names)
    ax.tick_params(axis="y", labelsize=TICKS)
    ax.set_ylabel("share of images", fontsize=TICKS + 1)
    ax.set_ylim(0, 1.02)
    draws = next(iter(frames.values()))["draws"][0]
    caption = (f"Overthinking (Kaya et al. 2019) of {', '.join(frames)}: share of images whose probe is right at "
               f"some anchor <= l (solid), the same share with the labels shuffled among the images the head gets "
               f"right and among those it gets wrong, each image keeping its timeline (dashed: the mean; band: 95% "
               f"of {draws} permutations), and the head's accuracy (dotted), scope {scope}")
    shares = pl.DataFrame([line for run_id, frame in frames.items() for line in _run_shares(run_id, frame)])
    return ("<h2>Overthinking: right earlier than the end</h2>"
            "<p>wasteful: right at some internal anchor (0..T-1) and the head right too; destructive: right at "
            "some internal anchor but the head wrong; <em>of group</em>: the same as a share of the images the head "
            "gets right (wasteful) or wrong (destructive). "
            "Beside each its label-blind null: the labels shuffled among the images of the same head outcome, "
            "every image keeping its timeline of predictions (<em>null</em>: its mean; "
            "<em>null 95%</em>: the interval of 95% of the permutations; <em>p</em>: the share of permutations at "
            f"least as high, (1 + count) / ({draws} + 1)). A union over many anchors matches some label by luck; "
            "a share above its null's interval (small p) says the probes were right for this image's label, not "
            "any label, before the end (docs/design.md §7).</p>"
            + figs.save(fig, "overthinking", caption) + _table(shares))


def _run_shares(run_id: str, frame: pl.DataFrame) -> list[dict]:
    """One run's rows of the overthinking table: per run-wide share, observed, its null with interval and p, and
    both as shares of the group the head's outcome makes (its right answers, its mistakes)."""
    row = frame.row(0, named=True)
    groups = {"wasteful": row["head_accuracy"], "destructive": 1 - row["head_accuracy"]}
    out = []
    for share in r.RUN_SHARES:
        group = groups[share]
        out.append({"run_id": run_id, "share": share, "observed": row[share], "null": row[f"{share}_null"],
                    "null 95%": f"[{row[f'{share}_null_lo']:.3f}, {row[f'{share}_null_hi']:.3f}]",
                    "p": f"{row[f'{share}_p']:.4f}",
                    "observed of group": row[share] / group if group else None,
                    "null of group": row[f"{share}_null"] / group if group else None,
                    "group": "head right" if share == "wasteful" else "head wrong", "n": row["n"]})
    return out


def _cka(figs, con, model: str) -> str:
    """One heatmap per view and estimator of the model's stored CKA."""
    rows = r.anchor_cka(con, model)
    if rows.is_empty():
        return ""
    parts = [f"<h2>Similarity of the anchors of {html.escape(model)} (linear CKA)</h2>"]
    for (view, estimator), part in rows.group_by(["view", "estimator"], maintain_order=True):
        size = int(part["anchor_a"].max()) + 1
        matrix = [[float("nan")] * size for _ in range(size)]
        for a, b, value in part.select("anchor_a", "anchor_b", "cka").rows():
            matrix[a][b] = float("nan") if value is None else value
        names = {a: n for a, n in part.select("anchor_a", "name_a").unique().rows()}
        labels = [names.get(i) or "" for i in range(size)]
        side = 2.5 + 0.45 * size
        fig, ax = figs.plt.subplots(figsize=(side + 1.5, side))
        image = ax.imshow(matrix, cmap="viridis", vmin=min(0.0, float(part["cka"].min() or 0)), vmax=1)
        _anchor_ticks(ax, labels)
        _anchor_ticks(ax, labels, axis="y")
        bar = fig.colorbar(image, ax=ax)
        bar.set_label(f"CKA ({estimator})", fontsize=TICKS + 1)
        bar.ax.tick_params(labelsize=TICKS)
        caption = (f"Linear CKA ({estimator}) between every pair of anchors of {model} on view {view} "
                   f"({part['n_images'][0]} images)")
        parts.append(figs.save(fig, f"{model}_{view}_{estimator}_cka", caption))
    return "".join(parts)
