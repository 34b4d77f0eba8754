"""Benchmark what a command costs before it answers: each command's whole process (Python start, imports,
opening the database, the answer), median of several runs, beside DuckDB's own open-and-answer and beside the code
before the change (another checkout with its own environment, `--base`).

Each featstore gets its own copy of the database, opened once for writing by that featstore first, so that each
reads a file holding its own version's definitions (as a database its own jobs wrote does).

    python bench/startup.py --db /work/demo/layouts/featstore.duckdb --base ../base/.venv/bin/featstore [--runs 5]
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

HERE = Path(sys.executable).parent / "featstore"


def timed(argv: list[str], runs: int) -> float:
    """Median wall-clock seconds of `argv` as a whole process (its output discarded)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def written_copy(db: Path, featstore: Path, folder: Path) -> Path:
    """A copy of `db` opened once for writing by `featstore`'s own Python (its definitions put in the file)."""
    copy = folder / db.name
    shutil.copy(db, copy)
    python = featstore.parent / "python"
    subprocess.run([str(python), "-c", "import sys; from featstore.analytics.db import connect; "
                    "connect(sys.argv[1]).close()", str(copy)], check=True, cwd=folder)
    return copy


def commands(featstore: Path, db: Path, scratch: Path) -> dict[str, list[str]]:
    return {
        "featstore --help": [str(featstore), "--help"],
        'featstore sql "SELECT 1"': [str(featstore), "sql", "--db", str(db), "SELECT 1"],
        "featstore timeline": [str(featstore), "timeline", "--db", str(db)],
        "build refused (no --data folder)": [str(featstore), "build", "--model", "resnet18", "--data",
                                             str(scratch / "missing"), "--store", str(scratch / "store")],
        "probe refused (no --store)": [str(featstore), "probe", "--store", str(scratch / "missing.zarr"), "--model",
                                       "resnet18", "--db", str(scratch / "p.duckdb")],
        "build refused (unknown --views)": [str(featstore), "build", "--model", "resnet18", "--data", str(scratch),
                                            "--views", "fog-9", "--store", str(scratch / "store")],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True, help="a featstore database (copied, never written)")
    parser.add_argument("--base", type=Path, required=True, help="the featstore command of the code before")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "new").mkdir()
        (tmp_path / "base").mkdir()
        new_db = written_copy(args.db, HERE, tmp_path / "new")
        base_db = written_copy(args.db, args.base, tmp_path / "base")
        duck = [sys.executable, "-c", "import duckdb, sys; duckdb.connect(sys.argv[1], read_only=True)"
                ".execute('SELECT 1').fetchall()", str(new_db)]
        load = os.getloadavg()
        duck_s = timed(duck, args.runs)
        print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores; median of "
              f"{args.runs} runs")
        print(f"DuckDB's own open-and-answer: {duck_s:.2f} s")
        print("| command | now (s) | before (s) | now / before | now / DuckDB |")
        print("|---|---:|---:|---:|---:|")
        for (name, argv), base_argv in zip(commands(HERE, new_db, tmp_path / "new").items(),
                                           commands(args.base, base_db, tmp_path / "base").values(), strict=True):
            now, before = timed(argv, args.runs), timed(base_argv, args.runs)
            print(f"| {name} | {now:.2f} | {before:.2f} | {now / before:.2f} | {now / duck_s:.1f} |")
        end = os.getloadavg()
        print(f"load average at the end {end[0]:.1f} {end[1]:.1f} {end[2]:.1f}")


if __name__ == "__main__":
    main()
