"""How each command that computes keeps its speed when other work runs beside it.

For `demo` (end to end, a fresh output folder each time), `build` (resnet18, a few hundred generated JPEGs), `probe`
(the 1,000-class set of `bench/probes.py --shape 1000 --dims 64,128`: 36 rows a class, 2 anchors), `cost` and
`circuits` (a small random-init ViT), each run as its own `featstore` process: the time on the machine as it is
("quiet"), beside one single-threaded CPU-bound process, and beside a 2-thread torch matmul process, as ratios to the
quiet time; once under the thread policy (no --threads) and once with every core forced (--threads = cores: what every
command but `probe` did before the policy). `--baseline DIR` also times each command quietly with the code of another
checkout (e.g. `git worktree add DIR <commit before the policy>`; same virtual environment), for the target "quiet
time no worse than before" (before / now >= 0.95).

Targets (2-core machine): beside the 1-thread competitor <= 2.0x quiet; beside the 2-thread one <= 2.5x.
A contention benchmark says nothing on a machine other people are using: it prints the runnable threads of
other processes it saw before each run (besides its own competitor); run it when nothing else runs. `--quick`
runs every cell at toy sizes (a smoke run of the script, not figures).

    python bench/contention.py [--only demo,build,probe,cost,circuits] [--quick] [--baseline DIR]
                               [--conditions quiet,busy,torch2] [--modes policy,forced] [--out DIR] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

from featstore.threads import cores, runnable_elsewhere

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]  # the generated test data; bench/probes.py's set
from synthetic import make_image_folder, pooled_activations, write_feature_store  # noqa: E402

PROBE_DIMS = [64, 128]  # the anchors' widths of the probe cell
VIT = ["--model", "vit_tiny_patch16_224", "--weights", "none"]
# each says when it runs (after its first step), so that no run starts beside a competitor still importing torch
COMPETITORS = {
    "busy": "print(flush=True)\nwhile True: pass",
    "torch2": "import torch\ntorch.set_num_threads(2)\na = torch.randn(1024, 1024)\na = torch.tanh(a @ a)\n"
              "print(flush=True)\nwhile True: a = torch.tanh(a @ a)",
}
TARGETS = {"busy": 2.0, "torch2": 2.5}  # at most this many times the quiet time
BEFORE_TARGET = 0.95  # quiet: before / now at least this
# run featstore from another checkout with this interpreter: its packages mapped as its pyproject maps them,
# ahead of the editable install of this one
LAUNCHER = """
import sys
import tomllib
from importlib.machinery import PathFinder
from pathlib import Path

root = Path(sys.argv.pop(1))
dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
mapping = {name: root / folder for name, folder in dirs.items() if name}


class Finder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in mapping:  # a package: its folder, named as the last part of its name
            return PathFinder.find_spec(fullname, [str(mapping[fullname].parent)])
        parent = fullname.rpartition(".")[0]
        return PathFinder.find_spec(fullname, [str(mapping[parent])]) if parent in mapping else None


sys.meta_path.insert(0, Finder)
from featstore.cli.main import main

