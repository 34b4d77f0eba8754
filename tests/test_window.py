"""The window said everywhere: a stable l*(k) is at most T - k, so at a k where T - k < 0.7T "late" can only be
"never stable". The sweep's flag and its window-aware band (thirds of T - k, never-stable images apart) equal a plain
loop over the stored predictions; `timeline`, the report's tables, captions and per-image timelines say so, and a
never-stable run carries no decision marker."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from synthetic import run_rows, settling_timelines, toy_database

from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.errors import FeatstoreError

from conftest import fails, run_cli

N, T = 300, 9  # 10 anchors: late starts at anchor 7 (>= 0.7T), so from k = 3 on no stable l* can be late
LINEAR, PAPER = "m/clean/linear", "m/clean/paper"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two runs of one model whose timelines settle on the head's answer at a random anchor (or never)."""
    db = tmp_path_factory.mktemp("window") / "f.duckdb"
    toy = toy_database(db, N, T + 1, seed=11)
    ids, preds = np.arange(N), {}
    for run_id, probe in ((LINEAR, "linear"), (PAPER, "paper")):
        pred = settling_timelines(toy.rng, toy.head, T + 1, T + 2)
        conf = toy.rng.uniform(0.2, 1.0, pred.shape).astype(np.float32)
        fsdb.write_runs(toy.con, [run_rows({"run_id": run_id, "model": "m", "view": "clean", "probe": probe}, ids,
                                           pred, conf)])
        preds[run_id] = pred
    fsdb.replace_model_outputs(toy.con, "m", "clean", ids, toy.head, np.full(N, 0.9))
    toy.con.close()
    return SimpleNamespace(db=db, split=toy.split, labels=toy.labels, preds=preds)


# -- independent computations: plain loops over the predictions ---------------------------------------------------


def stable_layer(timeline, k: int) -> int | None:
    """l*(k) of one timeline: the first l whose predictions l..l+k are equal; None when there is none."""
    return next((j for j in range(T - k + 1) if len(set(timeline[j : j + k + 1])) == 1), None)


def paper_band(layer: int | None) -> str:
    at = T if layer is None else layer  # a never-stable image counts at T
    return "early" if at < 0.3 * T else "late" if at >= 0.7 * T else "mid"


def window_band(layer: int | None, k: int) -> str:
    """Thirds of the anchors 0..T-k a stable l*(k) can take; a never-stable image in none."""
    if layer is None:
        return "never"
    return "early" if layer < 0.3 * (T - k) else "late" if layer >= 0.7 * (T - k) else "mid"


def loop_sweep(world, run_id: str, k: int) -> dict:
    test = world.split == "test"
    layers = [stable_layer(t, k) for t in world.preds[run_id][test].tolist()]
    out = {"n": len(layers), "never_stable": np.mean([la is None for la in layers]),
           "late_is_never_stable": not any(la >= 0.7 * T for la in range(T - k + 1))}
    for band in ("early", "mid", "late"):
        out[f"paper_{band}"] = np.mean([paper_band(la) == band for la in layers])
        out[f"window_{band}"] = np.mean([window_band(la, k) == band for la in layers])
    return out


# -- the sweep ------------------------------------------------------------------------------------------------------


def test_the_sweep_in_both_bands_and_its_window_flag_equal_a_plain_loop(world):
    ks = list(range(1, T + 1))
    paper = q.k_sweep(world.db, ks, band="paper")
    window = q.k_sweep(world.db, ks, band="window")
    flags = []
    for run_id in (LINEAR, PAPER):
        for k in ks:
            ref = loop_sweep(world, run_id, k)
            p = paper.filter((pl.col("run_id") == run_id) & (pl.col("k") == k)).row(0, named=True)
            w = window.filter((pl.col("run_id") == run_id) & (pl.col("k") == k)).row(0, named=True)
            assert p["n"] == w["n"] == ref["n"]
            for band in ("early", "mid", "late"):
                assert p[f"f_{band}"] == pytest.approx(ref[f"paper_{band}"], abs=1e-12), (run_id, k, band)
                assert w[f"f_{band}"] == pytest.approx(ref[f"window_{band}"], abs=1e-12), (run_id, k, band)
            assert p["never_stable"] == w["never_stable"] == pytest.approx(ref["never_stable"], abs=1e-12)
            assert w["f_early"] + w["f_mid"] + w["f_late"] + w["never_stable"] == pytest.approx(1)
            assert p["late_is_never_stable"] == ref["late_is_never_stable"] and not w["late_is_never_stable"]
            if ref["late_is_never_stable"]:
                assert p["f_late"] == pytest.approx(p["never_stable"])  # what the flag warns of
            flags.append(ref["late_is_never_stable"])
    assert any(flags) and not all(flags)  # the data has both kinds of k
    assert q.decision_summary(world.db, 3, band="window")["f_late"].to_list() == window.filter(
        pl.col("k") == 3).sort("run_id")["f_late"].to_list()


