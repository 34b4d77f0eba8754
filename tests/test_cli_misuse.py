"""Misuse of the CLI ends in one line and exit 2, before anything is written, or prints correctly: 8 cases.

1. `cka` into a database of another image set is refused as `probe` refuses it (the same check, the same line).
2. `calibration(run, bins := 0)` / `bins := -3` is refused by the macro, for `featstore sql` and Python alike.
3. `timeline --image N --k 20` and `exit-sim --k 99` on 12 anchors: k outside 1..anchors-1, the k-sweep's rule.
4. `exit-sim --thresholds 0:1:0.0000001`: a range of more than 10,000 thresholds.
5. `sql` prints INTERVAL, BIT, BLOB and lists of DECIMAL/DATE/TIMESTAMP in every format.
6. A full disk (a real, tiny tmpfs) during `build`, `export` and `report`: one line naming the path and the fix;
   `export` and `report` leave nothing behind (the report's PNGs only with its page).
7. A symlink loop, a file or a folder of the wrong kind as `--db` / `--out`.
8. `sql --db X --db X` (the same file, however spelt) reads X once.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import copy_db, digest, fails, run_cli

FEATSTORE = [sys.executable, "-m", "featstore.cli.main"]
RUN = "resnet18/clean/linear"


def one_line(line: str, *names: str) -> None:
    """The line names every one of `names` (the input and the fix)."""
    assert "Traceback" not in line, line
    for name in names:
        assert name in line, (name, line)


# 1. cka of another image set ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_store(image_dir, tmp_path_factory) -> Path:
    """The same network over another image set (12 images, not the 1,797 digits)."""
    store = tmp_path_factory.mktemp("small") / "s.zarr"
    run_cli("build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--data", image_dir,
            "--store", store, "--no-progress", "--threads", "1")
    return store


def test_cka_refuses_a_database_of_another_image_set_as_probe_does(digits_linear, small_store, tmp_path):
    db = copy_db(digits_linear[0], tmp_path / "f.duckdb")
    before = digest(db)
    cka = fails("cka", "--store", small_store, "--model", "resnet18", "--db", db, "--no-progress")
    probe = fails("probe", "--store", small_store, "--model", "resnet18", "--db", db, "--no-progress")
    one_line(cka, str(db), "another image set", "pass a new --db")
    assert cka == probe
    assert digest(db) == before


def test_a_database_only_cka_wrote_keeps_its_image_set(digits_store, small_store, tmp_path):
    """CKA over 1,797 images is not replaced by one over 12 of another set."""
    db = tmp_path / "cka.duckdb"
    run_cli("cka", "--store", digits_store, "--model", "resnet18", "--db", db, "--no-progress")
    before = digest(db)
    line = fails("cka", "--store", small_store, "--model", "resnet18", "--db", db, "--no-progress")
    one_line(line, str(db), "another store", "pass a new --db")
    assert digest(db) == before


# 2. calibration bins ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bins", ["0", "-3", "2.5"])
def test_calibration_refuses_fewer_than_one_bin(digits_linear, bins):
    db = digits_linear[0]
    for macro in ("calibration", "calibration_bins"):
        line = fails("sql", "--db", db, f"SELECT * FROM {macro}('{RUN}', bins := {bins})")
        one_line(line, f"bins {bins}", "whole number >= 1")
    from featstore.analytics import readouts
    from featstore.errors import FeatstoreError

    with pytest.raises(FeatstoreError, match=f"bins {bins}: must be a whole number >= 1"):
        readouts.calibration(db, RUN, bins=float(bins) if "." in bins else int(bins))


def test_one_bin_is_still_a_calibration(digits_linear):
    rows = json.loads(run_cli("sql", "--db", digits_linear[0], "--format", "json",
                              f"SELECT * FROM calibration_bins('{RUN}', bins := 1) WHERE anchor = 0").output)
    assert len(rows) == 1 and rows[0]["bin"] == 1 and rows[0]["share"] == pytest.approx(1.0)


# 3. k against the anchors -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, k", [(["timeline", "--image", "3", "--k", "20"], 20),
                                     (["timeline", "--image", "3", "--k", "12"], 12),
                                     (["exit-sim", "--k", "99"], 99),
                                     (["exit-sim", "--k", "1,12"], 12),
                                     (["timeline", "--k", "12"], 12)])
def test_k_outside_the_anchors_is_refused_everywhere_alike(digits_linear, args, k):
    line = fails(args[0], "--db", digits_linear[0], *args[1:])
    one_line(line, f"--k {k}", "12 anchors", "from 1 to 11")


def test_the_largest_k_the_anchors_allow_still_runs(digits_linear):
    output = run_cli("timeline", "--db", digits_linear[0], "--image", "3", "--k", "11").output
    assert "◆ at l*(11)" in output


# 4. threshold ranges ------------------------------------------------------------------------------------------------

def _two_gib() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS bounds the process on Linux")
@pytest.mark.parametrize("given, count", [("0:1:0.0000001", "10,000,001"), ("0:1:1e-300", "1.0e+300")])
def test_a_thresholds_range_past_ten_thousand_is_refused_before_it_is_built(digits_linear, given, count):
    """In a process held to 2 GiB of address space: a range built before it is counted fails there (a MemoryError)
    instead of growing on the machine."""
    proc = subprocess.run([*FEATSTORE, "exit-sim", "--db", str(digits_linear[0]), "--thresholds", given],
                          capture_output=True, text=True, preexec_fn=_two_gib, timeout=600)
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr[-2000:]
    one_line(proc.stderr, given, f"{count} thresholds", "at most 10,000", "larger step")


def test_ten_thousand_thresholds_are_accepted():
    from featstore.cli.options import MAX_THRESHOLDS, _threshold_parser

    assert len(_threshold_parser(None, None, "0:0.9999:0.0001")) == MAX_THRESHOLDS


# 5. sql output of every type ----------------------------------------------------------------------------------------

TYPES = ("SELECT INTERVAL 3 DAY AS i, [1.5::DECIMAL(4,2)] AS d, ['2024-01-01'::DATE] AS dt, "
         "['2024-05-06 07:08:09'::TIMESTAMP] AS ts, 'ab'::BLOB AS b, '101'::BIT AS bits, "
         "[INTERVAL 90 MINUTE] AS li, {'x': ['a'::BLOB]} AS sb, now()::TIMESTAMP AS now")


def test_sql_prints_intervals_bits_blobs_and_nested_values_as_json(digits_linear):
    row = json.loads(run_cli("sql", "--db", digits_linear[0], "--format", "json", TYPES).output)[0]
    assert {k: v for k, v in row.items() if k != "now"} == {
        "i": "3 days", "d": ["1.50"], "dt": ["2024-01-01"], "ts": ["2024-05-06 07:08:09"], "b": "6162",
        "bits": "101", "li": ["01:30:00"], "sb": {"x": ["61"]}}


def test_sql_prints_them_as_csv_the_same(digits_linear):
    text = run_cli("sql", "--db", digits_linear[0], "--format", "csv", TYPES).output
    row = next(csv.DictReader(io.StringIO(text)))
    assert row["i"] == "3 days" and row["b"] == "6162" and row["bits"] == "101"
    assert [json.loads(row[c]) for c in ("d", "dt", "ts", "li", "sb")] == [
        ["1.50"], ["2024-01-01"], ["2024-05-06 07:08:09"], ["01:30:00"], {"x": ["61"]}]


def test_sql_prints_them_as_a_table(digits_linear):
    text = run_cli("sql", "--db", digits_linear[0], TYPES).output
    assert "3 days" in text and "101" in text and '"01:30:00"' in text and "1.50" in text


# 6. a full disk -----------------------------------------------------------------------------------------------------

def _tiny_disk_works() -> bool:
    """A tmpfs mounted in a mount namespace of our own (gone with the process: nothing to unmount)."""
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                          capture_output=True).returncode == 0


needs_tiny_disk = pytest.mark.skipif(not (sys.platform.startswith("linux") and _tiny_disk_works()),
                                     reason="needs unshare -rm and a tmpfs mount (user and mount namespaces)")


def on_full_disk(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run featstore with `disk` (a 64 KiB tmpfs at tmp_path/disk) holding its output: the process and what is
    left on that disk afterwards (relative paths)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    listing = tmp_path / "left.txt"
    script = ('mount -t tmpfs -o size=64k tmpfs "$0" || exit 99; "$@"; rc=$?; '
              f'(cd "$0" && find . -mindepth 1) > {listing}; exit $rc')
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script, str(disk), *FEATSTORE, *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode != 99, proc.stderr
    return proc, listing.read_text().split()


def the_error(proc: subprocess.CompletedProcess) -> str:
    """Exit 2, no traceback, and exactly one error line on stderr (progress lines aside): that line."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("featstore: error: ")]
    assert len(errors) == 1 and proc.stderr.splitlines()[-1] == errors[0], proc.stderr
    return errors[0]


