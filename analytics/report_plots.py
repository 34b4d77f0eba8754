"""The report's figures as Plotly specs the page draws in the browser: the axes object the sections draw on takes
the small part of matplotlib's Axes API they use (plot, step, bar, scatter, errorbar, fill_between, vlines, imshow,
axhline, axvspan, text, ticks, labels, limits, legend, colorbar) and records it as Plotly traces, shapes and
annotations. The sections draw once, here, for the page; matplotlib (`report_figures._Figures`) draws the same calls
only when publication figures are asked for. Nothing here imports matplotlib.

The page embeds each figure's spec as JSON and draws it with plotly.js, inlined so that the page works offline: the
minified cartesian bundle (scatter, bar, heatmap, image and a few other trace types; 1.5 MB where the full bundle is
4.8 MB and costs the browser a second more to evaluate), vendored with its MIT licence in `assets/` from the npm
package plotly.js-cartesian-dist-min (see `PLOTLY_JS`).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Sequence
from functools import cache
from importlib import resources

import numpy as np

from featstore.analytics.report_figures import PAGE_PX

CYCLE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
         "#17becf"]  # matplotlib's default colour cycle, so a figure and its publication version match
MARKERS = {"o": "circle", "s": "square", "*": "star", "D": "diamond", "x": "x", "": None, None: None}
DASHES = {"-": "solid", "--": "dash", ":": "dot", "-.": "dashdot"}
SCALES = {"viridis": "Viridis", "magma": "Magma", "RdBu_r": "RdBu", "Oranges": "Oranges"}
PX_PER_INCH = 100
TITLE_PX = 20  # room for an axis title beyond its tick labels
TICK_FONT = 11.0  # px: the page's font size (Figure.spec's layout.font), its tick labels'
TITLE_FONT = 13.0  # px: plotly.js's axis titles, 1.2 x the font
# Every axis: matplotlib's look. Tick labels stay level unless a section rotates them, and may overflow: the layout
# (`Figure.spec`) leaves room for them as they are, and plotly.js's defaults measure every tick label to choose an
# angle ("auto") and, once per tick label, every other one to hide those past the plot ("hide past div"): half
# the cost of drawing a plot.
AXIS = {"showgrid": False, "zeroline": False, "ticks": "outside", "showline": True, "mirror": True,
        "linecolor": "#444", "tickangle": 0, "ticklabeloverflow": "allow"}


PLOTLY_JS = "plotly-cartesian.min.js"  # npm plotly.js-cartesian-dist-min 4.1.1, beside its licence plotly.js-LICENSE


@cache
def plotly_script() -> str:
    """plotly.js's cartesian bundle, minified: inlined in the page so that it draws offline."""
    return (resources.files("featstore.analytics") / "assets" / PLOTLY_JS).read_text(encoding="utf-8")


def _colour(colour: object) -> str | None:
    """A CSS colour for a matplotlib one: names and #rgb pass, a grey level '0.4' becomes rgb()."""
    if colour is None or colour == "none":
        return None
    text = str(colour)
    try:
        level = float(text)
    except ValueError:
        return text
    v = round(255 * level)
    return f"rgb({v},{v},{v})"


def _rgba(colour: str | None, alpha: float) -> str | None:
    if colour is None or not colour.startswith("#") or len(colour) != 7:
        return colour
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _values(values) -> list:
    """A JSON-ready list: numpy and polars values as Python numbers, NaN as null."""
    out = np.asarray(values, dtype=object).tolist() if not isinstance(values, list) else values
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else
            (v.item() if hasattr(v, "item") else v) for v in out]


def _matrix(values) -> list:
    return [_values(list(row)) for row in np.asarray(values, dtype=object)]


class ListedColormap:
    """Discrete colours for `imshow` (matplotlib.colors.ListedColormap's part the report uses)."""

    def __init__(self, colours: Sequence[str]):
        self.colours = list(colours)


class Line:
    """What `plot` returns: its colour, and its legend entry."""

    def __init__(self, colour: str | None, label: str | None = None):
        self.colour, self.label = colour, label

    def get_color(self) -> str | None:
        return self.colour


