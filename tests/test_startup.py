"""Commands that answer at once: a refusal before torch loads, usage errors in the command's own words, each
command's help about its own options, and the views and macros bound once per database and version."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from featstore.analytics import db as fsdb
from featstore.cli.main import cli

from conftest import fails, run_cli

SQL = Path(__file__).resolve().parents[1] / "sql"
TEMPORARY = ("SELECT (SELECT count(*) FROM duckdb_functions() WHERE database_name = 'temp') + "
             "(SELECT count(*) FROM duckdb_views() WHERE temporary AND NOT internal)")


def refused_without_torch(*args: object) -> str:
    """Run the CLI in a fresh Python: its one line, after checking it exited 2 without importing torch."""
    code = ("import sys\nfrom click.testing import CliRunner\nfrom featstore.cli.main import cli\n"
            f"r = CliRunner().invoke(cli, {[str(a) for a in args]!r})\n"
            "print(r.exit_code, 'torch' in sys.modules)\nprint(r.output)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    status, said = done.stdout.split("\n", 1)
    assert status == "2 False", done.stdout + done.stderr
    return said.strip()


def test_a_job_given_what_is_not_there_is_refused_before_torch_loads(tmp_path):
    assert refused_without_torch("build", "--model", "resnet18", "--data", tmp_path / "no", "--store",
                                 tmp_path / "s.zarr") == (
        f"featstore: error: image folder {tmp_path / 'no'} does not exist; pass --data (an ImageFolder root or a "
        f"flat folder)")
    assert refused_without_torch("probe", "--store", tmp_path / "none.zarr", "--model", "resnet18", "--db",
                                 tmp_path / "f.duckdb") == (
        f"featstore: error: --store {tmp_path / 'none.zarr'}: no featstore store there; build one with "
        f"`featstore build`")
    assert not (tmp_path / "s.zarr").exists() and not (tmp_path / "f.duckdb").exists()


def test_usage_errors_name_the_command_and_suggest_only_what_its_help_shows():
    assert fails("timeline", "--bogus").endswith("(featstore timeline -h lists the options)")
    assert fails("timeline", "--db").endswith("(featstore timeline -h lists the options)")
    assert fails("nosuchcommand").endswith("(featstore -h lists the options)")
    shown = {o for p in cli.commands["timeline"].params if not getattr(p, "hidden", False)
             for o in (*p.opts, *p.secondary_opts)}
    hidden = {o for p in cli.commands["timeline"].params if getattr(p, "hidden", False) for o in p.opts}
    assert "--json" in hidden  # the old spelling, still taken, never offered
    line = fails("timeline", "--jsn")
    offered = {word.strip("'?,.") for word in line.split("Did you mean", 1)[-1].split() if word.startswith("'--")}
    assert "--json" not in line and offered <= shown


def test_each_command_explains_its_own_options():
    def help_of(command: str, flag: str) -> str:
        lines = run_cli(command, "-h").output.splitlines()
        start = next(i for i, line in enumerate(lines) if line.strip().startswith(flag + " "))
        block = [lines[start]]
        for line in lines[start + 1:]:
            if line.strip().startswith("--"):
                break
            block.append(line)
        return " ".join(" ".join(block).split())

    build = run_cli("build", "-h").output
    assert "SGD" not in build and "EAP-IG" not in build and "circuits" not in build
    assert "SGD" in help_of("probe", "--seed")
    assert "EAP-IG" in help_of("circuits", "--batch-size") and "default: 32" in help_of("circuits", "--batch-size")
    assert "default: 500" in help_of("circuits", "--limit") and "default: all" in help_of("build", "--limit")


def _record(db: Path) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT source_digest FROM macro_set").fetchall()
    finally:
        con.close()


def test_definitions_are_installed_once_per_database_and_version(tmp_path):
    """A write connection records which definitions it put in the file (the digest of their sql/ text); a read-only
    open of that file binds nothing; a file recording another version's set is read through TEMP definitions,
    and the next write connection puts this version's back with its record."""
    db = tmp_path / "f.duckdb"
    fsdb.connect(db).close()
    texts = "\n".join((SQL / f"{name}.sql").read_text() for name in fsdb.MACROS)
    assert _record(db) == [(hashlib.sha256(texts.encode()).hexdigest(),)]
    con = fsdb.connect(db, read_only=True)
    assert con.execute(TEMPORARY).fetchall() == [(0,)]
    con.close()
    raw = duckdb.connect(str(db))
    raw.execute("UPDATE macro_set SET source_digest = 'an older featstore'")
    raw.close()
    con = fsdb.connect(db, read_only=True)
    assert con.execute(TEMPORARY).fetchall() == [(len(fsdb.MACROS),)]
    assert con.execute("SELECT count(*) FROM decision_layers(2)").fetchall() == [(0,)]
    con.close()
    fsdb.connect(db).close()
    assert _record(db) == [(hashlib.sha256(texts.encode()).hexdigest(),)]