@needs_tiny_disk
def test_build_on_a_full_disk_is_one_line(digits_store, tmp_path):
    images = digits_store.parent / "images"
    proc, _ = on_full_disk(tmp_path, "build", "--model", "resnet18", "--weights", "none", "--image-size", "32",
                           "--data", str(images), "--store", "disk/s.zarr", "--no-progress", "--threads", "1")
    one_line(the_error(proc), "no space left", "disk/s.zarr", "free some space", "--store")


@needs_tiny_disk
def test_export_on_a_full_disk_is_one_line_and_leaves_nothing(digits_linear, tmp_path):
    proc, left = on_full_disk(tmp_path, "export", "--db", str(digits_linear[0]), "--out", "disk/export")
    one_line(the_error(proc), "no space left", "disk/export", "free some space", "--out")
    assert left == []


@needs_tiny_disk
def test_report_on_a_full_disk_is_one_line_and_leaves_no_png(digits_linear, tmp_path):
    proc, left = on_full_disk(tmp_path, "report", "--db", str(digits_linear[0]), "--out", "disk/report",
                              "--figures", "png")
    one_line(the_error(proc), "no space left", "disk/report", "free some space", "--out")
    assert left == []


def test_the_report_moves_its_figures_in_with_its_page(digits_linear, tmp_path):
    out = tmp_path / "report"
    run_cli("report", "--db", digits_linear[0], "--out", out, "--figures", "pdf")
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == ["report"] and (out / "report.html").is_file() and list(out.glob("*.pdf"))
    assert all(p.read_bytes().startswith(b"%PDF") for p in out.glob("*.pdf"))


