"""The CPU knobs besides the thread count, each timed on the machine as it is and beside one busy
single-threaded process, in fresh processes, the settings of one knob interleaved (A B C A B C ...) so that a
change of the machine's load falls on all of them alike:

- `wait`: OpenMP's wait policy (OMP_WAIT_POLICY unset = libgomp's default, PASSIVE, ACTIVE) on a resnet18
  forward (few large kernels) and on many small softmax-regression steps (what L-BFGS on narrow anchors does),
  at 2 threads (with one, the policy's choice beside a busy process on 2 cores, no OpenMP worker waits);
- `interop`: torch's inter-op pool (default: one thread per core) against one thread, on the same forward;
- `decoders`: `featstore build --workers 0 | 1 | 2` (image decoders take turns with the forward on the CPU);
- `duckdb`: DuckDB's threads (its default, one per core, against 1) landing one probe run's rows (600k) right
  after torch computed in the same process, as `featstore probe` does.

Prints wall and CPU seconds (every thread's: spinning OpenMP workers show there) per setting, medians of the
repeats, and their ratios to the first (default) setting, per condition. On a
shared machine the figures say little: it prints the runnable threads of other processes before each cell.

    python bench/knobs.py [--only wait,interop,decoders,duckdb] [--repeats 2] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from featstore.threads import runnable_elsewhere

ROOT = Path(__file__).resolve().parents[1]
BUSY = "print(flush=True)\nwhile True: pass"

# one cell: prints its seconds; {threads} None = the thread policy, else pinned; {work} picks the workload
CELL = """
import sys, time
sys.path.insert(0, {tests!r})
import torch
from featstore.threads import ThreadPolicy
if {interop} is not None:
    torch.set_num_interop_threads({interop})
work, threads, scale = {work!r}, {threads}, {scale}
torch.manual_seed(0)
if work == "forward":
    import torchvision
    model = torchvision.models.resnet18().eval()
    x = torch.randn(32, 3, 64, 64)
    steps = lambda: model(x)  # noqa: E731
    n = 6 * scale
elif work == "small":
    x, y = torch.randn(2000, 128), torch.randint(0, 100, (2000,))
    w = torch.zeros(128, 100, requires_grad=True)
    def steps():
        loss = torch.nn.functional.cross_entropy(x @ w, y)
        loss.backward()
        w.grad = None
    n = 150 * scale
with torch.inference_mode(work == "forward"), ThreadPolicy(threads) as policy:
    steps()  # warm up
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        policy.update()
        steps()
    print(time.perf_counter() - start, time.process_time() - cpu)
"""

DUCKDB_CELL = """
import sys, time
sys.path.insert(0, {tests!r})
import duckdb
import numpy as np
import torch
from featstore.analytics import db as fsdb
from synthetic import run_rows
a = torch.randn(512, 512)
for _ in range(20):
    a = torch.tanh(a @ a)  # torch's OpenMP pool is up, as after a probe's fit
rng = np.random.default_rng(0)
n = {rows}
rows = run_rows({{"run_id": "bench", "model": "m", "view": "clean"}}, np.arange(n), rng.integers(0, 1000, (n, 12)),
                rng.random((n, 12)))
con = fsdb.connect({db!r})
if {threads} is not None:  # featstore's connections are sealed (no SET): the same settings, threads pinned
    con.close()
    con = duckdb.connect({db!r}, config={{**fsdb.SEALED, "threads": {threads}}})
