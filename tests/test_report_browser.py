"""The demo's report in a real browser (headless Chromium through Selenium, 1400 px wide): what a reader sees.

Checked in the page as Chromium lays it out, not in the HTML text: no horizontal overflow, every image decoded,
every plot drawn by plotly.js from its embedded data (an SVG with every trace), no console error, every figure's
caption naming the runs it draws (the run ids read from the database), every plot answering a hover, and a
histogram bar's hover naming the images it counts (found here by a plain loop over the stored predictions).
Skips with one line where Chromium, its driver or Selenium is missing; `.ci/run` installs them. The page's
plotly.js is featstore's own copy, written with no `plotly` package importable (checked without a browser).

Also a script: `python tests/test_report_browser.py REPORT.html OUT_DIR PREFIX` saves the five views (top, the
robustness section, one run section, a Pareto table, a per-image timeline) as PNGs, e.g. to compare two versions
of the report.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

WIDTH, HEIGHT = 1400, 1000


def _chromium() -> tuple[str, str] | None:
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def open_browser():
    """A headless Chromium window of WIDTH x HEIGHT CSS pixels that keeps the page's console log."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={WIDTH},{HEIGHT}", "--force-device-scale-factor=1", "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def load(driver, report: Path) -> None:
    driver.get(report.resolve().as_uri())
    driver.execute_script("document.body.style.zoom = '1'")
    driver.execute_async_script(  # the page draws its plots once it is parsed: wait for that
        "const done = arguments[0]; const check = () => document.body.dataset.plotsDrawn !== undefined ? done(0) :"
        " setTimeout(check, 20); check();")
    # every image decoded (data: URIs load synchronously, but wait for `complete` to be sure)
    driver.execute_async_script(
        "const done = arguments[0]; Promise.all([...document.images].map(i => i.complete ? 0 :"
        " new Promise(r => { i.onload = i.onerror = r; }))).then(() => done(0));")


VIEWS = {  # name -> JS that returns the element to scroll to the top (null: the page's top)
    "top": "return null;",
    "robustness": "return document.getElementById('robustness');",
    "run_section": "return document.querySelector('section.run') ||"
                   " [...document.querySelectorAll('h2')].find(h => h.nextElementSibling &&"
                   " h.nextElementSibling.className === 'headline');",
    "pareto": "return document.querySelector('table.pareto') ||"
              " [...document.querySelectorAll('h3')].find(h => h.textContent.startsWith('Pareto front'));",
    "timeline": "return document.querySelector('section.image-timeline') ||"
                " [...document.querySelectorAll('h2,h3')].find(h => /timeline/i.test(h.textContent));",
}