class Handle(Line):
    """A legend entry drawn by no data (matplotlib's Line2D proxy): a line and/or marker style and a label."""

    def __init__(self, colour: str | None = None, label: str | None = None, marker: str | None = None,
                 ls: str = "-", lw: float = 1.5, ms: float = 6.0):
        super().__init__(_colour(colour), label)
        self.marker, self.ls, self.lw, self.ms = marker, ls, lw, ms


class _Image:
    def __init__(self, trace: dict, ax: Axes):
        self.trace, self.ax = trace, ax


class _Colorbar:
    class _Ax:
        def tick_params(self, **_) -> None:
            pass

    def __init__(self, trace: dict):
        self.trace, self.ax = trace, self._Ax()

    def set_label(self, label: str, **_) -> None:
        self.trace.setdefault("colorbar", {})["title"] = {"text": label, "side": "right"}


class Axes:
    """One subplot: its traces, shapes, annotations and axis settings in Plotly's terms."""

    def __init__(self, figure: Figure, index: int, row: int, col: int):
        self.figure, self.index, self.row, self.col = figure, index, row, col
        suffix = "" if index == 1 else str(index)
        self.xref, self.yref = f"x{suffix}", f"y{suffix}"
        self.xaxis: dict = {"anchor": self.yref, **AXIS}
        self.yaxis: dict = {"anchor": self.xref, **AXIS}
        self.lines: list[Line] = []
        self._line_cycle = self._patch_cycle = 0
        self.title: str | None = None
        self.legend_shown = False
        self.colorbars: list[dict] = []

    # colours, in matplotlib's order: lines and patches (bars, scatter, fills) cycle apart
    def _next_line(self) -> str:
        colour = CYCLE[self._line_cycle % len(CYCLE)]
        self._line_cycle += 1
        return colour

    def _next_patch(self) -> str:
        colour = CYCLE[self._patch_cycle % len(CYCLE)]
        self._patch_cycle += 1
        return colour

    def _add(self, trace: dict, label: str | None = None) -> dict:
        trace.update(xaxis=self.xref, yaxis=self.yref)
        shown = bool(label) and not str(label).startswith("_")
        trace["name"] = str(label) if shown else trace.get("name", "")
        trace["showlegend"] = shown
        if shown:
            trace["legendgroup"] = str(label)
        self.figure.data.append(trace)
        return trace

    def _line_trace(self, x, y, color=None, ls="-", lw=1.5, marker=None, ms=6.0, label=None,
                    markerfacecolor=None, shape: str | None = None, **_) -> Line:
        colour = _colour(color) or self._next_line()
        symbol = MARKERS.get(marker, "circle")
        drawn_line = ls not in ("", "None", None)
        mode = "+".join(m for m, on in (("lines", drawn_line), ("markers", symbol is not None)) if on) or "lines"
        trace: dict = {"type": "scatter", "mode": mode, "x": _values(x), "y": _values(y),
                       "line": {"color": colour, "width": lw, "dash": DASHES.get(ls, "solid")},
                       "hovertemplate": "%{x}: %{y:.3g}"}
        if shape:
            trace["line"]["shape"] = shape
        if symbol is not None:
            open_ = markerfacecolor == "none"
            trace["marker"] = {"symbol": symbol + ("-open" if open_ else ""), "size": max(3.0, 1.6 * ms),
                               "color": colour}
        self._add(trace, label)
        line = Line(colour, label)  # its legend entry
        self.lines.append(line)
        return line

    def plot(self, x, y, **style) -> list[Line]:
        return [self._line_trace(x, y, **style)]

    def step(self, x, y, where: str = "pre", **style) -> list[Line]:
        return [self._line_trace(x, y, shape={"post": "hv", "pre": "vh", "mid": "hvh"}[where], **style)]

    def scatter(self, x, y, label=None, color=None, marker="o", s=20.0, **_) -> None:
        colour = _colour(color) or self._next_patch()
        self._add({"type": "scatter", "mode": "markers", "x": _values(x), "y": _values(y),
                   "marker": {"symbol": MARKERS.get(marker, "circle"), "size": max(4.0, 1.3 * math.sqrt(s)),
                              "color": colour}, "hovertemplate": "%{x:.3g}, %{y:.3g}"}, label)
        self.lines.append(Line(colour, label))

    def errorbar(self, x, y, yerr=None, marker="o", ms=6.0, label=None, color=None, **_) -> None:
        colour = _colour(color) or self._next_line()
        trace = {"type": "scatter", "mode": "lines+markers", "x": _values(x), "y": _values(y),
                 "line": {"color": colour, "width": 1.5},
                 "marker": {"symbol": MARKERS.get(marker, "circle"), "size": 1.6 * ms, "color": colour},
                 "hovertemplate": "%{x}: %{y:.3g}"}
        if yerr is not None:
            lo, hi = np.asarray(yerr, dtype=float)
            trace["error_y"] = {"type": "data", "symmetric": False, "array": _values(hi),
                                "arrayminus": _values(lo), "color": colour, "thickness": 1, "width": 2}
        self._add(trace, label)
        self.lines.append(Line(colour, label))

    def fill_between(self, x, lo, hi, color=None, alpha: float = 0.2, **_) -> None:
        fill = _rgba(_colour(color) or self._next_patch(), alpha)
        self._add({"type": "scatter", "mode": "lines", "x": _values(x), "y": _values(lo), "hoverinfo": "skip",
                   "line": {"width": 0}})
        self._add({"type": "scatter", "mode": "lines", "x": _values(x), "y": _values(hi), "hoverinfo": "skip",
                   "line": {"width": 0}, "fill": "tonexty", "fillcolor": fill})

    def vlines(self, x, ymin, ymax, color=None, lw: float = 1.0, **_) -> None:
        xs, ys = [], []
        for a, lo, hi in zip(_values(x), _values(ymin), _values(ymax), strict=True):
            xs += [a, a, None]
            ys += [lo, hi, None]
        self._add({"type": "scatter", "mode": "lines", "x": xs, "y": ys, "hoverinfo": "skip",
                   "line": {"color": _colour(color), "width": lw}})

    def bar(self, x, height, width: float = 0.8, bottom=None, color=None, label=None, hovertext=None,
            customdata=None, **_) -> None:
        trace = {"type": "bar", "x": _values(x), "y": _values(height), "width": width,
                 "marker": {"color": _colour(color) or self._next_patch()}, "hovertemplate": "%{x}: %{y:.3g}"}
        if bottom is not None:
            trace["base"] = _values(bottom)
        if hovertext is not None:
            trace["hovertext"], trace["hovertemplate"] = list(hovertext), "%{hovertext}<extra></extra>"
        if customdata is not None:
            trace["customdata"] = list(customdata)
        self._add(trace, label)
        self.figure.layout["barmode"] = "overlay"

    def imshow(self, values, cmap=None, vmin=None, vmax=None, origin: str = "upper", **_) -> _Image:
        if hasattr(values, "save"):  # a PIL image: drawn as itself
            buffer = io.BytesIO()
            values.save(buffer, format="PNG")
            source = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
            trace = self._add({"type": "image", "source": source, "hoverinfo": "skip"})
            self.yaxis["autorange"] = "reversed"
            return _Image(trace, self)
        z = _matrix(values)
        trace: dict = {"type": "heatmap", "z": [[None if v is None else float(v) for v in row] for row in z],
                       "showscale": False, "hovertemplate": "%{x}, %{y}: %{z:.3g}<extra></extra>"}
        if isinstance(cmap, ListedColormap):
            n = len(cmap.colours)
            trace["colorscale"] = [[i / max(1, n - 1), c] for i, c in enumerate(cmap.colours)]
        else:
            trace["colorscale"] = SCALES.get(cmap or "viridis", "Viridis")
        if vmin is not None:
            trace["zmin"] = float(vmin)
        if vmax is not None:
            trace["zmax"] = float(vmax)
        self._add(trace)
        if origin != "lower":
            self.yaxis["autorange"] = "reversed"
        return _Image(trace, self)

    def axhline(self, y, color=None, ls="-", lw: float = 1.0, **_) -> None:
        self.figure.layout["shapes"].append({
            "type": "line", "xref": f"{self.xref} domain", "x0": 0, "x1": 1, "yref": self.yref, "y0": float(y),
            "y1": float(y), "line": {"color": _colour(color) or "black", "width": lw,
                                     "dash": DASHES.get(ls, "solid")}})

    def axvspan(self, x0, x1, color=None, alpha: float = 1.0, **_) -> None:
        self.figure.layout["shapes"].append({
            "type": "rect", "xref": self.xref, "x0": float(x0), "x1": float(x1), "yref": f"{self.yref} domain",
            "y0": 0, "y1": 1, "fillcolor": _colour(color), "opacity": alpha, "line": {"width": 0}, "layer": "below"})

    def add_patch(self, patch: Rectangle) -> None:
        (x, y), w, h = patch.xy, patch.width, patch.height
        self.figure.layout["shapes"].append({
            "type": "rect", "xref": self.xref, "yref": self.yref, "x0": x, "x1": x + w, "y0": y, "y1": y + h,
            "line": {"color": _colour(patch.color) or "black", "width": patch.lw}})

    def text(self, x, y, s: str, transform=None, fontsize: float = 10, rotation: float = 0, **_) -> None:
        axes_relative = transform is not None
        self.figure.layout["annotations"].append({
            "x": x, "y": y, "text": html.escape(str(s)).replace("\n", "<br>"), "showarrow": False,
            "xref": f"{self.xref} domain" if axes_relative else self.xref,
            "yref": f"{self.yref} domain" if axes_relative else self.yref,
            "xanchor": "center", "font": {"size": fontsize * 1.3}, "textangle": -rotation})

    @property
    def transAxes(self) -> str:  # noqa: N802 - matplotlib's name
        return "axes"

    def set_title(self, title: str, **_) -> None:
        self.title = title

    def set_xlabel(self, label: str, **_) -> None:
        self.xaxis["title"] = {"text": label}

    def set_ylabel(self, label: str, **_) -> None:
        self.yaxis["title"] = {"text": label}

    @staticmethod
    def _ticks(axis: dict, ticks, labels=None, rotation: float = 0, **_) -> None:
        ticks = _values(list(ticks))
        if not ticks:
            axis["showticklabels"] = False
            axis["ticks"] = ""
            return
        axis["tickmode"] = "array"
        axis["tickvals"] = ticks
        axis["ticktext"] = [str(t) for t in (labels if labels is not None else ticks)]
        if rotation:
            axis["tickangle"] = -rotation

    def set_xticks(self, ticks, labels=None, **style) -> None:
        self._ticks(self.xaxis, ticks, labels, **style)

    def set_yticks(self, ticks, labels=None, **style) -> None:
        self._ticks(self.yaxis, ticks, labels, **style)

    def set_xlim(self, lo, hi=None) -> None:
        self.xaxis["range"] = [lo, hi]

    def set_ylim(self, lo, hi=None) -> None:
        self.yaxis["range"] = [lo, hi]
        for other in self.figure.shared_y(self):
            other.yaxis["range"] = [lo, hi]

    def tick_params(self, **_) -> None:
        pass

    def axis(self, state: str) -> None:
        if state == "off":
            for axis in (self.xaxis, self.yaxis):
                axis.update(visible=False, showline=False)

    def get_lines(self) -> list[Line]:
        return list(self.lines)

    def get_legend_handles_labels(self) -> tuple[list[Line], list[str]]:
        shown = [line for line in self.lines if line.label and not str(line.label).startswith("_")]
        return shown, [str(line.label) for line in shown]

    def legend(self, handles: Sequence[Line] | None = None, **_) -> None:
        self.legend_shown = True
        for handle in handles or []:
            if isinstance(handle, Handle):  # a style key: a legend entry with no data
                symbol = MARKERS.get(handle.marker)
                self._add({"type": "scatter", "x": [None], "y": [None],
                           "mode": "lines+markers" if symbol else "lines",
                           "line": {"color": handle.colour, "dash": DASHES.get(handle.ls, "solid"),
                                    "width": handle.lw},
                           "marker": {"symbol": symbol or "circle", "size": 1.6 * handle.ms,
                                      "color": handle.colour}}, handle.label)


