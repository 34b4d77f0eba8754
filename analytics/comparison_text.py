"""`featstore compare`'s record, and its text a 120-column terminal shows whole: each definition's layers, the
pairs of definitions ranked by how much they disagree (named, not numbered) and the 3x3 early/mid/late
cross-tables. The numbers are the Comparison's (SQL); this module only lays them out."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

WIDTH = 120  # no line is longer: a terminal of that width shows the output unbroken
SHOWN_PAIRS = 10  # pairs the default output lists, those that disagree most
BANDS = ("early", "mid", "late")


@dataclass
class Comparison:
    """Every established definition of when the network decides, side by side (`featstore compare`)."""

    runs: list[str]
    summary: pl.DataFrame  # per definition: n, mean, median, band shares
    agreement: pl.DataFrame  # per pair: n, Spearman, same band, early-by-one-late-by-the-other counts
    crosstab: pl.DataFrame  # per pair: the early/mid/late cross-table
    disagreements: pl.DataFrame  # per pair: a few images early by one and late by the other
    decided: pl.DataFrame  # the same where both layers are decisions (no fallback at T or T + 1), with their count n
    ranking: pl.DataFrame  # per pair: the agreement with that count (early_late_decided), most disagreeing first
    depths: pl.DataFrame | None = None  # per run: prediction depth's layer 0, references and unsettled images

    def shortened(self) -> Comparison:
        """The same tables with the run ids' common 'model/view/' prefix left out of every definition's name."""
        prefix = os.path.commonprefix(self.runs)
        prefix = prefix[: prefix.rfind("/") + 1]
        if not prefix:
            return self

        def short(frame: pl.DataFrame) -> pl.DataFrame:
            names = [c for c in ("definition", "a", "b") if c in frame.columns]
            return frame.with_columns(pl.col(c).str.replace(prefix, "", literal=True) for c in names)

        return Comparison([r.removeprefix(prefix) for r in self.runs], short(self.summary), short(self.agreement),
                          short(self.crosstab), short(self.disagreements), short(self.decided), short(self.ranking),
                          None if self.depths is None else self.depths.with_columns(
                              pl.col("run_id").str.replace(prefix, "", literal=True)))

    def lines(self, part: str | None, k: int, min_conf: float) -> list[str]:
        """The text `featstore compare` prints: one part (summary, agreement, crosstab, disagreements), or by
        default the overview, each line at most 120 characters."""
        return comparison_lines(self, part, k, min_conf)

    def matrix(self, value: str) -> pl.DataFrame:
        """A per-pair statistic as a square table, rows and columns in the summary's order (columns #1, #2, ...):
        'spearman' (symmetric, 1 on the diagonal) or 'early_late' (row early, column late: image counts)."""
        names = self.summary["definition"].to_list()
        cells: dict[tuple[str, str], float | int | None] = {}
        for row in self.agreement.iter_rows(named=True):
            a, b = row["a"], row["b"]
            if value == "spearman":
                cells[a, b] = cells[b, a] = row["spearman"]
            else:
                cells[a, b], cells[b, a] = row["early_a_late_b"], row["late_a_early_b"]
        diagonal = 1.0 if value == "spearman" else None
        columns = {f"#{j + 1}": [diagonal if a == b else cells.get((a, b)) for a in names]
                   for j, b in enumerate(names)}
        return pl.DataFrame({"definition": [f"#{i + 1} {n}" for i, n in enumerate(names)], **columns})


def _cell(value: object, digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def wrapped(text: str, width: int = WIDTH, indent: str = "  ") -> list[str]:
    """A paragraph as lines of at most `width` characters, the later ones indented."""
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False)


def _fit(segments: Sequence[str], room: int) -> list[str]:
    """Segments joined by two spaces into lines of at most `room` characters, broken between segments (a segment
    longer than a line is broken at its own spaces)."""
    lines: list[str] = []
    for segment in segments:
        if lines and len(lines[-1]) + 2 + len(segment) <= room:
            lines[-1] += "  " + segment
        else:
            lines += textwrap.wrap(segment, room, break_on_hyphens=False) or [""]
    return lines or [""]


def columns(header: Sequence[str], rows: Sequence[Sequence[str | Sequence[str]]], width: int = WIDTH) -> list[str]:
    """A plain table: every column but the last right-aligned, the last (a name, or a pair of names as segments,
    however long) left-aligned and wrapped under itself where a line would pass `width`."""
    texts = [[c if isinstance(c, str) else "  ".join(c) for c in row] for row in (header, *rows)]
    widths = [max(len(row[i]) for row in texts) for i in range(len(header) - 1)]
    lead = sum(w + 2 for w in widths)
    lines = []
    for row, shown in zip((header, *rows), texts, strict=True):
        left = "".join(f"{c:>{w}}  " for c, w in zip(shown[:-1], widths, strict=True))
        name = _fit([row[-1]] if isinstance(row[-1], str) else row[-1], max(width - lead, 20))
        lines += [(left if i == 0 else " " * lead) + part for i, part in enumerate(name)]
    return lines


NEVER_STABLE_MARK = "*"  # after a late share that can only count never-stable images


def summary_lines(result: Comparison) -> list[str]:
    """Per definition: images placed, mean and median layer, the share in each band; a late share marked where the
    window leaves no stable layer in the late band, with a line saying so."""
    rows = [[str(r["n"]), _cell(r["mean"], 2), _cell(r["median"], 1), _cell(r["f_early"], 3), _cell(r["f_mid"], 3),
             _cell(r["f_late"], 3) + (NEVER_STABLE_MARK if r["late_is_never_stable"] else ""),
             _cell(r["f_unsettled"], 3), r["definition"]]
            for r in result.summary.iter_rows(named=True)]
    note = (wrapped(f"{NEVER_STABLE_MARK} late = never stable: at this k a stable l*(k) or joint layer is at most "
                    "T - k, below the late band (l >= 0.7T), so the late share counts only images that never "
                    "stabilise (late_is_never_stable).") if result.summary["late_is_never_stable"].any() else [])
    return columns(["n", "mean", "median", "early", "mid", "late", "unsettled", "definition"], rows) + note


def depth_lines(result: Comparison) -> list[str]:
    """Per run, what its prediction depth is read against: layer 0 (the input or not), the rows its probes learnt
    from (knn: the rows that vote), and the images no anchor settles."""
    if result.depths is None or result.depths.is_empty():
        return []
    lines = []
    for r in result.depths.iter_rows(named=True):
        zero = ("the input image (on a grid), as Baldock et al.'s" if r["input_layer0"]
                else f"{r['layer0']}, the first stored anchor, not the input (a build with the anchors "
                     "input,default stores it)")
        lines += wrapped(f"depth {r['run_id']}: layer 0 = {zero}; references: {r['reference_rows']}; unsettled "
                         f"(even anchor {r['t']} is not the model's answer; no depth, not late): {r['unsettled']} of "
                         f"{r['n']} ({r['f_unsettled']:.1%})")
    return lines


def pair_lines(result: Comparison, shown: int | None = None) -> list[str]:
    """The pairs of definitions, those that disagree most first (definition_ranking), `shown` of them (all: None),
    with a legend of the columns."""
    total = len(result.ranking)
    ranking = result.ranking if shown is None else result.ranking.head(shown)
    title = (f"the {len(ranking)} of {total} pairs of definitions that disagree most:" if len(ranking) < total
             else "the one pair of definitions:" if total == 1
             else f"all {total} pairs of definitions, those that disagree most first:")
    rows = [[str(r["early_late_decided"]), str(r["early_a_late_b"]), str(r["late_a_early_b"]),
             _cell(r["same_band"], 3), _cell(r["spearman"], 3), str(r["n"]), (f"{r['a']}  vs", r["b"])]
            for r in ranking.iter_rows(named=True)]
    legend = wrapped("decided: images early by one definition and late by the other where both layers are decisions "
                     "(no fallback: a never-stable l* or joint layer at T, an unsettled depth at T + 1); "
                     "early/late, late/early: early by a and late by b, and the reverse, l* and joint fallbacks "
                     "counted (an unsettled depth is in no band); "
                     "same: share of the images in the same band; spearman: Spearman's ρ of the layers "
                     "(- when one is constant); n: images both place.")
    return [title, *columns(["decided", "early/late", "late/early", "same", "spearman", "n", "a  vs  b"], rows),
            *legend]


def overview_lines(result: Comparison, k: int, min_conf: float, shown: int = SHOWN_PAIRS) -> list[str]:
    """The default output: the definitions, then the `shown` pairs that disagree most and how to see the rest."""
    joint = f", joint(k, {min_conf:g}) = l*(k) with conf >= {min_conf:g} at l*" if min_conf > 0 else ""
    lines = wrapped(f"decision layer per definition (k = {k}{joint}; depth = prediction depth, T + 1 and in no band "
                    "when unsettled; bands: early l < 0.3T, late l >= 0.7T, mid between; unsettled: the share of "
                    f"depth's images no anchor settles; runs {', '.join(result.runs)}):")
    lines += [*summary_lines(result), *depth_lines(result), "", *pair_lines(result, shown)]
    total = len(result.ranking)
    left = total - shown
    more = f"{left} more pair{'s' * (left > 1)} not shown; --part agreement lists every pair, " if left > 0 else ""
    lines += [""] + wrapped(f"{more}--part crosstab the 3x3 early/mid/late tables of each pair, --part matrix the "
                            "Spearman and early/late matrices, --part disagreements images early by one and late by "
                            "the other.")
    return lines


def crosstab_lines(result: Comparison) -> list[str]:
    """Per pair of definitions, in the ranking's order: the images in each band by a (rows) and by b (columns)."""
    cells = {(r["a"], r["b"], r["band_a"], r["band_b"]): r["n"] for r in result.crosstab.iter_rows(named=True)}
    lines = wrapped("images per band of a (rows) and of b (columns), per pair of definitions (early l < 0.3T, late "
                    "l >= 0.7T, mid between; unsettled: a prediction depth no anchor settles), the pairs that "
                    "disagree most first:")
    for pair in result.ranking.iter_rows(named=True):
        a, b = pair["a"], pair["b"]
        shown_a = [x for x in (*BANDS, "unsettled") if (a, b, x, "early") in cells]
        shown_b = [y for y in (*BANDS, "unsettled") if (a, b, "early", y) in cells]
        rows = [[x.ljust(9), *(str(cells.get((a, b, x, y), 0)) for y in shown_b), ""] for x in shown_a]
        lines += ["", *_fit((f"a = {a}  vs", f"b = {b}", f"({pair['n']} images)"), WIDTH)]
        lines += ["  " + line.rstrip() for line in columns(["a \\ b", *shown_b, ""], rows, WIDTH - 2)]
    return lines


