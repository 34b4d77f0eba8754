"""The report's building blocks that every section uses: HTML tables in their own scrolling box, and the
publication-figure saver (matplotlib, on request). `report.py` and `report_readouts.py` both draw with these, so
neither imports the other's module to get them."""

from __future__ import annotations

import html
import re
from pathlib import Path

import polars as pl

PAGE_PX = 1100  # the body's width in CSS pixels


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def _table(frame: pl.DataFrame, digits: int = 3, cls: str = "") -> str:
    """An HTML table inside its own horizontally scrolling box, so a wide one never widens the page."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    rows = []
    for row in frame.iter_rows():
        cells = []
        for v in row:
            text = f"{v:.{digits}f}" if isinstance(v, float) else ("" if v is None else str(v))
            cells.append(f"<td>{html.escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    attr = f" class='{cls}'" if cls else ""
    body = "".join(rows)
    return f"<div class='scroll'><table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


class _Figures:
    """Draws each figure with matplotlib and saves it in `out` as `fmt` (png, svg or pdf): the publication figures
    beside the page, asked for with `--figures`. The page itself draws its plots from data
    (`report_plots.PlotlyFigures`); what `save` returns is the file's <figure> for a page of its own."""

    interactive = False

    def __init__(self, out: Path, fmt: str = "png"):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        # text sizes in points; save() keeps every PNG within the page's width, so 9 pt is >= 10 px on screen
        plt.rcParams.update({"font.size": 10, "xtick.labelsize": 9, "ytick.labelsize": 9, "legend.fontsize": 9,
                             "axes.titlesize": 10, "svg.hashsalt": "featstore", "pdf.compression": 6})
        self.plt, self.out, self.fmt, self.saved = plt, out, fmt, []

    @staticmethod
    def colormap(colours: list[str]):
        from matplotlib.colors import ListedColormap

        return ListedColormap(colours)

    @staticmethod
    def handle(**style):
        """A legend entry with no data (a style key)."""
        from matplotlib.lines import Line2D

        return Line2D([], [], **style)

    def save(self, fig, name: str, caption: str, tight: bool = True) -> str:
        path = self.out / f"{_slug(name)}.{self.fmt}"
        if tight:
            fig.tight_layout()
        fig.savefig(path, dpi=min(110.0, PAGE_PX / fig.get_figwidth()))  # shown 1:1, never scaled down
        self.plt.close(fig)
        self.saved.append(path)
        return (f'<figure><img alt="{html.escape(caption)}" src="{html.escape(path.name)}">'
                f"<figcaption>{html.escape(caption)} ({path.name})</figcaption></figure>")