def test_a_misspelled_model_is_answered_with_each_name_once():
    import re

    import pytest
    import timm
    import torchvision

    from featstore.errors import FeatstoreError
    from featstore.nets.models import library_of

    with pytest.raises(FeatstoreError) as caught:
        library_of("resnett18")
    offered = re.search(r"did you mean (.*)\?\)$", str(caught.value)).group(1).split(", ")
    known = sorted({*torchvision.models.list_models(), *timm.list_models()})
    assert len(offered) == len(set(offered)) and "resnet18" in offered
    assert set(offered) <= set(known) and len(offered) == 4


HEAVY = ("polars", "pyarrow", "torch")


def answered_without(args: list[str]) -> tuple[str, list[str]]:
    """Run the CLI in a fresh Python: what it printed, and which of HEAVY it imported (it must exit 0)."""
    code = ("import sys\nfrom click.testing import CliRunner\nfrom featstore.cli.main import cli\n"
            f"r = CliRunner().invoke(cli, {args!r})\n"
            f"print(r.exit_code, sorted(m for m in {HEAVY!r} if m in sys.modules))\nprint(r.output, end='')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    status, said = done.stdout.split("\n", 1)
    assert status.startswith("0 "), done.stdout + done.stderr
    return said, eval(status[2:])


def polars_table(frame) -> str:
    """Polars' own table of `frame` under the settings the CLI prints with (set here, not read from the CLI)."""
    import polars as pl

    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=240, tbl_hide_dataframe_shape=True, float_precision=4,
                   fmt_str_lengths=80):
        return str(frame)


@pytest.fixture(scope="module")
def toy_db(tmp_path_factory):
    """A database of one hand-written run: 30 images, 6 anchors, a prediction that settles at a drawn anchor."""
    import numpy as np
    from synthetic import run_rows, toy_database

    path = tmp_path_factory.mktemp("startup") / "f.duckdb"
    toy = toy_database(path, 30, 6, seed=5)
    settle = toy.rng.integers(0, 6, 30)
    preds = np.where(np.arange(6)[None, :] >= settle[:, None], toy.head[:, None], (toy.head[:, None] + 1) % 3)
    conf = toy.rng.random(preds.shape).astype(np.float32)
    fsdb.write_runs(toy.con, [run_rows({"run_id": "m/clean/linear", "model": "m", "view": "clean"}, np.arange(30),
                                       preds, conf)])
    toy.con.close()
    return path


QUERIES = ["SELECT 1",
           "SELECT image_id, anchor, pred, conf, conf::DOUBLE * -1e3 AS scaled, NULL::VARCHAR AS missing, "
           "pred = 1 AS one, 'nan'::DOUBLE AS nan FROM predictions ORDER BY image_id, anchor",
           "SELECT repeat('x', 79 + range::INT) AS text, range::TINYINT AS i, (range * 1e12)::DOUBLE AS big "
           "FROM range(4)",
           "SELECT " + ", ".join(f"repeat('w', 30) AS column_{i}" for i in range(8)),  # wider than the table width
           "SELECT 'café' AS name", "SELECT 1 AS a WHERE false"]


def test_sql_prints_polars_own_table_without_importing_polars_arrow_or_torch(toy_db):
    """The table `featstore sql` prints is Polars' own text of the result (its first 40 rows, the rest counted):
    NULLs, floats of both widths, NaN, text cut at 80 characters, no rows; a result of numbers, text and booleans
    is printed without importing Polars, Arrow or torch, one that only Polars can say as it does (text beyond
    ASCII, floats it writes in scientific notation, a table wider than its width) through Polars."""
    con = duckdb.connect(str(toy_db), read_only=True)
    try:
        frames = [con.sql(query).pl() for query in QUERIES]
    finally:
        con.close()
    for query, frame in zip(QUERIES, frames, strict=True):
        said, imported = answered_without(["sql", "--db", str(toy_db), query])
        more = "" if frame.height <= 40 else (f"… {frame.height - 40:,} more row(s) not shown; --full shows up to "
                                              "10,000; --format csv or json prints every row\n")
        assert said == polars_table(frame.head(40)) + "\n" + more, query
        plain = "café" not in query and "column_7" not in query and "big" not in query
        assert imported == [] if plain else set(imported) <= {"polars", "pyarrow"}, (query, imported)


