"""Benchmark featstore's default `linear` probe against scikit-learn, side by side in one run, CPU.

Three shapes (`--shape`):
- `digits`: scikit-learn's 1,797 digits through a random-init resnet18 at 32 px (`featstore build`), its 12
  preset anchors (widths 64-512), 10 classes;
- `100` (default): 10,000 rows, 100 classes, 12 anchors of the resnet50 preset's widths (`class_clusters`);
- `1000`: ImageNet-shaped, 1,000 classes x 36 rows, 12 anchors of the resnet18 preset's widths, features with a
  few dominant directions as pooled activations have (`pooled_activations`).
`--dims 64,512` replaces the preset widths (a shorter run). featstore is timed end to end (`featstore probe`:
read the store, choose C and solve every anchor, predict every row, write DuckDB). Against it, on the same
standardised rows and the same 70/30 split with its val part:
- **agreement**: scikit-learn `LogisticRegression(C=<featstore's C>, tol=1e-8, max_iter=10000)` fitted on
  train + val, the exact optimum of the same objective: the share of test images where both predict the same
  class (target >= 99.5 %), and the decision-layer fractions (early, mid, late, never stable) at k = 1..4 of
  both (target: within 0.005);
- **accuracy**: scikit-learn's own default, C = 1 at tol 1e-4 (target: featstore >= it - 0.5 pp per anchor);
- **speed**: scikit-learn's loop over the same grid of C with the same val rows (each C fitted on the train
  rows, default tol, scored by the val log-loss, the best refitted on train + val): its time over featstore's
  (targets >= 1x at 100 classes, >= 2x at 1,000).
`--threads 1,2` also runs featstore at each pinned thread count and prints how many predictions and decision
layers differ between them. `--contention` adds featstore beside a competing 2-thread process.

    python bench/probes.py [--shape digits|100|1000] [--dims 64,512] [--exact 0,5,11] [--threads 1,2] [--contention]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import duckdb
import numpy as np

from featstore.compute.specs import RunOptions
from featstore.probing.split import make_split
from featstore.probing.strength import StrengthGrid
from featstore.runtime import tune_allocator
from featstore.threads import cores, idle_cores, runnable_elsewhere
from featstore.workflows.probe import ProbeConfig, probe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the generated test data
from synthetic import class_clusters, pooled_activations, run_rows, write_feature_store  # noqa: E402

RESNET50_DIMS = [64, 256, 256, 512, 512, 1024, 1024, 1024, 1024, 2048, 2048, 2048]
RESNET18_DIMS = [64, 64, 64, 64, 128, 128, 256, 256, 512, 512, 512, 512]
# it says when it runs (after its first product): a run started beside a competitor still importing torch would see
# idle cores and take them until its next pass (this waited a fixed 1 s, less than torch's import takes here)
COMPETITOR = ("import torch; torch.set_num_threads(2); a = torch.randn(1024, 1024); a = torch.tanh(a @ a)\n"
              "print(flush=True)\nwhile True: a = torch.tanh(a @ a)")


def digits_features(tmp: Path) -> tuple[Path, str, list[np.ndarray], np.ndarray]:
    """The digits through a random-init resnet18, stored by `featstore build`."""
    from featstore.store.reader import FeatureStore
    from featstore.workflows.demo import digits_image_folder

    data = digits_image_folder(tmp / "images", size=32)
    subprocess.run([sys.executable, "-m", "featstore.cli.main", "build", "--model", "resnet18", "--weights", "none",
                    "--image-size", "32", "--data", str(data), "--store", str(tmp / "bench.zarr"), "--no-progress"],
                   check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    fs = FeatureStore(tmp / "bench.zarr")
    feats = [fs.read("resnet18", "clean", a.name) for a in fs.anchors("resnet18")]
    return tmp / "bench.zarr", "resnet18", feats, fs.image_table()["label"]


def featstore_run(store: Path, model: str, db: Path, threads: int | None = None) -> tuple[float, dict]:
    """Seconds end to end, and the run: predictions [images, anchors] in image order, per-anchor fit info."""
    start = time.perf_counter()
    probe(ProbeConfig(store=store, model=model, db=db, run=RunOptions(device="cpu", progress=False,
                                                                      threads=threads)))
    seconds = time.perf_counter() - start
    con = duckdb.connect(str(db), read_only=True)
    got = con.execute("SELECT image_id, anchor, pred FROM predictions ORDER BY image_id, anchor").fetchnumpy()
    infos = [json.loads(i) for (i,) in con.execute("SELECT info FROM probe_fits ORDER BY anchor").fetchall()]
    con.close()
    n = len(np.unique(got["image_id"]))
    return seconds, {"pred": got["pred"].reshape(n, -1), "info": infos}


def decision_layers(preds: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """l*(k) per row (docs/design.md §7) and whether it is never stable."""
    t = preds.shape[1] - 1
    stable = np.stack([(preds[:, a : a + k + 1] == preds[:, a : a + 1]).all(axis=1) for a in range(t - k + 1)],
                      axis=1)
    never = ~stable.any(axis=1)
    return np.where(never, t, stable.argmax(axis=1)), never


def fractions(preds: np.ndarray, k: int) -> np.ndarray:
    t = preds.shape[1] - 1
    layer, never = decision_layers(preds, k)
    return np.array([(layer < 0.3 * t).mean(), ((layer >= 0.3 * t) & (layer < 0.7 * t)).mean(),
                     (layer >= 0.7 * t).mean(), never.mean()])


def standardised(x: np.ndarray, fit: np.ndarray) -> np.ndarray:
    from sklearn.preprocessing import StandardScaler

    return StandardScaler().fit(x[fit].astype(np.float64)).transform(x.astype(np.float64))


def sklearn_grid_loop(zs, labels, train, val, fit, grid) -> tuple[float, list[float]]:
    """scikit-learn's loop over the grid with the same val rows; seconds (fits only) and the C chosen per anchor."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    chosen, start = [], time.perf_counter()
    for z in zs:
        losses = {}
        for c in grid:
            m = LogisticRegression(C=c).fit(z[train], labels[train])
            losses[c] = log_loss(labels[val], m.predict_proba(z[val]), labels=m.classes_)
        best = min(losses, key=losses.get)
        LogisticRegression(C=best).fit(z[fit], labels[fit])
        chosen.append(best)
    return time.perf_counter() - start, chosen


