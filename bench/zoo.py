"""A small end-to-end zoo (a benchmark, not CI): four tiny timm ViTs (`test_vit`: 6 blocks, 2 heads, width 64)
trained on the digits that scikit-learn ships (upsampled to 64 px) with different amounts of training and label
noise, then `featstore zoo` on the held-out digits (ID) and three corruption views of them (OOD). Prints the
models' accuracies and the correlation table (`zoo_eval`, τ = 0.3) and the DDB τ sweep.

    python bench/zoo.py [--out /tmp/featstore-zoo] [--limit 200] [--ig-steps 5] [--threads 1]

With four models a correlation takes few values (Spearman in steps of 0.2): the table shows the pipeline runs
and what it reports, not the paper's numbers, which need zoos of 72-144 models.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np
import polars as pl
import timm
import torch

from featstore.analytics.queries import query
from featstore.compute.specs import RunOptions
from featstore.images.datasets import discover
from featstore.nets.models import load_model
from featstore.workflows.demo import clean_batch, digits_image_folder
from featstore.workflows.zoo import ZooConfig, run_zoo

ARCH, SIZE = "test_vit", 64
MODELS = (("e1", 1, 0.0), ("e3", 3, 0.0), ("e12", 12, 0.0), ("e12-noisy", 12, 0.4))  # name, epochs, label noise
OOD = (("noise", "gaussian_noise-3"), ("blur", "gaussian_blur-2"), ("bright", "brightness-4"))


def split_digits(out: Path) -> tuple[Path, Path]:
    """digits/ as two ImageFolders: every third image of each class held out (the ID set), the rest to train."""
    train, test = out / "digits-train", out / "digits-test"
    if not test.exists():
        digits_image_folder(train, size=SIZE)
        for folder in sorted(train.iterdir()):
            (test / folder.name).mkdir(parents=True)
            for path in sorted(folder.iterdir())[::3]:
                shutil.move(path, test / folder.name / path.name)
    return train, test


def train(data: Path, target: Path, epochs: int, noise: float, seed: int = 0) -> None:
    """AdamW on the train folder with featstore's preprocessing; `noise` of the labels replaced at random."""
    torch.manual_seed(seed)
    prep = load_model(ARCH, weights="none", image_size=SIZE).preprocessing
    images = discover(data)
    x = clean_batch(images, prep)
    y = torch.from_numpy(images.labels).clone()
    rng = np.random.default_rng(seed)
    flip = torch.from_numpy(rng.random(len(y)) < noise)
    y[flip] = torch.from_numpy(rng.integers(0, 10, int(flip.sum())))
    model = timm.create_model(ARCH, img_size=SIZE, num_classes=10)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(order), 64):
            batch = order[i : i + 64]
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    torch.save(model.state_dict(), target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/featstore-zoo"))
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--ig-steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    train_dir, test_dir = split_digits(args.out)
    for name, epochs, noise in MODELS:
        if not (args.out / f"{name}.pth").exists():
            train(train_dir, args.out / f"{name}.pth", epochs, noise)
    trained = time.perf_counter() - start
    lines = ['study = "digits-zoo"', f'[id]\ndata = "{test_dir.name}"']
    lines += [f'[[ood]]\nname = "{name}"\nview = "{view}"' for name, view in OOD]
    lines += [f'[[models]]\nname = "{name}"\nmodel = "{ARCH}"\nweights = "{name}.pth"\nimage_size = {SIZE}'
              for name, _, _ in MODELS]
    config = args.out / "zoo.toml"
    config.write_text("\n\n".join(lines) + "\n")
    db = args.out / "zoo.duckdb"
    db.unlink(missing_ok=True)
    start = time.perf_counter()
    result = run_zoo(ZooConfig(config, db, ig_steps=args.ig_steps, limit=args.limit,
                               run=RunOptions(device="cpu", workers=0, batch_size=50, progress=False)))
    scored = time.perf_counter() - start
    pl.Config.set_tbl_rows(100)
    pl.Config.set_tbl_cols(12)
    pl.Config.set_tbl_width_chars(150)
    print(f"training {trained:.0f} s, zoo (accuracies + {len(result.runs)} circuits) {scored:.0f} s; "
          f"limit {args.limit} images per set, m = {args.ig_steps}")
    accuracy = query(db, "SELECT model, dataset, round(accuracy, 3) AS accuracy FROM zoo_runs ORDER BY ALL")
    print(accuracy.pivot(on="dataset", index="model", values="accuracy"))
    print(result.table.drop("study", "tau").with_columns(pl.col("r2", "spearman", "kendall").round(3)))
    sweep = query(db, "SELECT ood_set, metric, tau, round(r2, 3) AS r2, round(spearman, 3) AS spearman, "
                      "round(kendall, 3) AS kendall FROM zoo_tau_sweep() WHERE metric = 'ddb_out'")
    print(sweep)


if __name__ == "__main__":
    main()
