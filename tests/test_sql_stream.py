"""`featstore sql` streams its result (memory stays flat whatever the row count) and stops on Ctrl-C with one
line, cancelling the query; checked on real processes: peak RSS of the command, a real SIGINT and its effect."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from featstore.analytics import db as fsdb
from featstore.analytics.queries import stream

from conftest import run_cli

FEATSTORE = [sys.executable, "-m", "featstore.cli.main"]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("sql") / "f.duckdb"
    fsdb.connect(path).close()  # an empty featstore database: the queries below read table functions
    return path


def peak_rss_mb(args: list[str]) -> float:
    """Peak resident memory of one `featstore` process run to completion, its output thrown away (a fresh
    child each time, measured by the kernel: RUSAGE_CHILDREN of a process that runs only it)."""
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe, *FEATSTORE, *args], capture_output=True, text=True, check=True)
    return int(out.stdout) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss is in KiB on Linux only")
def test_sql_output_streams_in_bounded_memory(db):
    """4M rows x 3 columns: held whole, the result and its text take hundreds of MB more than 50k rows do."""
    query = "SELECT range AS i, range * 0.5 AS x, 'image ' || range::VARCHAR AS name FROM range({n})"
    small = peak_rss_mb(["sql", "--db", str(db), "--format", "csv", query.format(n=50_000)])
    large = peak_rss_mb(["sql", "--db", str(db), "--format", "csv", query.format(n=4_000_000)])
    assert large - small < 80, f"peak RSS {small:.0f} MB at 50k rows, {large:.0f} MB at 4M rows"


def test_streamed_output_is_the_whole_result(db):
    """Batches joined: every row once, in order, csv and json alike, and an empty result keeps its header."""
    query = "SELECT range AS i, range % 7 AS m FROM range(150000) ORDER BY i"
    lines = run_cli("sql", "--db", db, "--format", "csv", query).output.splitlines()
    assert lines[0] == "i,m" and len(lines) == 150_001 and lines[1] == "0,0" and lines[-1] == f"149999,{149_999 % 7}"
    rows = json.loads(run_cli("sql", "--db", db, "--format", "json", query).output)
    assert len(rows) == 150_000 and rows[70_000] == {"i": 70_000, "m": 70_000 % 7}
    assert run_cli("sql", "--db", db, "--format", "csv", "SELECT 1 AS a WHERE false").output == "a\n"
    assert run_cli("sql", "--db", db, "--format", "json", "SELECT 1 AS a WHERE false").output == "[]\n"
    frames = list(stream(db, query, batch_rows=40_000))
    assert len(frames) >= 4 and max(f.height for f in frames) <= 40_000
    assert [i for f in frames for i in f["i"].to_list()] == list(range(150_000))


def _shown(output: str) -> list[int]:
    """The integers of a one-column table's body rows."""
    return [int(line.strip("│ ")) for line in output.splitlines() if line.strip("│ ").isdigit()]


def test_the_table_format_shows_the_first_rows_and_counts_the_rest(db):
    from featstore.cli.main import SHOWN_ROWS, TABLE_ROWS

    result = run_cli("sql", "--db", db, "SELECT range AS i FROM range(1234)")
    assert _shown(result.output) == list(range(SHOWN_ROWS))
    assert (f"… {1234 - SHOWN_ROWS:,} more row(s) not shown; --full shows up to 10,000; --format csv or json prints "
            "every row") in result.output
    result = run_cli("sql", "--db", db, "--full", f"SELECT range AS i FROM range({TABLE_ROWS + 1234})")
    assert _shown(result.output) == list(range(TABLE_ROWS))
    assert "… 1,234 more row(s) not shown; --format csv or json prints every row" in result.output
    small = run_cli("sql", "--db", db, f"SELECT range AS i FROM range({SHOWN_ROWS})")
    assert _shown(small.output) == list(range(SHOWN_ROWS)) and "not shown" not in small.output


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread counts from /proc")
def test_ctrl_c_cancels_a_long_query_in_one_line(db):
    """SIGINT used to wait for the query to finish (here: hours) and end in a traceback. Checked by its effect: the
    process ends with the interrupted status and one line, and the query's result (its completion) never printed;
    the wait on the process is bounded only as a guard against a hang (a query that ran on would take hours)."""
    imports = ("import os, duckdb, polars, pyarrow, click, featstore.cli.main, featstore.analytics.queries; "
               "print(len(os.listdir('/proc/self/task')))")
    imported = subprocess.run([sys.executable, "-c", imports], capture_output=True, text=True, check=True)
    before_connect = int(imported.stdout)
    query = "SELECT sum(hash(range)) AS s FROM range(1000000000000)"
    proc = subprocess.Popen([*FEATSTORE, "sql", "--db", str(db), query], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300  # a hang guard: featstore starts in seconds
        while _threads(proc.pid) <= before_connect + 1 and time.monotonic() < deadline:  # DuckDB's threads: it runs
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)  # a hang guard: the cancel, not the query, ends the process
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.splitlines() == ["featstore: interrupted: the query was cancelled; the database is unchanged"], err
    assert out == ""  # the sum, printed had the query run to completion


DUCKDB_STOPPED = """
import sys, threading, time
import duckdb
from featstore.errors import interrupted
con = duckdb.connect(config={"threads": 1})  # several: Ctrl-C waits while the main thread waits for them
con.execute("SET enable_progress_bar = true; SET enable_progress_bar_print = false; SET progress_bar_time = 0")
def running():  # once the query runs (its progress is known), say so; `interrupt()` it then
    while con.query_progress() < 0:
        time.sleep(0.01)
    print("running", flush=True)
    if sys.argv[1] == "interrupt":
        con.interrupt()
threading.Thread(target=running, daemon=True).start()
try:
    con.execute("SELECT sum(hash(range)) FROM range(1000000000000)").fetchall()
except BaseException as e:
    print(type(e).__name__, interrupted(e), flush=True)
"""


def _stopped(how: str) -> str:
    """What DuckDB raised, and whether featstore reads it as Ctrl-C, in a process of its own: stopped by a SIGINT
    from outside (as a terminal's Ctrl-C) or by its `interrupt()`. DuckDB reads a SIGINT between the tasks its
    calling thread runs, and not while that thread waits for its workers (then the query runs on): one thread
    makes the test's query one the SIGINT always finds. Either stop is sent once the query runs (DuckDB knows its
    progress): an `interrupt()` before the query starts is forgotten as it starts, and a SIGINT then is Python's
    own KeyboardInterrupt, so a fixed delay made the verdict depend on the machine's load."""
    proc = subprocess.Popen([sys.executable, "-c", DUCKDB_STOPPED, how], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "running"
        if how == "sigint":
            proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=300)[0].strip()  # a hang guard only: the stop takes well under a second
    finally:
        proc.kill()


def test_duckdbs_own_interrupt_counts_as_ctrl_c():
    """DuckDB turns Ctrl-C that lands inside one of its queries (e.g. the checks while a connection opens) into a
    RuntimeError("Query interrupted"), and `interrupt()` into its InterruptException, neither a KeyboardInterrupt:
    featstore reads both as Ctrl-C, and no other error."""
    import duckdb

    from featstore.errors import interrupted

    assert [_stopped(how) for how in ("sigint", "interrupt")] == ["RuntimeError True", "InterruptException True"]
    assert interrupted(KeyboardInterrupt()) and not interrupted(RuntimeError("Query interrupted by the planner"))
    assert not interrupted(duckdb.IOException("x")) and not interrupted(ValueError("Query interrupted"))