class Rectangle:
    """matplotlib.patches.Rectangle's part the report uses (a box drawn on an axes)."""

    def __init__(self, xy, width, height, fill: bool = True, lw: float = 1.0, color=None):
        self.xy, self.width, self.height, self.fill, self.lw, self.color = xy, width, height, fill, lw, color


def _text_px(text: str, size: float = 11.0) -> float:
    """About how wide a line of text is, in CSS pixels (Plotly is laid out here, not measured in the browser)."""
    return 0.6 * size * max((len(line) for line in str(text).split("\n")), default=0)


GLYPHS = {"circle": "\u25cf", "square": "\u25a0", "diamond": "\u25c6", "star": "\u2605", "x": "\u2715",
          "circle-open": "\u25cb", "square-open": "\u25a1", "diamond-open": "\u25c7", "star-open": "\u2606",
          "x-open": "\u2715"}  # a marker symbol as a character of the HTML legend
CSS_DASHES = {"solid": "solid", "dash": "dashed", "dot": "dotted", "dashdot": "dashed"}


def _legend_key(trace: dict) -> dict:
    """A trace's legend entry for the page's HTML legend: its name, the group a click shows or hides, and its key
    (a bar's colour, or a line's colour, dash and width and/or a marker's character)."""
    key: dict = {"name": trace["name"], "group": trace.get("legendgroup", trace["name"])}
    if trace["type"] == "bar":
        key["bar"] = trace["marker"]["color"]
        return key
    mode, line, marker = trace.get("mode", "lines"), trace.get("line", {}), trace.get("marker", {})
    if "lines" in mode and line.get("width", 1) > 0:
        key["line"] = [line.get("color"), CSS_DASHES.get(line.get("dash", "solid"), "solid"), line.get("width", 2)]
    if "markers" in mode and marker.get("symbol") in GLYPHS:
        key["marker"] = [marker.get("color"), GLYPHS[marker["symbol"]]]
    return key