start, cpu = time.perf_counter(), time.process_time()
fsdb.write_runs(con, [rows])
print(time.perf_counter() - start, time.process_time() - cpu)
con.close()
"""


def seconds(code: str, env: dict[str, str], busy: bool) -> tuple[float, float]:
    """One cell in a fresh process (beside a busy one when `busy`): wall and CPU seconds (every thread's; the
    spinning of OpenMP workers shows there)."""
    competitor = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE) if busy else None
    try:
        if competitor is not None:
            competitor.stdout.readline()  # it runs
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", **env})
        if done.returncode != 0:
            raise SystemExit(f"a cell failed:\n{done.stderr[-2000:]}")
        wall, cpu = done.stdout.strip().splitlines()[-1].split()
        return float(wall), float(cpu)
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()


def build_cell(images: Path, out: Path, workers: int) -> str:
    """`featstore build` of the images with `workers` decoders, timed in its own process."""
    return (f"import sys, time, shutil\nfrom featstore.cli.main import main\nsys.argv = ['featstore', 'build', "
            f"'--model', 'resnet18', '--weights', 'none', '--image-size', '64', '--data', {str(images)!r}, "
            f"'--store', {str(out)!r}, '--workers', '{workers}', '--no-progress']\n"
            f"start, cpu = time.perf_counter(), time.process_time()\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print(time.perf_counter() - start, time.process_time() - cpu)\n"
            f"shutil.rmtree({str(out)!r}, ignore_errors=True)\n")


def knobs(tmp: Path, quick: bool) -> dict[str, dict[str, tuple[str, dict[str, str]]]]:
    """knob -> setting -> (code, environment); the first setting of each knob is the default."""
    tests, scale = str(ROOT / "tests"), 1 if quick else 4
    cell = lambda work, threads=None, interop=None: CELL.format(  # noqa: E731
        tests=tests, work=work, threads=threads, scale=scale, interop=interop)
    out = {"wait": {}, "interop": {}, "decoders": {}, "duckdb": {}}
    for work in ("forward", "small"):  # at 2 threads: with one (the policy's choice beside a busy process) no
        for policy in ("unset", "PASSIVE", "ACTIVE"):  # OpenMP worker waits at all
            env = {} if policy == "unset" else {"OMP_WAIT_POLICY": policy}
            out["wait"][f"{work} {policy}"] = (cell(work, 2), env)
    for interop in (None, 1):
        out["interop"][f"forward interop={interop or 'default'}"] = (cell("forward", 2, interop), {})
    sys.path.insert(0, tests)
    from synthetic import make_image_folder

    images = make_image_folder(tmp / "images", n_classes=4, per_class=8 if quick else 40, size=(96, 72))
    for workers in (2, 1, 0):
        out["decoders"][f"build --workers {workers}"] = (build_cell(images, tmp / "s.zarr", workers), {})
    for threads in (None, 1):
        db = tmp / f"land{threads}.duckdb"
        code = DUCKDB_CELL.format(tests=tests, rows=60_000 if quick else 600_000, db=str(db), threads=threads)
        out["duckdb"][f"land 12 anchors, duckdb threads={threads or 'default'}"] = (
            code + f"\nimport os\nos.remove({str(db)!r})\n", {})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="wait,interop,decoders,duckdb")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="toy sizes: a smoke run of the script")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="featstore-knobs-"))
    table = knobs(tmp, args.quick)
    for knob in args.only.split(","):
        settings = table[knob]
        times: dict[tuple[str, bool], list[tuple[float, float]]] = {}
        for _ in range(args.repeats):
            for busy in (False, True):
                for name, (code, env) in settings.items():
                    before = runnable_elsewhere(samples=5, interval=0.02)
                    times.setdefault((name, busy), []).append(seconds(code, env, busy))
                    wall, cpu = times[name, busy][-1]
                    print(f"  {knob:8s} {name:40s} {'busy' if busy else 'as is':5s} {wall:7.2f} s wall {cpu:7.2f} s "
                          f"CPU (runnable elsewhere before: {before:.1f})", flush=True)
        print(f"\n| {knob} | as is: wall s (x first) | CPU s (x first) | beside a busy process: wall s (x first) | "
              "CPU s (x first) |\n|---|---|---|---|---|")
        first: dict[tuple[str, bool], tuple[float, float]] = {}
        for name in settings:
            cells = [name]
            for busy in (False, True):
                wall = statistics.median(w for w, _ in times[name, busy])
                cpu = statistics.median(c for _, c in times[name, busy])
                group = name.rsplit(" ", 1)[0] if knob == "wait" else knob  # wait: compare within a workload
                base_wall, base_cpu = first.setdefault((group, busy), (wall, cpu))
                cells += [f"{wall:.2f} ({wall / base_wall:.2f})", f"{cpu:.2f} ({cpu / base_cpu:.2f})"]
            print("| " + " | ".join(cells) + " |")
        print(flush=True)

if __name__ == "__main__":
    main()
