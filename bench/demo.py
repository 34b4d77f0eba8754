"""The first `featstore demo` run's stage times, this code against another (a worktree with its own environment),
side by side on this machine, as ratios, with the load average the machine had meanwhile.

Each run is `featstore demo --out <fresh folder> --no-progress` in a process of its own (a first run: the images
written, the network trained, the store built, every probe fitted); the versions alternate within each round (the
order flips every round) to spread the machine's noise over both. Printed per stage: the median of the rounds for
each version, the ratio now / before, and the load; then the time outside the printed stages (Python's and the
libraries' start-up, the summary's queries, the exit), the command's wall time and its CPU time; then whether every
run trained the same network (sha256 of its weights file) and printed the same k-sweep and corruption shift (a
faster demo that tells the user something else is no faster demo). Give the baseline as a git worktree of the
commit to compare with, with a virtual environment of its own in `.venv` where that worktree is installed
(docs/benchmarks.md#the-demo says how the table there was made).

    python bench/demo.py --baseline /tmp/featstore-before [--rounds 2] [--out /tmp/bench-demo]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

STAGES = ("data", "train", "build", "probe", "gate", "cost", "cka", "report", "total")


def load() -> float:
    """The 1-minute load average (how busy the machine was: this bench itself adds about 2 on a 2-core machine)."""
    return os.getloadavg()[0]


def run_demo(featstore: Path, out: Path) -> dict:
    """One first run into an empty `out`: its printed stage times (s), its CPU seconds, the load before and after,
    and what it printed between the k-sweep's title and its timings (the sweep and the corruption shift)."""
    shutil.rmtree(out, ignore_errors=True)
    before_load, cpu_before = load(), resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([str(featstore), "demo", "--out", str(out), "--no-progress"], capture_output=True,
                          text=True, cwd=out.parent, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{featstore} demo failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("time: "))
    times = {stage: float(s) for stage, s in re.findall(r"(\w+) (\d+(?:\.\d+)?)s", line)}
    printed = done.stdout.split("Where the clean")[1].split("time:")[0]
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    network = hashlib.sha256(next(out.glob("*/resnet18-e*.pth")).read_bytes()).hexdigest()
    return {"times": times, "wall": wall, "cpu": cpu, "load": (before_load + load()) / 2, "printed": printed,
            "network": network}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, required=True,
                        help="a worktree of the code to compare with, installed in its own .venv")
    parser.add_argument("--now", type=Path, default=Path(sys.executable).parent / "featstore",
                        help="this code's featstore command (default: beside this interpreter)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("/tmp/featstore-bench-demo"))
    args = parser.parse_args()
    versions = {"before": args.baseline / ".venv" / "bin" / "featstore", "now": args.now}
    for name, command in versions.items():
        if not command.exists():
            sys.exit(f"no {command} for {name}: give a worktree with its own .venv (see this file's docstring)")
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {name: [] for name in versions}
    print(f"cores {os.cpu_count()}, load at start {load():.1f}", flush=True)
    for r in range(args.rounds):
        order = list(versions) if r % 2 == 0 else list(reversed(versions))
        for name in order:
            got = run_demo(versions[name], args.out / f"{name}-{r}")
            results[name].append(got)
            print(f"round {r + 1} {name:6s}: {got['wall']:.1f} s wall, {got['cpu']:.1f} s CPU, load "
                  f"{got['load']:.1f}: " + ", ".join(f"{s} {t:g}s" for s, t in got["times"].items()), flush=True)
    print("\n| stage | before (s) | now (s) | now / before |\n|---|---|---|---|")
    rows = {**{stage: lambda g, s=stage: g["times"].get(s, 0.0) for stage in STAGES},
            "outside the stages": lambda g: g["wall"] - g["times"].get("total", 0.0),
            "wall (the command)": lambda g: g["wall"], "CPU (process)": lambda g: g["cpu"]}
    for label, value in rows.items():
        med = {name: statistics.median(value(g) for g in runs) for name, runs in results.items()}
        ratio = f"{med['now'] / med['before']:.2f}x" if med["before"] else "-"
        print(f"| {label} | {med['before']:.1f} | {med['now']:.1f} | {ratio} |")
    loads = [g["load"] for runs in results.values() for g in runs]
    print(f"\nload average over the runs {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores "
          f"(medians of {args.rounds} rounds)")
    networks = {g["network"] for runs in results.values() for g in runs}
    print(f"the same network trained by every run (sha256 {next(iter(networks))[:16]}...)" if len(networks) == 1
          else f"the trained network differs between runs ({len(networks)} versions)")
    same = {g["printed"] for runs in results.values() for g in runs}
    print("the same k-sweep and corruption shift printed by every run" if len(same) == 1 else
          f"the printed k-sweep or corruption shift differs between runs ({len(same)} versions)")


if __name__ == "__main__":
    main()