class Figure:
    """A Plotly figure of one or more subplots, laid out in pixels as matplotlib's `subplots` grid with
    tight_layout would be: each gap as wide as the tick labels, titles and colour bars in it."""

    def __init__(self, figsize: tuple[float, float]):
        self.figsize = figsize
        self.data: list[dict] = []
        self.layout: dict = {"shapes": [], "annotations": []}
        self.axes: list[Axes] = []
        self.rows = self.cols = 1
        self._shared: list[list[Axes]] = []

    def shared_y(self, ax: Axes) -> list[Axes]:
        return next((group for group in self._shared if ax in group), [])

    def grid(self, rows: int, cols: int, sharey: bool = False) -> list[list[Axes]]:
        self.rows, self.cols = rows, cols
        grid = []
        for r in range(rows):
            row = []
            for c in range(cols):
                ax = Axes(self, len(self.axes) + 1, r, c)
                self.axes.append(ax)
                row.append(ax)
            grid.append(row)
        if sharey:
            group = [ax for row in grid for ax in row]
            for ax in group[1:]:
                ax.yaxis["matches"] = group[0].yref
                ax.yaxis["showticklabels"] = False
            self._shared.append(group)
        return grid

    def colorbar(self, image: _Image, ax: Axes | None = None, label: str | None = None, **_) -> _Colorbar:
        owner = ax or image.ax
        image.trace["showscale"] = True
        image.trace["colorbar"] = {"thickness": 12, "xanchor": "left", "yanchor": "middle", "outlinewidth": 0,
                                   "ticklabeloverflow": "allow"}
        owner.colorbars.append(image.trace["colorbar"])
        bar = _Colorbar(image.trace)
        if label:
            bar.set_label(label)
        return bar

    def subplots_adjust(self, **_) -> None:
        pass

    def tight_layout(self) -> None:
        pass

    @staticmethod
    def _labels_width(axis: dict) -> float:
        """How far a y axis's tick labels reach left of it, in pixels (a little more than they do)."""
        if axis.get("visible") is False or axis.get("showticklabels") is False:
            return 0.0
        texts = axis.get("ticktext") or ["0.00"]
        return max(_text_px(t, TICK_FONT) for t in texts) + 8

    @staticmethod
    def _labels_height(axis: dict) -> float:
        """How far an x axis's tick labels reach below it, in pixels (a little more than they do)."""
        if axis.get("visible") is False:
            return 0.0
        if axis.get("showticklabels") is False:
            return 6.0
        texts = axis.get("ticktext") or ["0"]
        if abs(axis.get("tickangle", 0)) >= 45:
            return max(_text_px(t, TICK_FONT) for t in texts) + 10
        return 1.3 * TICK_FONT * max(1 + str(t).count("\n") for t in texts) + 9

    def _tick_width(self, axis: dict) -> float:
        return self._labels_width(axis) + (TITLE_PX if axis.get("title") else 0)

    def _tick_height(self, axis: dict) -> float:
        return self._labels_height(axis) + (TITLE_PX if axis.get("title") else 0)

    def _labels(self, ax: Axes, left: float, right: float, top: float, bottom: float) -> list[dict]:
        """The subplot's title and its axes' titles, beyond their tick labels, as the page's HTML labels placed in
        the plot's pixels (the subplot spans left..right, top..bottom): plotly.js would measure every tick label
        (twice) to place an axis title, and draw each of its annotations twice, measured."""
        out = []
        if ax.xaxis.get("title") and ax.xaxis.get("visible") is not False:
            out.append({"text": ax.xaxis["title"]["text"], "axis": ax.xref, "at": "top", "size": TITLE_FONT,
                        "x": round((left + right) / 2, 1), "y": round(bottom + self._labels_height(ax.xaxis), 1)})
        if ax.yaxis.get("title") and ax.yaxis.get("visible") is not False:
            out.append({"text": ax.yaxis["title"]["text"], "axis": ax.yref, "at": "left", "size": TITLE_FONT,
                        "x": round(left - self._labels_width(ax.yaxis) - 0.6 * TITLE_FONT, 1),
                        "y": round((top + bottom) / 2, 1)})
        if ax.title:
            out.append({"text": ax.title, "at": "bottom", "size": 12.0, "x": round((left + right) / 2, 1),
                        "y": round(top - 3, 1)})
        return out

    def spec(self) -> dict:
        """The figure as Plotly's {data, layout}: its size in CSS pixels and every subplot's place in it."""
        axes = self.axes
        legend = [t for t in self.data if t.get("showlegend")]
        on = {ax.xref for ax in axes if ax.legend_shown}
        seen = set()
        for trace in legend:  # matplotlib's legend: the entries of the axes it is called on, each label once
            trace["showlegend"] = trace["xaxis"] in on and trace["name"] not in seen
            if trace["showlegend"]:
                seen.add(trace["name"])
        entries = [t["name"] for t in legend if t["showlegend"]]
        legend_w = (max(_text_px(e, 10) for e in entries) + 50) if entries else 0.0
        in_col = [[ax for ax in axes if ax.col == c] for c in range(self.cols)]
        in_row = [[ax for ax in axes if ax.row == r] for r in range(self.rows)]
        y_w = [max(self._tick_width(ax.yaxis) for ax in col) for col in in_col]
        bar_w = [max((90 if ax.colorbars else 0) for ax in col) for col in in_col]
        x_h = [max(self._tick_height(ax.xaxis) for ax in row) for row in in_row]
        title_h = [max((16 * (1 + ax.title.count("\n")) + 6 if ax.title else 0) for ax in row) for row in in_row]
        left, right = y_w[0] + 12, bar_w[-1] + legend_w + 12
        top, bottom = title_h[0] + 8, x_h[-1] + 10
        gaps_x = [bar_w[c] + y_w[c + 1] + 16 for c in range(self.cols - 1)]
        gaps_y = [x_h[r] + title_h[r + 1] + 12 for r in range(self.rows - 1)]
        width = float(min(PAGE_PX, round(self.figsize[0] * PX_PER_INCH + legend_w)))
        inner_w = max(60.0 * self.cols, width - left - right - sum(gaps_x))
        width = left + right + sum(gaps_x) + inner_w
        inner_h = max(90.0 * self.rows, self.figsize[1] * PX_PER_INCH - 70 * self.rows)
        height = top + bottom + sum(gaps_y) + inner_h
        plot_w, plot_h = width - left - right, height - top - bottom
        col_w, row_h = inner_w / self.cols, inner_h / self.rows
        layout, labels = dict(self.layout), []
        for ax in axes:
            x0 = sum(gaps_x[: ax.col]) + ax.col * col_w
            y1 = plot_h - sum(gaps_y[: ax.row]) - ax.row * row_h
            ax.xaxis["domain"] = [x0 / plot_w, (x0 + col_w) / plot_w]
            ax.yaxis["domain"] = [(y1 - row_h) / plot_h, y1 / plot_h]
            for bar in ax.colorbars:
                bar.update(x=(x0 + col_w + 8) / plot_w, y=(y1 - row_h / 2) / plot_h, len=0.9 * row_h / plot_h)
            suffix = "" if ax.index == 1 else str(ax.index)
            layout[f"xaxis{suffix}"], layout[f"yaxis{suffix}"] = (
                {k: v for k, v in axis.items() if k != "title"} for axis in (ax.xaxis, ax.yaxis))
            labels += self._labels(ax, left + x0, left + x0 + col_w, top + plot_h - y1, top + plot_h - y1 + row_h)
        layout.update(width=round(width), height=round(height), paper_bgcolor="white", plot_bgcolor="white",
                      font={"size": TICK_FONT}, showlegend=False, hovermode="closest",
                      margin={"l": left, "r": right, "t": top, "b": bottom, "autoexpand": False})
        spec = {"data": self.data, "layout": layout, "labels": labels}
        if entries:  # drawn by the page as HTML beside the plot (see PAGE_SCRIPT), at plotly.js's legend's place
            spec["legend"] = {"left": round(left + plot_w + bar_w[-1] + 6), "top": round(top),
                              "keys": [_legend_key(t) for t in legend if t["showlegend"]]}
        return spec


