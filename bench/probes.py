"""Benchmark featstore's `linear` probes against scikit-learn's LogisticRegression (lbfgs, default C).

12 anchors with the resnet50 preset's widths, N rows of class-structured features (featstore.synthetic),
100 classes, CPU. featstore is timed end to end (`featstore probe`: read the store, train every anchor in the
same passes, predict every row, write DuckDB); scikit-learn only for its 12 fits on in-memory arrays, on the
train+val rows featstore learns from, evaluated on the same test rows. Two scikit-learn baselines are run: on
the raw features (what an unwary user runs) and on standardised features (the converged optimum; stricter).

    python bench/probes.py [--n 10000] [--classes 100] [--skip-raw]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import duckdb
import numpy as np

from featstore.probing.run import ProbeConfig, probe
from featstore.probing.split import make_split
from featstore.runtime import tune_allocator
from featstore.synthetic import class_clusters, write_feature_store

RESNET50_DIMS = [64, 256, 256, 512, 512, 1024, 1024, 1024, 1024, 2048, 2048, 2048]


def sklearn_fits(feats, labels, fit, test, standardise: bool) -> tuple[float, list[float]]:
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    accs, start = [], time.perf_counter()
    for x in feats:
        x = x.astype(np.float32)
        if standardise:
            x = StandardScaler().fit(x[fit]).transform(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf = LogisticRegression().fit(x[fit], labels[fit])
        accs.append(float(clf.score(x[test], labels[test])))
    return time.perf_counter() - start, accs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--variant", default="linear")
    parser.add_argument("--skip-raw", action="store_true", help="skip the slow raw-feature scikit-learn fits")
    args = parser.parse_args()
    tune_allocator()
    tmp = Path(tempfile.mkdtemp())
    feats, labels = class_clusters(args.n, args.classes, RESNET50_DIMS)
    write_feature_store(tmp / "bench.zarr", feats, labels, args.classes)

    start = time.perf_counter()
    probe(ProbeConfig(store=tmp / "bench.zarr", model="synthetic", db=tmp / "bench.duckdb", device="cpu",
                      variant=args.variant, progress=False))
    ours_time = time.perf_counter() - start
    con = duckdb.connect(str(tmp / "bench.duckdb"), read_only=True)
    ours = [a for (a,) in con.execute(
        "SELECT avg((p.pred = i.label)::INT) FROM predictions p JOIN images i USING (image_id) "
        "WHERE i.split = 'test' GROUP BY p.anchor ORDER BY p.anchor").fetchall()]

    split = make_split(np.arange(args.n))
    fit, test = np.isin(split, ["train", "val"]), split == "test"
    baselines = {"sklearn std": sklearn_fits(feats, labels, fit, test, standardise=True)}
    if not args.skip_raw:
        baselines["sklearn raw"] = sklearn_fits(feats, labels, fit, test, standardise=False)

    print(f"{args.n} rows x 12 anchors (resnet50 widths), {args.classes} classes, {int(fit.sum())} fit rows, "
          f"{int(test.sum())} test rows, CPU")
    print(f"  featstore {args.variant} (end to end): {ours_time:7.1f} s")
    for name, (seconds, _) in baselines.items():
        print(f"  {name:12s} (12 fits only):  {seconds:7.1f} s   ->  featstore is {seconds / ours_time:5.1f}x faster")
    header = "  anchor  dim   featstore " + " ".join(f"{n:>12s}  diff(pp)" for n in baselines)
    print(header)
    for a, dim in enumerate(RESNET50_DIMS):
        row = f"  {a:6d} {dim:5d}   {ours[a]:9.4f} "
        for _, accs in baselines.values():
            row += f" {accs[a]:12.4f}  {100 * (ours[a] - accs[a]):+8.2f}"
        print(row)
    for name, (_, accs) in baselines.items():
        worst = min(100 * (o - s) for o, s in zip(ours, accs, strict=True))
        print(f"  worst accuracy difference vs {name}: {worst:+.2f} pp  (target >= -0.5)")
    print(f"  landing 50,000 images x 12 anchors in DuckDB: {land_predictions(tmp / 'land.duckdb'):.2f} s")


def land_predictions(db: Path, n: int = 50_000, anchors: int = 12) -> float:
    """Time one run's bulk insert (600k rows) in its transaction, as `featstore probe` writes it."""
    from featstore.analytics import db as fsdb

    rng = np.random.default_rng(0)
    con = fsdb.connect(db)
    rows = fsdb.RunRows({"run_id": "bench", "model": "m", "view": "clean", "train_view": "clean", "probe": "linear",
                         "params": {}, "cross_fit": 0, "seed": 0, "store": "-"},
                        np.arange(n), rng.integers(0, 1000, (n, anchors)), rng.random((n, anchors)), None, [])
    start = time.perf_counter()
    fsdb.write_run(con, rows)
    seconds = time.perf_counter() - start
    con.close()
    return seconds


if __name__ == "__main__":
    main()
