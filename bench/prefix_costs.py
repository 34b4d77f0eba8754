"""How `featstore cost`'s measured prefix times grow with depth (a timing, so a benchmark rather than a test,
which would fail under load). Measures resnet18's 12 preset anchors at one batch size a few times and
prints each anchor's prefix time as a ratio of the full forward's, with the Spearman rank correlation of the
times against the anchors' order (1.0: strictly growing) and the runnable threads of other processes before
each repeat (on a busy machine the ranks of the short early prefixes swap).

    python bench/prefix_costs.py [--crop 64] [--batch 2] [--repeats 7] [--runs 3]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torchvision

from featstore.compute.prefix_costs import measure_costs
from featstore.nets.anchors import PRESETS, resolve_anchors
from featstore.threads import runnable_elsewhere


def spearman(values: list[float]) -> float:
    """Rank correlation of `values` with their order (average ranks are not needed: times do not tie)."""
    ranks = np.argsort(np.argsort(values))
    return float(np.corrcoef(ranks, np.arange(len(values)))[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crop", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7, help="timed forwards per anchor (measure_costs)")
    parser.add_argument("--runs", type=int, default=3, help="independent measurements")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    anchors = resolve_anchors(model, PRESETS["resnet18"])
    for run in range(args.runs):
        busy = runnable_elsewhere()
        cost = measure_costs(model, anchors, args.crop, 10, torch.device("cpu"), args.batch, repeats=args.repeats)
        ms = [a.ms for a in cost.anchors]
        ratios = " ".join(f"{m / cost.ms:.2f}" for m in ms)
        print(f"run {run}: runnable elsewhere {busy:.1f}; full forward {cost.ms:.2f} ms; prefix / full: {ratios}; "
              f"Spearman with depth {spearman(ms):.2f}")


if __name__ == "__main__":
    main()