class _Pyplot:
    """`figs.plt`: the pyplot functions the report calls."""

    Rectangle = Rectangle

    def subplots(self, nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (6.4, 4.8),
                 squeeze: bool = True, sharey: bool = False):
        fig = Figure(figsize)
        grid = fig.grid(nrows, ncols, sharey)
        axes = np.empty((nrows, ncols), dtype=object)
        for r, row in enumerate(grid):
            for c, ax in enumerate(row):
                axes[r, c] = ax
        if not squeeze:
            return fig, axes
        if nrows == ncols == 1:
            return fig, axes[0, 0]
        return fig, axes.ravel()


class PlotlyFigures:
    """The report's figure saver for the page: each figure becomes a <figure> whose plot the browser draws from
    the Plotly spec embedded beside it. `saved` lists no files (the page is self-contained)."""

    interactive = True

    def __init__(self):
        self.plt, self.saved, self.count = _Pyplot(), [], 0

    @staticmethod
    def colormap(colours: Sequence[str]) -> ListedColormap:
        return ListedColormap(colours)

    @staticmethod
    def handle(**style) -> Handle:
        return Handle(colour=style.pop("color", None), **style)

    def save(self, fig: Figure, name: str, caption: str, tight: bool = True) -> str:
        self.count += 1
        figure = fig.spec()
        spec = json.dumps(figure, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
        # sized before it is drawn: the page is laid out once, and the first screen does not move as plots draw
        size = f"width:{figure['layout']['width']}px;height:{figure['layout']['height']}px"
        return (f"<figure><div class='plot' id='plot-{self.count}' data-name='{html.escape(name)}' "
                f"style='{size}' role='img' aria-label='{html.escape(caption)}'></div>"
                f"<script type='application/json' class='plot-spec'>{spec}</script>"
                f"<figcaption>{html.escape(caption)}</figcaption></figure>")


# Draws every embedded spec, top first, yielding to the browser every 50 ms so that the first screen shows before
# the rest is drawn (and a reader can scroll meanwhile); body[data-plots-drawn] is set once all are. A bar that
# carries the ids of the images it counts lists them on a click, each a link to its per-image timeline where the
# page has one.
PAGE_SCRIPT = """
(function () {
  function legend(div, spec) {  // each key shows or hides its group's traces on a click, as plotly.js's would
    var box = document.createElement('div');
    box.className = 'legend';
    box.style.left = spec.legend.left + 'px';
    box.style.top = spec.legend.top + 'px';
    spec.legend.keys.forEach(function (key) {
      var item = document.createElement('div'), swatch = document.createElement('span');
      item.className = 'key';
      swatch.className = 'swatch';
      if (key.bar) { var bar = document.createElement('i'); bar.className = 'bar'; bar.style.background = key.bar;
                     swatch.append(bar); }
      if (key.line) { var line = document.createElement('i'); swatch.append(line);
                      line.style.borderTop = key.line[2] + 'px ' + key.line[1] + ' ' + key.line[0]; }
      if (key.marker) { var mark = document.createElement('b'); mark.style.color = key.marker[0];
                        mark.textContent = key.marker[1]; swatch.append(mark); }
      item.append(swatch, key.name);
      item.addEventListener('click', function () {
        var hidden = item.classList.toggle('off'), traces = [];
        spec.data.forEach(function (t, i) { if ((t.legendgroup || t.name) === key.group) traces.push(i); });
        Plotly.restyle(div, {visible: hidden ? 'legendonly' : true}, traces);
      });
      box.append(item);
    });
    div.append(box);
  }
  function labels(div, spec) {  // titles of subplots and axes, placed in Python (Figure.spec)
    spec.labels.forEach(function (label) {
      var text = document.createElement('div');
      text.className = 'label ' + label.at;
      text.textContent = label.text;
      text.style.left = label.x + 'px';
      text.style.top = label.y + 'px';
      text.style.fontSize = label.size + 'px';
      if (label.axis) text.dataset.axis = label.axis;
      div.append(text);
    });
  }
  function drawOne(div) {
      var spec = JSON.parse(div.nextElementSibling.textContent);
      Plotly.newPlot(div, spec.data, spec.layout, {displaylogo: false, responsive: false, displayModeBar: false,
        modeBarButtonsToRemove: ['select2d', 'lasso2d']});
      if (spec.legend) legend(div, spec);
      labels(div, spec);
      div.on('plotly_click', function (event) {
        var point = event.points[0];
        if (!point || !point.customdata) return;
        var box = div.parentNode.querySelector('.bar-images');
        if (!box) { box = document.createElement('p'); box.className = 'bar-images'; div.after(box); }
        var ids = point.customdata[1], more = point.customdata[0] - ids.length;
        box.innerHTML = '';
        box.append(point.data.name + ' at ' + point.x + ' (' + point.customdata[0] + ' images): ');
        ids.forEach(function (id) {
          var target = document.getElementById('image-' + id);
          var item = document.createElement(target ? 'a' : 'span');
          if (target) item.href = '#image-' + id;
          item.textContent = id;
          box.append(item, ' ');
        });
        if (more > 0) box.append('and ' + more + ' more (featstore sql: decision_layers)');
      });
  }
  function draw() {
    var start = performance.now(), divs = document.querySelectorAll('div.plot'), i = 0;
    var channel = new MessageChannel();  // yields without setTimeout's 4 ms clamp on nested timers
    function next() {
      var until = performance.now() + 50;
      while (i < divs.length && performance.now() < until) drawOne(divs[i++]);
      if (i < divs.length) { channel.port2.postMessage(0); return; }
      document.body.dataset.plotsDrawn = divs.length;
      document.body.dataset.drawMs = Math.round(performance.now() - start);
    }
    channel.port1.onmessage = next;
    next();
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', draw); else draw();
})();
"""


def page_scripts() -> str:
    """The page's <script> elements: plotly.js inlined, then the code that draws every figure."""
    return (f"<script>{plotly_script()}</script>"
            f"<script>{PAGE_SCRIPT}</script>")