def shoot(driver, out: Path, prefix: str) -> list[Path]:
    """One viewport screenshot per view in VIEWS (a view the page lacks is skipped)."""
    out.mkdir(parents=True, exist_ok=True)
    saved = []
    for name, find in VIEWS.items():
        element = driver.execute_script(find)
        if element is None and name != "top":
            continue
        driver.execute_script("arguments[0] ? arguments[0].scrollIntoView(true) : window.scrollTo(0, 0);"
                              "window.scrollBy(0, arguments[0] ? -8 : 0);", element)
        path = out / f"{prefix}_{name}.png"
        driver.save_screenshot(str(path))
        saved.append(path)
    return saved


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where the tests save what the browser shows (printed with -s): look at them after a change to the page."""
    return Path(str(tmp_path_factory.mktemp("shots")))


@pytest.fixture(scope="module")
def page(demo):
    if _chromium() is None:
        pytest.skip("no Chromium with chromedriver here (apt-get install chromium chromium-driver)")
    pytest.importorskip("selenium", reason="selenium is not installed (pip install -e '.[dev]')")
    out, _ = demo
    report = out / "layouts" / "report" / "report.html"
    driver = open_browser()
    try:
        load(driver, report)
        yield driver, out / "layouts"
    finally:
        driver.quit()


def test_the_page_inlines_plotly_js_without_the_plotly_package(monkeypatch):
    """The page's plotly.js is the cartesian bundle shipped in featstore (analytics/assets/, beside its MIT
    licence), written into the page with no `plotly` Python package importable."""
    from featstore.analytics import report_plots

    monkeypatch.setitem(sys.modules, "plotly", None)  # `import plotly` raises ImportError
    report_plots.plotly_script.cache_clear()
    try:
        scripts = report_plots.page_scripts()
    finally:
        report_plots.plotly_script.cache_clear()
    assets = Path(report_plots.__file__).parent / "assets"
    bundle = (assets / "plotly-cartesian.min.js").read_text(encoding="utf-8")
    assert scripts.startswith(f"<script>{bundle}</script>")
    assert bundle.startswith("/**\n* plotly.js (cartesian - minified)") and "Licensed under the MIT license" in bundle
    assert (assets / "plotly.js-LICENSE").read_text().startswith("MIT License")


def test_the_report_fits_1400_px_and_every_image_loads(page, shots):
    driver, home = page
    sizes = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth,"
                                  " document.documentElement.scrollHeight]")
    wide = driver.execute_script(
        "return [...document.body.querySelectorAll('*')].filter(e => e.getBoundingClientRect().right >"
        " window.innerWidth + 0.5 && !e.closest('.scroll')).map(e => e.tagName + '.' + e.className).slice(0, 5)")
    print(f"page {sizes[0]} x {sizes[2]} px in a {sizes[1]} px window; sticking out: {wide}")
    assert sizes[0] <= sizes[1], f"horizontal overflow: page {sizes[0]} px wide in {sizes[1]} px ({wide})"
    assert not wide, wide
    images = driver.execute_script("return [...document.images].map(i => [i.alt, i.complete, i.naturalWidth])")
    assert images, "the report has no image"
    broken = [alt for alt, complete, width in images if not complete or width == 0]
    assert not broken, f"{len(broken)} image(s) not decoded: {broken[:3]}"
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    driver.set_window_size(WIDTH, min(int(sizes[2]) + 200, 16384))
    driver.save_screenshot(str(shots / "report_full.png"))
    driver.set_window_size(WIDTH, HEIGHT)
    saved = shoot(driver, shots, "after")
    print(f"screenshots: {shots / 'report_full.png'} and {', '.join(p.name for p in saved)}")


def test_every_plot_is_drawn_from_its_data(page):
    """Each plot of the page is drawn: an SVG in its div, plotly's traces as many as its embedded spec has, a
    non-empty plot area; no console error (plotly's own included)."""
    driver, _ = page
    plots = driver.execute_script(
        "return [...document.querySelectorAll('div.plot')].map(d => [d.dataset.name,"
        " JSON.parse(d.nextElementSibling.textContent).data.length, (d._fullData || []).length,"
        " d.querySelectorAll('svg.main-svg').length, d.querySelector('.cartesianlayer, .imagelayer') !== null,"
        " d.getBoundingClientRect().height])")
    assert len(plots) >= 20, len(plots)
    for name, traces, drawn, svgs, area, height in plots:
        assert traces > 0 and drawn == traces and svgs > 0 and area and height > 100, (name, traces, drawn, svgs)
    assert driver.execute_script("return document.images.length") > 0
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert not errors, errors


MISPLACED_TITLES = r"""
const out = [];
let count = 0;
for (const div of document.querySelectorAll('div.plot')) {
  const box = div.querySelector('svg.main-svg').getBoundingClientRect();
  const titles = [...div.querySelectorAll('g.infolayer g[class$="title"] > text')].map(t =>  // plotly.js's own
    [t, t.parentNode.getAttribute('class').match(/^g-([xy])(\d*)title$/)]);
  div.querySelectorAll('.label[data-axis]').forEach(t => titles.push(  // or the page's labels naming their axis
    [t, t.dataset.axis.match(/^([xy])(\d*)$/)]));
  for (const [title, axis] of titles) {
    if (!axis || !title || !title.textContent) continue;
    count++;
    const t = title.getBoundingClientRect();
    const inside = t.left >= box.left - 1 && t.right <= box.right + 1 && t.top >= box.top - 1
      && t.bottom <= box.bottom + 1;
    const labels = [...div.querySelectorAll('g.' + axis[1] + axis[2] + 'tick > text')]
      .map(l => l.getBoundingClientRect()).filter(r => r.width > 0);
    const clear = !labels.length || (axis[1] === 'x' ? t.top >= Math.max(...labels.map(r => r.bottom)) - 0.5
                                                      : t.right <= Math.min(...labels.map(r => r.left)) + 0.5);
    if (!inside || !clear) out.push([div.dataset.name, axis[1] + axis[2], title.textContent, inside, clear]);
  }
}
return [count, out];
"""


def test_every_axis_title_is_inside_its_plot_and_clear_of_its_tick_labels(page):
    """Each axis title as Chromium draws it lies inside its plot and beyond all of its axis's tick labels (below an x
    axis's, left of a y axis's), however long or rotated the labels are."""
    driver, _ = page
    count, misplaced = driver.execute_script(MISPLACED_TITLES)
    plots = driver.execute_script("return document.querySelectorAll('div.plot').length")
    assert count >= plots and misplaced == [], (count, plots, misplaced)  # most plots title both axes


HOVER_FIRST_POINT = """
const div = arguments[0], data = JSON.parse(div.nextElementSibling.textContent).data;
for (let c = 0; c < data.length; c++) {
  const t = data[c];
  if (t.hoverinfo === 'skip' || !['scatter', 'bar', 'heatmap'].includes(t.type)) continue;
  let point = null;
  if (t.type === 'heatmap') {
    t.z.forEach((row, r) => row.forEach((v, i) => { if (point === null && v !== null) point = [r, i]; }));
  } else {
    point = (t.y || []).findIndex(v => v !== null);
    if (point < 0) point = null;
  }
  if (point === null) continue;
  div.scrollIntoView(true);
  const subplot = (t.xaxis || 'x') + (t.yaxis || 'y');
  if (t.type === 'heatmap') {  // a cell by its coordinates: Fx.hover's point numbers name 1-d traces' points
    Plotly.Fx.hover(div, {xval: t.x ? t.x[point[1]] : point[1], yval: t.y ? t.y[point[0]] : point[0]}, subplot);
  } else {
    Plotly.Fx.hover(div, [{curveNumber: c, pointNumber: point}], subplot);
  }
  const label = div.querySelector('.hoverlayer .hovertext');
  const text = label ? label.textContent : '';
  Plotly.Fx.unhover(div);
  return [t.type, text];
}
return null;
"""


def test_every_plot_answers_a_hover(page):
    """Hovering the first point of each plot's first hoverable trace (a line's or scatter's point, a bar, a heatmap
    cell) shows a label with a value in it."""
    driver, _ = page
    divs = driver.execute_script("return [...document.querySelectorAll('div.plot')]")
    answered = 0
    for div in divs:
        name = div.get_attribute("data-name")
        found = driver.execute_script(HOVER_FIRST_POINT, div)
        if found is None:  # a plot of pictures only (image traces, drawn without hover)
            continue
        kind, text = found
        assert any(ch.isdigit() for ch in text), (name, kind, text)
        answered += 1
    assert answered >= len(divs) - 2, (answered, len(divs))


def test_a_legend_key_hides_and_shows_its_series(page):
    """Clicking a legend key of every plot that has a legend hides exactly the traces named as the key (read from
    the plot's embedded spec) and a second click shows them again."""
    driver, _ = page
    divs = driver.execute_script("return [...document.querySelectorAll('div.plot')].filter(d =>"
                                 " d.querySelector('.legend .key'))")
    assert len(divs) >= 10, len(divs)
    hidden = ("return arguments[0]._fullData.map((t, i) => [i, t.visible])"
              ".filter(([, v]) => v === 'legendonly')")  # (a trace with no point to draw is visible: false)
    for div in divs:
        key, names = driver.execute_script(
            "const k = arguments[0].querySelectorAll('.legend .key'); const key = k[k.length - 1];"
            " return [key.lastChild.textContent, JSON.parse(arguments[0].nextElementSibling.textContent).data"
            ".map(t => t.legendgroup || t.name)]", div)
        expected = [[i, "legendonly"] for i, name in enumerate(names) if name == key]
        assert expected and driver.execute_script(hidden, div) == [], (key, names)
        driver.execute_script("const k = arguments[0].querySelectorAll('.legend .key'); k[k.length - 1].click()", div)
        assert driver.execute_script(hidden, div) == expected, (div.get_attribute("data-name"), key)
        driver.execute_script("const k = arguments[0].querySelectorAll('.legend .key'); k[k.length - 1].click()", div)
        assert driver.execute_script(hidden, div) == [], (div.get_attribute("data-name"), key)


def _loop_layers(con, run_id: str, k: int) -> dict[int, list[int]]:
    """The test images of a run by their l*(k), from the stored predictions with a plain loop (never stable: T)."""
    by_layer: dict[int, list[int]] = {}
    for image_id, preds in con.execute("SELECT image_id, preds FROM timelines WHERE run_id = ? AND split = 'test'"
                                       " ORDER BY image_id", [run_id]).fetchall():
        t = len(preds) - 1
        layer = next((j for j in range(t - k + 1) if len(set(preds[j:j + k + 1])) == 1), t)
        by_layer.setdefault(layer, []).append(image_id)
    return by_layer


def test_a_histogram_bars_hover_names_its_images_and_a_click_lists_them(page, shots):
    """Hovering the k = 2 panel's fullest bar of the linear run names the run, the layer, its image count and its
    first image ids, as a plain loop over the predictions finds them; a click lists them, linked where the page has
    their timelines."""
    import duckdb

    driver, home = page
    run_id = "resnet18/clean/linear"
    con = duckdb.connect(str(home / "featstore.duckdb"), read_only=True)
    try:
        by_layer = _loop_layers(con, run_id, 2)
    finally:
        con.close()
    layer = max(by_layer, key=lambda a: len(by_layer[a]))
    ids = sorted(by_layer[layer])
    div = driver.execute_script(
        "return [...document.querySelectorAll('figure')].find(f => f.querySelector('figcaption').textContent"
        ".startsWith(arguments[0])).querySelector('div.plot')", f"Decision-layer histograms of {run_id} (")
    ks = driver.execute_script("return arguments[0]._fullLayout._subplots.cartesian", div)
    panel = 1  # the second panel: k = 2 (the report's ks are 1, 2, 3, 4)
    driver.execute_script("arguments[0].scrollIntoView(true);"
                          "Plotly.Fx.hover(arguments[0], [{curveNumber: arguments[1], pointNumber: arguments[2]}],"
                          " arguments[3])", div, 2 * panel, layer, ks[panel])
    label = driver.execute_script("const h = arguments[0].querySelector('.hoverlayer .hovertext');"
                                  " return h ? h.textContent : null", div)
    assert label is not None, "no hover label"
    assert run_id in label and "k = 2" in label and f"l* = {layer} " in label, label
    assert f": {len(ids)} decided (" in label, label  # the demo's fullest bar has no never-stable image
    assert "images " + ", ".join(map(str, ids[:12])) in label, label
    driver.execute_script("window.scrollBy(0, -8)")
    driver.save_screenshot(str(shots / "histogram_hover.png"))
    print(f"screenshot: {shots / 'histogram_hover.png'}")
    driver.execute_script("arguments[0].emit('plotly_click', {points: [arguments[0]._fullData[arguments[1]]"
                          " && {data: arguments[0]._fullData[arguments[1]], x: arguments[2],"
                          " customdata: arguments[0]._fullData[arguments[1]].customdata[arguments[2]]}]})",
                          div, 2 * panel, layer)
    listed = driver.execute_script("const p = arguments[0].parentNode.querySelector('.bar-images');"
                                   " return p ? [...p.querySelectorAll('a, span')].map(e => Number(e.textContent))"
                                   " : null", div)
    assert listed == ids[:200], (listed[:5] if listed else listed, ids[:5])
    linked = driver.execute_script("return [...arguments[0].parentNode.querySelectorAll('.bar-images a')]"
                                   ".every(a => document.getElementById(a.getAttribute('href').slice(1)))", div)
    assert linked


def test_every_figure_names_its_runs(page):
    """Each figure of a run's section names that run; every other figure names a run or model of the database
    (read here with DuckDB, not from the report)."""
    import duckdb

    driver, home = page
    con = duckdb.connect(str(home / "featstore.duckdb"), read_only=True)
    try:
        runs = con.execute("SELECT run_id, model, view, probe FROM runs ORDER BY run_id").fetchall()
    finally:
        con.close()
    figures = driver.execute_script(
        "return [...document.querySelectorAll('figure')].map(f => [f.closest('section.run') ?"
        " f.closest('section.run').dataset.run : null, f.querySelector('figcaption').textContent])")
    assert figures
    sections = driver.execute_script("return [...document.querySelectorAll('section.run')].map(s => s.dataset.run)")
    assert sorted(sections) == sorted(r for r, _, view, _ in runs if view == "clean")
    for run_id, caption in figures:
        if run_id is not None:
            assert run_id in caption, (run_id, caption)
        else:
            assert any(r in caption or m in caption for r, m, _, _ in runs), caption
    accuracy = [c for _, c in figures if c.startswith("Probe accuracy per anchor")]
    assert len(accuracy) == 1, accuracy  # one figure comparing the model's probes, not one per run
    for run_id, *_ in runs:
        assert run_id in accuracy[0], (run_id, accuracy[0])


SECTION = ("const h = arguments[0]; const s = [];"
           " for (let e = h.nextElementSibling; e && e.tagName !== 'H2'; e = e.nextElementSibling) s.push(e);"
           " return [h.id, h.textContent, h.getBoundingClientRect().top, s.map(e => e.textContent).join(' '),"
           " s.flatMap(e => [...e.querySelectorAll('div.plot')]).map(d => d.querySelectorAll('svg.main-svg').length),"
           " s.flatMap(e => [...e.querySelectorAll('figcaption')]).map(c => c.textContent)]")


def test_the_page_opens_with_when_each_run_decides(page):
    """The first section under the title holds the decision-layer histograms of every clean run (read from the
    database), each drawn, and its first plot starts within the first screen."""
    import duckdb

    driver, home = page
    con = duckdb.connect(str(home / "featstore.duckdb"), read_only=True)
    try:
        clean = [r for (r,) in con.execute("SELECT run_id FROM runs WHERE view = 'clean' ORDER BY run_id").fetchall()]
    finally:
        con.close()
    h2 = driver.execute_script("return document.querySelector('h2')")
    sid, title, top, text, svgs, captions = driver.execute_script(SECTION, h2)
    assert sid == "when" and title == "When does it decide" and top < HEIGHT
    assert sorted(c.split(" (")[0].removeprefix("Decision-layer histograms of ") for c in captions) == clean
    assert len(svgs) == len(clean) and all(svgs)
    plot_top = driver.execute_script("return document.querySelector('div.plot').getBoundingClientRect().top")
    assert plot_top < HEIGHT


def test_the_robustness_readout_follows(page):
    """The second section is the robustness readout: a headline, a table with every clean probe of seed 0 (read
    from the database: the neighbour-C runs among them) and its figure, drawn."""
    import duckdb

    driver, home = page
    con = duckdb.connect(str(home / "featstore.duckdb"), read_only=True)
    try:
        members = [r for (r,) in con.execute("SELECT run_id FROM runs WHERE view = 'clean' AND seed = 0 AND "
                                             "cross_fit = 0 ORDER BY run_id").fetchall()]
    finally:
        con.close()
    assert "resnet18/clean/linear:C_step=-1" in members and "resnet18/clean/linear:C_step=1" in members
    second = driver.execute_script("return document.querySelectorAll('h2')[1]")
    sid, title, top, text, widths, _ = driver.execute_script(SECTION, second)
    assert sid == "robustness" and title == "What of this timeline is the network's"
    families = {probe_id.split(":")[0] + "".join(  # a probe and its C neighbours are one family: one vote
        f":{','.join(kept)}" for kept in [[p for p in probe_id.partition(":")[2].split(",")
                                           if p and not p.startswith(("C=", "C_step="))]] if kept)
        for probe_id in (r.split("/")[2] for r in members)}
    assert len(families) < len(members)
    assert f"band under all {len(families)} probe families" in text and "Fleiss' kappa = " in text, text[:600]
    assert f"{len(members)} runs in all" in text and "1.0 [1.0, 1.0]" not in text
    for run_id in members:
        assert run_id in text, run_id
    assert widths and all(w > 0 for w in widths)


def test_every_gallery_image_has_a_timeline(page):
    """Each image in a gallery links to its per-image timeline, whose table has one row per anchor of the model
    (the anchor count read from the database)."""
    import duckdb

    driver, home = page
    con = duckdb.connect(str(home / "featstore.duckdb"), read_only=True)
    try:
        (anchors,) = con.execute("SELECT count(*) FROM anchors WHERE model = 'resnet18'").fetchone()
    finally:
        con.close()
    timelines = driver.execute_script(
        "return [...document.querySelectorAll('section.image-timeline')].map(s => [s.id,"
        " s.querySelectorAll('tbody tr').length, s.querySelector('img').naturalWidth])")
    assert timelines
    for sid, rows, width in timelines:
        assert rows == anchors and width > 0, (sid, rows, width)
    links = driver.execute_script("return [...document.querySelectorAll('a[href^=\"#image-\"]')].map(a =>"
                                  " a.getAttribute('href').slice(1))")
    assert links and set(links) <= {sid for sid, _, _ in timelines}


if __name__ == "__main__":
    report, out, prefix = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    browser = open_browser()
    try:
        load(browser, report)
        print("\n".join(map(str, shoot(browser, out, prefix))))
    finally:
        browser.quit()