# 7. paths that are no database or folder ----------------------------------------------------------------------------

@pytest.fixture
def loop(tmp_path) -> Path:
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    return tmp_path / "loop"


@pytest.mark.parametrize("command", [["sql", "SELECT 1"], ["report"], ["export", "--out", "{new}"],
                                     ["timeline"], ["exit-sim"],
                                     ["probe", "--store", "{store}", "--model", "resnet18", "--no-progress"],
                                     ["cka", "--store", "{store}", "--model", "resnet18", "--no-progress"],
                                     ["merge"]])
def test_a_symlink_loop_as_db_is_one_line_and_stays(loop, digits_store, tmp_path, command):
    args = [a.format(new=tmp_path / "new", store=digits_store) for a in command]
    line = fails(args[0], "--db", loop, *args[1:])
    one_line(line, "--db", str(loop), "symlink loop", "give the DuckDB file itself")
    assert loop.is_symlink() and os.readlink(loop) == str(tmp_path / "loop2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop", "loop2"]


@pytest.mark.parametrize("command", ["report", "export"])
def test_a_symlink_loop_or_a_file_as_out_is_one_line(loop, digits_linear, tmp_path, command):
    line = fails(command, "--db", digits_linear[0], "--out", loop)
    one_line(line, "--out", str(loop), "symlink loop", "give a new folder")
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    line = fails(command, "--db", digits_linear[0], "--out", afile)
    one_line(line, "--out", str(afile), "a file, not an output folder")
    line = fails(command, "--db", digits_linear[0], "--out", afile / "sub")
    one_line(line, "--out", str(afile / "sub"), "a part of the path is a file")
    assert afile.read_text() == "mine\n" and sorted(p.name for p in tmp_path.iterdir()) == ["afile", "loop", "loop2"]


def test_a_folder_as_db_is_one_line(tmp_path):
    line = fails("sql", "--db", tmp_path, "SELECT 1")
    one_line(line, "--db", str(tmp_path), "a folder, not a database file")
    assert list(tmp_path.iterdir()) == []


# 8. the same database twice -----------------------------------------------------------------------------------------

def test_the_same_database_given_twice_is_read_once(digits_linear, tmp_path):
    db = digits_linear[0]
    (tmp_path / "link.duckdb").symlink_to(db)
    spellings = [db, Path(os.path.relpath(db)), tmp_path / "link.duckdb"]
    args = [a for p in spellings for a in ("--db", p)]
    rows = json.loads(run_cli("sql", *args, "--format", "json", "SELECT run_id FROM runs").output)
    assert rows == [{"run_id": RUN}]