sys.argv[0] = "featstore"
main()
"""


@dataclass(frozen=True)
class Command:
    """One command: its arguments given the prepared inputs and a fresh output folder."""

    name: str
    args: object  # (inputs: Path, out: Path) -> list[str]


def prepare(work: Path, quick: bool) -> None:
    """The inputs every run reads (made once, not timed): 300 images for build and circuits, the 1,000-class
    probe store of `bench/probes.py --shape 1000 --dims 64,128` (36 rows a class, 2 anchors: the 12 anchors of
    resnet18's widths take over 7 minutes quiet at the exact optimum), a small ViT store for cost."""
    make_image_folder(work / "images", n_classes=10, per_class=4 if quick else 30, size=(96, 72), seed=0)
    per_class = 4 if quick else 36
    feats, labels = pooled_activations(1000, per_class, PROBE_DIMS)
    write_feature_store(work / "probe.zarr", feats, labels, 1000)
    featstore(None, ["build", *VIT, "--image-size", "64", "--data", str(work / "images"), "--limit", "16",
                     "--store", str(work / "vit.zarr"), "--no-progress"])


def commands(quick: bool) -> list[Command]:
    return [
        Command("demo", lambda w, out: ["demo", "--out", str(out), "--no-progress"]
                + (["--limit", "120", "--epochs", "1"] if quick else [])),
        Command("build", lambda w, out: ["build", "--model", "resnet18", "--weights", "none", "--data",
                                         str(w / "images"), "--store", str(out / "s.zarr"), "--no-progress"]),
        Command("probe", lambda w, out: ["probe", "--store", str(w / "probe.zarr"), "--model", "synthetic", "--db",
                                         str(out / "f.duckdb"), "--no-progress"]),
        Command("cost", lambda w, out: ["cost", "--model", "vit_tiny_patch16_224", "--store", str(w / "vit.zarr"),
                                        "--db", str(out / "f.duckdb"), "--batch-size", "1,8",
                                        "--repeats", "2" if quick else "10"]),
        Command("circuits", lambda w, out: ["circuits", *VIT, "--image-size", "64" if not quick else "32",
                                            "--data", str(w / "images"), "--db", str(out / "f.duckdb"),
                                            "--limit", "16" if quick else "64", "--ig-steps", "1" if quick else "5",
                                            "--no-progress"]),
    ]


def featstore(code: Path | None, args: list[str], threads: int | None = None) -> float:
    """Seconds one `featstore` process takes (from `code`'s checkout, or this one)."""
    args = args + (["--threads", str(threads)] if threads else [])
    argv = [sys.executable, "-m", "featstore.cli.main"] if code is None else [sys.executable, "-c", LAUNCHER, str(code)]
    start = time.perf_counter()
    done = subprocess.run(argv + args, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"featstore {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds


def timed(cmd: Command, work: Path, condition: str, threads: int | None, code: Path | None = None) -> float:
    out = Path(tempfile.mkdtemp(dir=work, prefix=f"{cmd.name}-"))
    competitor = None
    if condition in COMPETITORS:
        competitor = subprocess.Popen([sys.executable, "-c", COMPETITORS[condition]], stdout=subprocess.PIPE)
        competitor.stdout.readline()  # it runs
    try:
        return featstore(code, cmd.args(work, out), threads)
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="demo,build,probe,cost,circuits")
    parser.add_argument("--conditions", default="quiet,busy,torch2")
    parser.add_argument("--modes", default="policy,forced", help="policy: no --threads; forced: --threads = cores")
    parser.add_argument("--baseline", type=Path, help="a checkout of the code before, timed quietly beside this one")
    parser.add_argument("--quick", action="store_true", help="toy inputs: a smoke run of the script, not figures")
    parser.add_argument("--out", type=Path, help="where the inputs go [default: a temporary folder]")
    parser.add_argument("--keep", action="store_true", help="keep the inputs")
    args = parser.parse_args()
    if args.baseline is not None:
        tomllib.loads((args.baseline / "pyproject.toml").read_text())  # a checkout, or fail now
    work = Path(args.out or tempfile.mkdtemp(prefix="featstore-contention-"))
    work.mkdir(parents=True, exist_ok=True)
    prepare(work, args.quick)
    conditions, modes = args.conditions.split(","), args.modes.split(",")
    threads = {"policy": None, "forced": cores()}
    print(f"{cores()} cores; load {os.getloadavg()[0]:.2f}; runnable threads elsewhere before the runs: "
          f"{runnable_elsewhere(samples=10, interval=0.05):.1f}", flush=True)
    rows = []
    try:
        for cmd in (c for c in commands(args.quick) if c.name in args.only.split(",")):
            row = {"command": cmd.name}
            for mode in modes:
                for condition in conditions:
                    before = runnable_elsewhere(samples=5, interval=0.02)
                    row[mode, condition] = timed(cmd, work, condition, threads[mode])
                    print(f"  {cmd.name:9s} {mode:7s} {condition:7s} {row[mode, condition]:7.1f} s "
                          f"(runnable elsewhere before: {before:.1f})", flush=True)
                    if args.baseline is not None and (mode, condition) == (modes[0], "quiet"):  # side by side
                        before = runnable_elsewhere(samples=5, interval=0.02)
                        row["baseline"] = timed(cmd, work, "quiet", None, args.baseline)
                        print(f"  {cmd.name:9s} before  quiet   {row['baseline']:7.1f} s "
                              f"(runnable elsewhere before: {before:.1f})", flush=True)
            rows.append(row)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_table(rows, modes, conditions)


def print_table(rows: list[dict], modes: list[str], conditions: list[str]) -> None:
    """Markdown: per mode, the quiet seconds and each competitor's ratio to them; then before / now quietly; then
    which targets the policy meets."""
    head = ["command"]
    for mode in modes:
        head += [f"{mode}: {c}" + (" (s)" if c == "quiet" else " (x quiet)") for c in conditions]
    if any("baseline" in r for r in rows):
        head += ["before: quiet (s)", "before / now"]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        cells = [r["command"]]
        for mode in modes:
            for c in conditions:
                ratio = ratio_of(r, mode, c)
                cells.append(f"{r[mode, c]:.1f}" if ratio is None else f"{ratio:.2f}")
        if "baseline" in r:
            now = r.get(("policy", "quiet"))
            cells += [f"{r['baseline']:.1f}", f"{r['baseline'] / now:.2f}" if now else "-"]
        print("| " + " | ".join(cells) + " |")
    print()
    for r in rows:
        verdicts = [f"{c} {ratio:.2f}x <= {limit}x: {'met' if ratio <= limit else 'MISSED'}"
                    for c, limit in TARGETS.items() if (ratio := ratio_of(r, "policy", c)) is not None]
        if "baseline" in r and ("policy", "quiet") in r:
            kept = r["baseline"] / r["policy", "quiet"]
            verdicts.append(f"before / now {kept:.2f} >= {BEFORE_TARGET}: "
                            f"{'met' if kept >= BEFORE_TARGET else 'MISSED'}")
        print(f"{r['command']:9s} " + ("; ".join(verdicts) or "no target measured"))


def ratio_of(row: dict, mode: str, condition: str) -> float | None:
    """A competitor's time over the quiet time of the same mode (None for the quiet cell or without one)."""
    if condition == "quiet" or (mode, "quiet") not in row or (mode, condition) not in row:
        return None
    return row[mode, condition] / row[mode, "quiet"]


if __name__ == "__main__":
    main()