def test_an_unknown_band_is_refused_in_one_line(world):
    with pytest.raises(FeatstoreError, match="band='windows': must be one of 'paper', 'window'"):
        q.k_sweep(world.db, band="windows")
    with pytest.raises(FeatstoreError, match="band 'thirds': use paper or window"):
        q.query(world.db, "SELECT * FROM decision_sweep(2, band := 'thirds')")
    assert "'thirds' is not one of 'paper', 'window'" in fails("timeline", "--db", world.db, "--band", "thirds")


def test_timeline_prints_the_window_note_and_the_window_band(world):
    text = run_cli("timeline", "--db", world.db, "--k", "1,2,3,4").output
    notes = [line for line in text.splitlines() if line.startswith("note:")]
    assert [n.split(" with ")[0] for n in notes] == ["note: at k = 3", "note: at k = 4"]  # k <= 2: late is possible
    assert "late = never stable" in notes[0] and "late_is_never_stable" in text
    csv = run_cli("timeline", "--db", world.db, "--k", "3", "--band", "window", "--format", "csv").stdout
    got = pl.read_csv(csv.encode())
    for run_id in (LINEAR, PAPER):
        row = got.filter(pl.col("run_id") == run_id).row(0, named=True)
        ref = loop_sweep(world, run_id, 3)
        assert row["f_late"] == pytest.approx(ref["window_late"], abs=1e-12) and not row["late_is_never_stable"]
    assert "note:" not in run_cli("timeline", "--db", world.db, "--k", "3", "--band", "window").output


def test_a_never_stable_timeline_has_no_decision_marker(world):
    """`timeline --image`: the run in which the image never settles is headed so and carries no ◆; the other marks
    its l*(2), both found by the plain loop."""
    test_ids = np.flatnonzero(world.split == "test")
    image = next(int(i) for i in test_ids if stable_layer(world.preds[LINEAR][i].tolist(), 2) is None
                 and stable_layer(world.preds[PAPER][i].tolist(), 2) is not None)
    text = run_cli("timeline", "--db", world.db, "--image", str(image), "--k", "2").output
    assert "linear on clean (never stable)" in text and "paper on clean (never stable)" not in text
    from featstore.analytics.report import image_timeline, image_timeline_table

    frame = image_timeline(world.db, image, 2)
    decided = frame.filter(pl.col("decided")).select("run_id", "anchor").rows()
    assert decided == [(PAPER, stable_layer(world.preds[PAPER][image].tolist(), 2))]  # none in the never-stable run
    table = image_timeline_table(frame)
    never, settled = table["linear on clean (never stable)"].to_list(), table["paper on clean"].to_list()
    assert not any(cell.startswith("◆") for cell in never)
    assert [a for a, cell in enumerate(settled) if cell.startswith("◆")] == [
        stable_layer(world.preds[PAPER][image].tolist(), 2)]


# -- the report -----------------------------------------------------------------------------------------------------


class Page(HTMLParser):
    """The report's tables (each with the last heading before it: rows of cell texts, the header first), figure
    captions, paragraphs, link targets and element ids."""

    def __init__(self, text: str):
        super().__init__()
        self.tables, self.captions, self.paragraphs, self.links, self.ids = [], [], [], [], []
        self.heading, self._text, self._row, self._table = "", [], None, None
        self.specs = {}  # each plot's name -> its embedded Plotly spec (the page draws it in the browser)
        self.feed(text)
        for name, spec in re.findall(r"<div class='plot' id='plot-\d+' data-name='([^']*)'.*?"
                                     r"<script type='application/json' class='plot-spec'>(.*?)</script>", text):
            self.specs[html.unescape(name)] = json.loads(spec.replace("<\\/", "</"))

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.append(attrs["id"])
        if tag == "a" and "href" in attrs:
            self.links.append(attrs["href"])
        if tag in ("h2", "h3", "figcaption", "td", "th", "p"):
            self._text = []
        if tag == "table":
            self._table = SimpleNamespace(heading=self.heading, rows=[])
        if tag == "tr":
            self._row = []

    def handle_data(self, data):
        self._text.append(data)

    def handle_endtag(self, tag):
        text = "".join(self._text).strip()
        if tag in ("h2", "h3"):
            self.heading = text
        elif tag == "figcaption":
            self.captions.append(text)
        elif tag == "p":
            self.paragraphs.append(text)
        elif tag in ("td", "th") and self._row is not None:
            self._row.append(text)
        elif tag == "tr" and self._table is not None:
            self._table.rows.append(self._row)
            self._row = None
        elif tag == "table" and self._table is not None:
            self.tables.append(self._table)
            self._table = None

    def table(self, heading: str) -> list[dict]:
        """The rows (as dicts) of the first table whose heading starts with `heading`."""
        found = next(t for t in self.tables if t.heading.startswith(heading))
        return [dict(zip(found.rows[0], row, strict=True)) for row in found.rows[1:]]


@pytest.fixture(scope="module")
def page(world, tmp_path_factory):
    from featstore.analytics.report import write_report

    return Page(write_report(world.db, tmp_path_factory.mktemp("report") / "r", ks=[1, 2, 3, 4]).read_text())