def main() -> None:
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=("digits", "100", "1000"), default="100")
    parser.add_argument("--dims", help="comma list of anchor widths instead of the preset's (a shorter run)")
    parser.add_argument("--exact", help="anchors to check against the exact solver (default: all)")
    parser.add_argument("--threads", help="also run featstore pinned at each of these thread counts, e.g. 1,2")
    parser.add_argument("--skip-loop", action="store_true", help="skip scikit-learn's grid loop (the speed ratio)")
    parser.add_argument("--contention", action="store_true", help="also time featstore with a competing process")
    args = parser.parse_args()
    warnings.simplefilter("ignore", ConvergenceWarning)
    tune_allocator()
    tmp = Path(tempfile.mkdtemp())
    if args.shape == "digits":
        store, model, feats, labels = digits_features(tmp)
    else:
        if args.shape == "1000":
            dims = [int(d) for d in args.dims.split(",")] if args.dims else RESNET18_DIMS
            feats, labels = pooled_activations(1000, 36, dims)
        else:
            dims = [int(d) for d in args.dims.split(",")] if args.dims else RESNET50_DIMS
            feats, labels = class_clusters(10_000, 100, dims)
        store, model = write_feature_store(tmp / "bench.zarr", feats, labels, int(labels.max()) + 1), "synthetic"
    dims = [f.shape[1] for f in feats]
    split = make_split(np.arange(len(labels)))
    train, val, test = split == "train", split == "val", split == "test"
    fit = train | val
    print(f"{args.shape}: {len(labels)} rows x {len(dims)} anchors (widths {','.join(map(str, dims))}), "
          f"{int(labels.max()) + 1} classes, {int(train.sum())} train / {int(val.sum())} val / {int(test.sum())} "
          f"test rows; CPU, {cores()} cores, other runnable threads now {runnable_elsewhere():.1f}, load "
          f"{os.getloadavg()[0]:.1f}", flush=True)

    cpu = time.process_time()
    ours_time, ours = featstore_run(store, model, tmp / "bench.duckdb")
    ours_cpu = time.process_time() - cpu
    grid = list(StrengthGrid().values())
    print(f"  featstore linear (end to end): {ours_time:.1f} s ({ours_cpu:.1f} CPU s); grid of {len(grid)} C",
          flush=True)

    zs = [standardised(x, fit) for x in feats]
    if not args.skip_loop:
        cpu = time.process_time()
        loop_time, loop_c = sklearn_grid_loop(zs, labels, train, val, fit, grid)
        loop_cpu = time.process_time() - cpu
        print(f"  scikit-learn grid loop (fits only): {loop_time:.1f} s ({loop_cpu:.1f} CPU s) -> featstore is "
              f"{loop_time / ours_time:.2f}x faster (CPU time {loop_cpu / ours_cpu:.2f}x); load now "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        same_c = sum(a["C"] == c for a, c in zip(ours["info"], loop_c, strict=True))
        print(f"  the same C as scikit-learn's loop at {same_c} of {len(dims)} anchors", flush=True)

    exact_anchors = [int(a) for a in args.exact.split(",")] if args.exact else list(range(len(dims)))
    print("  anchor  dim      C  passes  precision  agree-exact  acc(featstore)  acc(sk C=1)  diff(pp)")
    theirs = ours["pred"].copy()
    for a in range(len(dims)):
        info, z = ours["info"][a], zs[a]
        acc = (ours["pred"][test, a] == labels[test]).mean()
        default = LogisticRegression().fit(z[fit], labels[fit]).score(z[test], labels[test])
        agree = "-"
        if a in exact_anchors:
            theirs[:, a] = LogisticRegression(C=info["C"], tol=1e-8, max_iter=10_000).fit(z[fit], labels[fit]
                                                                                          ).predict(z)
            agree = f"{(theirs[test, a] == ours['pred'][test, a]).mean():.4f}"
        print(f"  {a:6d} {dims[a]:4d} {info['C']:6g} {info['lbfgs_iterations']:7d} {info['precision']:>10s} "
              f"{agree:>12s} {acc:15.4f} {default:12.4f} {100 * (acc - default):+9.2f}", flush=True)
    if len(exact_anchors) == len(dims):
        for k in range(1, min(4, len(dims) - 1) + 1):
            diff = np.abs(fractions(ours["pred"][test], k) - fractions(theirs[test], k))
            print(f"  k={k}: early/mid/late/never featstore {np.round(fractions(ours['pred'][test], k), 4)}, "
                  f"exact {np.round(fractions(theirs[test], k), 4)}, largest difference {diff.max():.4f} "
                  f"(target <= 0.005)")

    if args.threads:
        runs = {t: featstore_run(store, model, tmp / f"t{t}.duckdb", int(t)) for t in args.threads.split(",")}
        (ta, (sa, ra)), (tb, (sb, rb)) = list(runs.items())[:2]
        same = (ra["pred"] == rb["pred"]).mean()
        layers = [int((decision_layers(ra["pred"], k)[0] != decision_layers(rb["pred"], k)[0]).sum())
                  for k in range(1, min(4, len(dims) - 1) + 1)]
        print(f"  --threads {ta}: {sa:.1f} s, --threads {tb}: {sb:.1f} s; identical predictions {same:.6f} "
              f"({int((ra['pred'] != rb['pred']).sum())} of {ra['pred'].size} differ); images whose l*(k) differs at "
              f"k=1..4: {layers}; the same C at every anchor: "
              f"{[i['C'] for i in ra['info']] == [i['C'] for i in rb['info']]}", flush=True)
    if args.contention:
        contention(store, model, tmp, ours_time)
    if args.shape == "100":
        print(f"  landing 50,000 images x 12 anchors in DuckDB: {land_predictions(tmp / 'land.duckdb'):.2f} s")


def contention(store: Path, model: str, tmp: Path, quiet_seconds: float) -> None:
    """featstore's time per thread setting, on the machine as it is and with a competing 2-thread process."""
    print(f"\n  threads under contention ({cores()} cores; other runnable threads now: "
          f"{runnable_elsewhere():.1f}; the machine is shared, so 'as is' is not idle)")
    print("  threads            as is (s)   + competitor (s)   ratio")
    settings = {"policy": None, f"all ({cores()})": cores(), "1": 1}
    for name, threads in settings.items():
        if threads == 1 and idle_cores() == 1:
            continue  # the policy's run above was this one
        quiet = quiet_seconds if threads is None else featstore_run(store, model, tmp / f"q{name}.duckdb",
                                                                    threads)[0]
        competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR], stdout=subprocess.PIPE)
        try:
            competitor.stdout.readline()  # it runs
            busy = featstore_run(store, model, tmp / f"c{name}.duckdb", threads)[0]
        finally:
            competitor.kill()
            competitor.wait()
        print(f"  {name:16s} {quiet:10.1f}   {busy:15.1f}   {busy / quiet:6.2f}x")


def land_predictions(db: Path, n: int = 50_000, anchors: int = 12) -> float:
    """Time one run's bulk insert (600k rows) in its transaction, as `featstore probe` writes it."""
    from featstore.analytics import db as fsdb

    rng = np.random.default_rng(0)
    con = fsdb.connect(db)
    rows = run_rows({"run_id": "bench", "model": "m", "view": "clean"}, np.arange(n),
                    rng.integers(0, 1000, (n, anchors)), rng.random((n, anchors)))
    start = time.perf_counter()
    fsdb.write_runs(con, [rows])
    seconds = time.perf_counter() - start
    con.close()
    return seconds


if __name__ == "__main__":
    main()