def test_sql_prints_a_column_it_casts_to_text_as_duckdb_says_it(toy_db):
    """An INTERVAL, which no output format prints as it is, is DuckDB's own text in the table (as `::VARCHAR`
    gives it, read here through DuckDB and Polars), beside a plain column."""
    query = "SELECT INTERVAL 3 DAY AS x, 1 AS y"
    con = duckdb.connect(str(toy_db), read_only=True)
    try:
        frame = con.sql("SELECT (INTERVAL 3 DAY)::VARCHAR AS x, 1 AS y").pl()
    finally:
        con.close()
    said, _ = answered_without(["sql", "--db", str(toy_db), query])
    assert said == polars_table(frame) + "\n"


def test_timeline_prints_the_sweep_without_importing_polars_arrow_or_torch(toy_db):
    """`featstore timeline`'s table is the k-sweep as Polars prints it (read here through DuckDB and Polars); the
    command imports neither."""
    said, imported = answered_without(["timeline", "--db", str(toy_db)])
    assert imported == []
    con = fsdb.connect(toy_db, read_only=True)
    try:
        frame = con.sql("SELECT * EXCLUDE (model, view, probe) FROM decision_sweep(4) WHERE k <= 4").pl()
    finally:
        con.close()
    assert said.startswith(polars_table(frame) + "\n")
    assert frame.height == 4 and frame["k"].to_list() == [1, 2, 3, 4]


@pytest.mark.parametrize("given, line", [
    (["--views", "clean,fog-9"], "unknown view 'fog-9': use clean or one of"),
    (["--anchors", "layer1,layer1"], "--anchors lists a name twice: layer1,layer1"),
    (["--anchors", "layer2,input"], "--anchors lists input at place 2"),
    (["--anchors", "layer1", "--taps", "all"], "--taps and --anchors exclude each other"),
])
def test_a_bad_view_or_anchor_list_is_refused_before_torch_loads(tmp_path, given, line):
    said = refused_without_torch("build", "--model", "resnet18", "--data", tmp_path, "--store", tmp_path / "s.zarr",
                                 *given)
    assert said.startswith(f"featstore: error: {line}")
    assert not (tmp_path / "s.zarr").exists()


def databases_opened(args: list[str]) -> list[str]:
    """Run the CLI in a fresh Python: the databases it opened (`duckdb.connect`'s first argument, in order; DuckDB's
    module-level functions, which open its default in-memory database, recorded as 'default')."""
    code = ("import sys, duckdb\nfrom click.testing import CliRunner\nopened = []\nconnect = duckdb.connect\n"
            "def recorded(database=':memory:', *a, **k):\n    opened.append(str(database))\n"
            "    return connect(database, *a, **k)\n"
            "duckdb.connect = recorded\n"
            "for name in ('extract_statements', 'sql', 'execute', 'query', 'default_connection'):\n"
            "    def default(*a, _name=name, **k):\n        opened.append('default')\n"
            "        return getattr(duckdb.DuckDBPyConnection, _name)(connect(':memory:'), *a, **k)\n"
            "    setattr(duckdb, name, default)\n"
            "from featstore.cli.main import cli\n"
            f"r = CliRunner().invoke(cli, {args!r})\nprint(r.exit_code, opened)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    status, opened = done.stdout.split(" ", 1)
    assert status == "0", done.stdout + done.stderr
    return eval(opened)


@pytest.mark.parametrize("args", [["sql", "SELECT 1"], ["timeline"]])
def test_sql_and_timeline_open_their_database_and_no_other(toy_db, args):
    """`featstore sql` and `timeline` open the database once and no other DuckDB database: creating an in-memory
    one (for a statement's parse, or for the bands' limits) costs about 0.1 s of a command's start."""
    assert databases_opened([args[0], "--db", str(toy_db), *args[1:]]) == [str(toy_db)]