def disagreement_lines(result: Comparison) -> list[str]:
    """Per pair of definitions, in the ranking's order: the few images early by one and late by the other."""
    lines = wrapped("a few images early by one definition and late by the other, per pair (--per-pair of each side; "
                    "layers of a and b among anchors 0..T), the pairs that disagree most first:")
    for pair in result.ranking.iter_rows(named=True):
        images = result.disagreements.filter((pl.col("a") == pair["a"]) & (pl.col("b") == pair["b"]))
        if images.is_empty():
            continue
        rows = [[str(r["image_id"]), str(r["label"]), str(r["layer_a"]), str(r["layer_b"]), str(r["t"]),
                 r["side"], r["path"]] for r in images.iter_rows(named=True)]
        lines += ["", *_fit((f"a = {pair['a']}  vs", f"b = {pair['b']}"), WIDTH)]
        lines += ["  " + line for line in columns(["image", "label", "a", "b", "T", "side", "path"], rows, WIDTH - 2)]
    return lines if not result.disagreements.is_empty() else [*lines, "none"]


def comparison_lines(result: Comparison, part: str | None, k: int, min_conf: float) -> list[str]:
    """What `featstore compare` prints in the table format: one part (summary, agreement, crosstab,
    disagreements), or by default the overview."""
    if part is None:
        return overview_lines(result, k, min_conf)
    return {"summary": summary_lines, "agreement": pair_lines, "crosstab": crosstab_lines,
            "disagreements": disagreement_lines}[part](result)