def test_the_reports_tables_and_captions_say_where_late_is_never_stable(world, page):
    sweep = page.table("k-sweep")
    for row in sweep:
        ref = loop_sweep(world, row["run_id"], int(row["k"]))
        assert row["late_is_never_stable"] == str(ref["late_is_never_stable"])
        assert float(row["f_late"]) == pytest.approx(ref["paper_late"], abs=5e-4)
    notes = [p for p in page.paragraphs if p.startswith("Note: at k =")]
    assert {n.split(" with ")[0] for n in notes} == {"Note: at k = 3", "Note: at k = 4"}
    for row in page.table("The same sweep in the window-aware band"):
        ref = loop_sweep(world, row["run_id"], int(row["k"]))
        for band in ("early", "mid", "late"):
            assert float(row[f"f_{band}"]) == pytest.approx(ref[f"window_{band}"], abs=5e-4)
    for run_id in (LINEAR, PAPER):
        for figure in ("Decision-layer histograms", "Sensitivity to the stability window k"):
            caption = next(c for c in page.captions if c.startswith(f"{figure} of {run_id}"))
            assert "at k = 3, 4 late = never stable" in caption, caption


def test_the_reports_histograms_carry_each_layers_share_and_images(world, page):
    """The data the page draws each histogram from: per k and anchor the share of test images deciding there
    (never-stable ones stacked at T) and the ids a bar's hover names and its click lists, equal to a plain loop."""
    test = [i for i in range(N) if world.split[i] == "test"]
    for run_id in (LINEAR, PAPER):
        spec = page.specs[f"{run_id}_histograms"]
        bars = [t for t in spec["data"] if t["type"] == "bar"]
        assert len(bars) == 2 * 4  # decided and never stable, per k = 1..4
        for i, k in enumerate((1, 2, 3, 4)):
            decided, never = bars[2 * i], bars[2 * i + 1]
            layers = {j: stable_layer(world.preds[run_id][j].tolist(), k) for j in test}
            for anchor in range(T + 1):
                ids = sorted(j for j in test if layers[j] == anchor)
                never_ids = sorted(j for j in test if layers[j] is None) if anchor == T else []
                assert decided["y"][anchor] == pytest.approx(len(ids) / len(test))
                assert never["y"][anchor] == pytest.approx(len(never_ids) / len(test))
                assert decided["customdata"][anchor] == [len(ids), ids[:200]]
                assert never["customdata"][anchor] == [len(never_ids), never_ids[:200]]
                if ids:
                    assert f"l* = {anchor} " in decided["hovertext"][anchor]
                    assert "images " + ", ".join(map(str, ids[:12])) in decided["hovertext"][anchor]


def test_an_unknown_figure_format_is_refused_before_anything_is_written(world, tmp_path):
    from featstore.analytics.report import write_report

    with pytest.raises(FeatstoreError, match="figures='gif': choose one of png, svg, pdf"):
        write_report(world.db, tmp_path / "r", figures="gif")
    assert "'gif' is not one of" in fails("report", "--db", world.db, "--out", tmp_path / "r", "--figures", "gif")
    assert not list(tmp_path.iterdir())


def test_the_reports_per_image_timelines_mark_never_stable_runs_apart(world, page):
    """Every per-image timeline of the page: a run column headed 'never stable' exactly where the loop finds no
    l*(2), with no ◆ in it; every other column has its one ◆ at the loop's l*(2)."""
    timelines = [t for t in page.tables if t.heading.startswith("Image ")]
    assert timelines
    never_seen = 0
    for table in timelines:
        image = int(table.heading.split()[1].rstrip(":"))
        header, rows = table.rows[0], table.rows[1:]
        for run_id, probe in ((LINEAR, "linear"), (PAPER, "paper")):
            layer = stable_layer(world.preds[run_id][image].tolist(), 2)
            column = header.index(f"{probe} on clean" + (" (never stable)" if layer is None else ""))
            marked = [int(row[0]) for row in rows if row[column].startswith("◆")]
            assert marked == ([] if layer is None else [layer]), (image, run_id)
            never_seen += layer is None
    assert never_seen  # the gallery's late side shows never-stable images too


def test_the_demos_printed_sweep_says_where_late_is_never_stable(demo):
    """The demo prints a note under its sweep exactly at the k whose late share can only be never stable (found here
    from the anchor count and the plain loop's range of stable layers), and there f_late is the never-stable share."""
    out, text = demo
    runs = q.runs(out / "layouts" / "featstore.duckdb")
    t = int(runs.filter(pl.col("run_id") == "resnet18/clean/linear")["n_anchors"][0]) - 1
    truncated = [k for k in (1, 2, 3, 4) if not any(la >= 0.7 * t for la in range(t - k + 1))]
    notes = [line for line in text.splitlines() if line.startswith("note: ")]
    assert [n.split(" with ")[0] for n in notes] == [f"note: at k = {k}" for k in truncated] and truncated == [4]
    row = next(line for line in text.splitlines() if line.startswith("│ 4 "))
    cells = [c.strip() for c in row.strip("│ ").split("┆")]
    assert cells[5] == cells[6]  # f_late == never_stable
    assert len(text.splitlines()) <= 25
