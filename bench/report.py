"""Benchmark `featstore report` against an older checkout (`--base`), in the same run.

Two databases: the demo's (`featstore demo`: 1,200 images, 8 runs) and the same with every image repeated `--repeat`
times (40: 48,000 images, 4.6 M prediction rows, ImageNet val's size), made here by copying each image's rows under
new ids (`repeat_images`). Each report is written by a fresh process of each code (this checkout's and `--base`, a
checkout of the older code with its own venv, e.g. `git worktree add /tmp/base COMMIT`; its `.venv/bin/python` must
import that checkout's featstore, not another's editable install), one after the other; wall time, CPU time and peak
memory (the child's max RSS) are measured. The new page is then opened in headless Chromium (as
tests/test_report_browser.py opens it) and timed until every plot is drawn; the old page until its images are
decoded; each page is opened `--opens` times (3), each time in a fresh browser, and the median is kept. Prints each
figure new and old with their ratio, the targets, and the load average.

    python bench/report.py --demo DEMO/layouts/featstore.duckdb --base /tmp/base [--repeat 40] [--only demo] [--opens 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"demo": (5.0, None), "big": (20.0, 500.0)}  # seconds, MB
BROWSER_TARGET = 2.0  # seconds until every plot is drawn


def repeat_images(source: Path, out: Path, times: int) -> Path:
    """A copy of `source` with every image's rows (images, predictions, decisions, head outputs, gate scores, folds)
    repeated `times` times under new ids (id + r * (max id + 1)); run sizes scaled to match."""
    shutil.copyfile(source, out)
    con = duckdb.connect(str(out))
    try:
        tables = [t for (t,) in con.execute(
            "SELECT DISTINCT table_name FROM information_schema.columns WHERE column_name = 'image_id' AND "
            "table_name IN (SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE')"
        ).fetchall()]
        (offset,) = con.execute("SELECT max(image_id) + 1 FROM images").fetchone()
        for table in tables:
            con.execute(f'CREATE TEMP TABLE one AS SELECT * FROM "{table}"')
            con.execute(f'INSERT INTO "{table}" SELECT one.* REPLACE (image_id + r * {offset} AS image_id) FROM one, '
                        f"range(1, {times}) AS t(r)")
            con.execute("DROP TABLE one")
        con.execute(f"UPDATE runs SET n_images = n_images * {times}")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return out


def timed_report(python: Path, db: Path, out: Path) -> tuple[float, float, float]:
    """Wall seconds, peak MB and CPU seconds (user + system: what a busy machine inflates least) of one fresh process
    writing the report of `db` into `out`."""
    code = "import sys; from featstore.analytics.report import write_report; write_report(sys.argv[1], sys.argv[2])"
    start = time.perf_counter()
    proc = subprocess.Popen([str(python), "-c", code, str(db), str(out)], cwd=tempfile.gettempdir(),
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"{python} failed on {db}")
    return seconds, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def browser_seconds(page: Path, opens: int = 1) -> tuple[float, float] | None:
    """Seconds from navigation until every plot is drawn (a page without plots: until its images decode), and the
    renderer's CPU seconds in that time (Chromium's own ProcessTime: what a busy machine inflates least); the median
    of `opens` openings, each in a fresh browser (nothing cached: a reader's first visit)."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from test_report_browser import _chromium, open_browser
    except ImportError:
        return None
    if _chromium() is None:
        return None
    walls, cpus = [], []
    for _ in range(opens):
        driver = open_browser()
        try:
            driver.execute_cdp_cmd("Performance.enable", {})
            start = time.perf_counter()
            driver.get(page.resolve().as_uri())
            driver.execute_async_script(
                "const done = arguments[0]; const check = () => (!document.querySelector('div.plot') ||"
                " document.body.dataset.plotsDrawn !== undefined) && [...document.images].every(i => i.complete) ?"
                " done(0) : setTimeout(check, 10); check();")
            walls.append(time.perf_counter() - start)
            metrics = {m["name"]: m["value"] for m in driver.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]}
            cpus.append(metrics.get("ProcessTime", float("nan")))
        finally:
            driver.quit()
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", type=Path, required=True, help="the demo's featstore.duckdb")
    parser.add_argument("--base", type=Path, required=True, help="a checkout of the older code with .venv/")
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--only", choices=["demo", "big"])
    parser.add_argument("--opens", type=int, default=3, help="times each page is opened (the median is printed)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-report-"))
    codes = {"new": ROOT / ".venv" / "bin" / "python", "old": args.base / ".venv" / "bin" / "python"}
    print(f"load before: {' '.join(f'{v:.1f}' for v in os.getloadavg())} on {os.cpu_count()} cores")
    dbs = {}
    if args.only != "big":
        dbs["demo"] = shutil.copyfile(args.demo, work / "demo.duckdb")
    if args.only != "demo":
        start = time.perf_counter()
        dbs["big"] = repeat_images(args.demo, work / "big.duckdb", args.repeat)
        (images,) = duckdb.connect(str(dbs["big"]), read_only=True).execute("SELECT count(*) FROM images").fetchone()
        print(f"big: {images} images ({args.repeat} x the demo's), made in {time.perf_counter() - start:.0f} s")
    rows = []
    for name, db in dbs.items():
        figures = {}
        for code, python in codes.items():
            seconds, mb, cpu_s = timed_report(python, db, work / f"{name}-{code}")
            opened, cpu = browser_seconds(work / f"{name}-{code}" / "report.html", args.opens) or (None, None)
            size = (work / f"{name}-{code}" / "report.html").stat().st_size / 1e6
            figures[code] = (seconds, mb, opened, cpu, cpu_s)
            print(f"{name} {code}: {seconds:.1f} s ({cpu_s:.1f} s of CPU), {mb:.0f} MB, page {size:.1f} MB, opened in "
                  f"{'-' if opened is None else f'{opened:.2f} s ({cpu:.2f} s of renderer CPU)'} "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
        limit_s, limit_mb = TARGETS[name]
        for i, (what, unit, limit) in enumerate((("report", "s", limit_s), ("peak memory", "MB", limit_mb),
                                                 ("page opened, plots drawn", "s", BROWSER_TARGET),
                                                 ("its renderer CPU", "s", None), ("report's CPU", "s", None))):
            old, new = figures["old"][i], figures["new"][i]
            if old is None or new is None:
                continue
            rows.append((f"{name}: {what}", f"{old:.2f} {unit}", f"{new:.2f} {unit}", f"{new / old:.2f}",
                         f"<= {limit:g} {unit}" if limit else ""))
    print(f"\nload after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print("| figure | before | now | now / before | target |\n|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
