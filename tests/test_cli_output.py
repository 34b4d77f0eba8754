"""What the commands print, checked against the database read here with DuckDB and plain loops: probe's per-anchor
table and its note when it replaces a run, sql's CSV of list columns and its --full table, timeline --image, the
k-vs-late caveat, and the commands that must not import torch."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import copy_db, db_rows, fails, run_cli


@pytest.fixture(scope="module")
def probed(digits_store, digits_linear):
    return digits_store, *digits_linear


def _table_cells(output: str) -> list[list[str]]:
    """The data rows of a Polars table as printed ('│ a ┆ b │'), cells stripped."""
    return [[c.strip() for c in line.strip().strip("│").split("┆")] for line in output.splitlines()
            if "┆" in line and not line.strip().startswith(("│ ---", "│ str", "│ i", "│ f", "│ bool"))]


def test_probe_prints_test_accuracy_per_anchor_and_says_when_it_replaces(probed, tmp_path):
    store, db, first = probed
    (run_id,) = [line.split()[2] for line in first.splitlines() if line.startswith("wrote run")]
    assert "replaced" not in first
    preds = db_rows(db, "SELECT p.anchor, p.pred, i.label FROM predictions p JOIN images i USING (image_id) "
                      "WHERE p.run_id = ? AND i.split = 'test' ORDER BY p.anchor", [run_id])
    anchors = sorted({a for a, _, _ in preds})
    expected = {a: np.mean([p == y for b, p, y in preds if b == a]) for a in anchors}  # a plain loop
    converged = dict(db_rows(db, "SELECT anchor, bool_and(converged) FROM probe_fits WHERE run_id = ? GROUP BY 1",
                           [run_id]))
    cells = [c for c in _table_cells(first) if c[0].isdigit()]
    assert [int(c[0]) for c in cells] == anchors
    for anchor, _name, accuracy, _n, conv in cells:
        assert float(accuracy) == pytest.approx(expected[int(anchor)], abs=5e-5)
        assert conv == str(converged[int(anchor)]).lower()
    again = run_cli("probe", "--store", store, "--model", "resnet18", "--db", copy_db(db, tmp_path / "f.duckdb"),
                    "--no-progress", "--threads", "1").output
    assert f"wrote run {run_id} (replaced the run of that name written" in again


def test_sql_csv_writes_list_columns_as_json_and_full_shows_whole_timelines(probed):
    _, db, _ = probed
    statement = "SELECT run_id, image_id, preds, confs FROM timelines ORDER BY image_id LIMIT 5"
    out = run_cli("sql", "--db", db, "--format", "csv", statement).output
    parsed = list(csv.DictReader(io.StringIO(out)))
    reference = db_rows(db, statement)
    assert len(parsed) == len(reference) == 5
    for row, (run_id, image_id, preds, confs) in zip(parsed, reference, strict=True):
        assert row["run_id"] == run_id and int(row["image_id"]) == image_id
        assert json.loads(row["preds"]) == preds
        assert json.loads(row["confs"]) == pytest.approx(confs, abs=1e-7)
    short = run_cli("sql", "--db", db, statement).output
    whole = run_cli("sql", "--db", db, "--full", statement).output
    text = "[" + ", ".join(map(str, reference[0][2])) + "]"
    assert text not in short and "…" in short  # 12 anchors: Polars cuts the list by default
    assert text in whole


def test_timeline_image_prints_every_anchor_of_every_run(probed):
    _, db, _ = probed
    (image_id, label), *_ = db_rows(db, "SELECT image_id, label FROM images WHERE split = 'test' ORDER BY 1 LIMIT 1")
    out = run_cli("timeline", "--db", db, "--image", image_id, "--k", "2").output
    expected = db_rows(db, "SELECT anchor, pred, conf FROM predictions WHERE image_id = ? ORDER BY anchor", [image_id])
    (layer,) = db_rows(db, "SELECT layer FROM decisions WHERE image_id = ? AND k = 2", [image_id])[0]
    classes = dict(db_rows(db, "SELECT label, any_value(class_name) FROM images GROUP BY 1"))
    cells = [c for c in _table_cells(out) if c[0].isdigit()]
    assert len(cells) == len(expected)
    for (anchor, pred, conf), cell in zip(expected, cells, strict=True):
        marker = "◆ " if anchor == layer else ""
        assert cell[0] == str(anchor) and cell[2] == f"{marker}{classes[pred]} {conf:.2f}", (cell, pred, conf)
    assert f"image {image_id}: {classes[label]}" in out
    assert "no run" in run_cli("timeline", "--db", db, "--image", 10**9, ok=False).output


def test_timeline_says_when_late_means_never_stable(probed):
    _, db, _ = probed
    (n_anchors,) = db_rows(db, "SELECT DISTINCT n_anchors FROM runs")[0]
    t = n_anchors - 1
    late_start = next(i for i in range(t + 1) if i >= 0.7 * t)
    for k in range(1, 6):
        out = run_cli("timeline", "--db", db, "--k", k).output
        assert (f"at k = {k} with {n_anchors} anchors no stable l* can be late" in out) == (t - k < late_start), k


@pytest.mark.parametrize("args", [["--help"], ["sql", "--db", "{db}", "SELECT 1"], ["info", "{store}"],
                                  ["info", "--store", "{store}", "--format", "json"]])
def test_help_sql_and_info_do_not_import_torch(probed, args):
    """`info` reads a store's metadata only (a store of random-init weights: no published top-1 to look up)."""
    store, db, _ = probed
    argv = [a.format(db=db, store=store) for a in args]
    code = ("import sys\nfrom click.testing import CliRunner\nfrom featstore.cli.main import cli\n"
            f"result = CliRunner().invoke(cli, {argv!r})\n"
            "assert result.exit_code == 0, result.output\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_the_demos_suggested_query_counts_each_test_image_once(demo):
    out, printed = demo
    line = next(x for x in printed.splitlines() if x.startswith("try:"))
    db, statement = line.split("--db ")[1].split(" ", 1)
    counted = run_cli("sql", "--db", db, "--format", "csv", statement.strip().strip('"')).output
    total = sum(int(row["images"]) for row in csv.DictReader(io.StringIO(counted)))
    assert total == db_rows(db, "SELECT count(*) FROM images WHERE split = 'test'")[0][0]


def test_timeline_run_keeps_the_sweep_and_the_image_to_the_runs_named(demo):
    out, printed = demo
    db = next(x for x in printed.splitlines() if x.startswith("try:")).split("--db ")[1].split(" ", 1)[0]
    runs = [r for (r,) in db_rows(db, "SELECT run_id FROM runs ORDER BY run_id")]
    picked = runs[1:3]
    whole = list(csv.DictReader(io.StringIO(run_cli("timeline", "--db", db, "--format", "csv").stdout)))
    some = list(csv.DictReader(io.StringIO(run_cli("timeline", "--db", db, "--format", "csv", "--run",
                                                   ",".join(picked)).stdout)))
    assert {row["run_id"] for row in whole} == set(runs) and {row["run_id"] for row in some} == set(picked)
    assert some == [row for row in whole if row["run_id"] in picked]
    (image_id,) = db_rows(db, "SELECT image_id FROM images WHERE split = 'test' ORDER BY 1 LIMIT 1")[0]
    image = list(csv.DictReader(io.StringIO(run_cli("timeline", "--db", db, "--image", image_id, "--run", picked[1],
                                                    "--format", "csv").stdout)))
    expected = db_rows(db, "SELECT anchor, pred FROM predictions WHERE run_id = ? AND image_id = ? ORDER BY anchor",
                     [picked[1], image_id])
    assert {row["run_id"] for row in image} == {picked[1]}
    assert [(int(row["anchor"]), int(row["pred"])) for row in image] == expected
    for argv in ((), ("--image", image_id)):
        line = fails("timeline", "--db", db, "--run", f"{picked[0]},resnet18/clean/nope", *argv)
        assert "--run" in line and "'resnet18/clean/nope'" in line


def test_info_omits_the_pool_of_a_cnn_and_keeps_its_old_spellings(probed):
    store, _, _ = probed
    text = run_cli("info", "--store", store).stdout
    # a ResNet has no class token to pool
    assert "anchors 0:relu[64]" in text and " pool " not in text and "pool cls" not in text
    new = json.loads(run_cli("info", "--store", store, "--format", "json").stdout)
    assert json.loads(run_cli("info", store, "--json").stdout) == new  # the old positional store and --json
    assert new["models"]["resnet18"]["anchors"][0][1] == "relu" and new["models"]["resnet18"]["token_pool"]


def test_a_run_option_defaults_to_the_only_run_and_names_them_when_there_are_several(probed, tmp_path):
    store, db, _ = probed
    (only,) = db_rows(db, "SELECT run_id FROM runs")[0]
    # without --run exit-sim goes on with the database's one run, as far as it goes given it (no costs measured here)
    assert fails("exit-sim", "--db", db) == fails("exit-sim", "--db", db, "--run", only)
    assert "no costs of 'resnet18'" in fails("exit-sim", "--db", db)
    two = copy_db(db, tmp_path / "two.duckdb")  # its linear run, then a knn run beside it
    run_cli("probe", "--store", store, "--model", "resnet18", "--db", two, "--variant", "knn", "--no-progress",
            "--threads", "1")
    line = fails("exit-sim", "--db", two)
    assert "resnet18/clean/linear" in line and "resnet18/clean/knn" in line and "--run" in line


@pytest.mark.parametrize("variant", ["linear:C=1", "paper", "knn"])
def test_a_fits_bar_counts_anchors_to_their_total_and_names_train_accuracy(probed, tmp_path, variant):
    """The bar's total is the anchors (12 on the digits store), reached when the fit ends; an epoch method's
    accuracy is labelled as the train accuracy it is; the prediction pass has its own bar over the view's rows."""
    store, _, _ = probed
    n_anchors = len(json.loads(run_cli("info", "--store", store, "--format", "json").stdout)["models"]["resnet18"]
                    ["anchors"])
    err = run_cli("probe", "--store", store, "--model", "resnet18", "--db", tmp_path / "f.duckdb", "--variant",
                  variant, "--progress", "--threads", "1").stderr
    frames = err.replace("\r", "\n").splitlines()
    assert any(f"{n_anchors}/{n_anchors}" in f and "anchor" in f for f in frames), frames[-5:]
    assert any("rows=" in f for f in frames)
    images = json.loads(run_cli("info", "--store", store, "--format", "json").stdout)["images"]["count"]
    assert any("predict clean" in f and f"{images}/{images}" in f for f in frames), frames[-5:]
    if variant == "paper":
        assert any("train acc=" in f for f in frames) and not any(" acc=" in f.replace("train acc", "") for f in frames)
