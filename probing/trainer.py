"""The streaming trainer: every epoch reads each block of rows once and updates every anchor's probe."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from featstore.probing.base import AnchorContext, FittedProbe, ProbeVariant
from featstore.probing.source import FeatureSource


@dataclass
class FitRows:
    """Row positions (into the store) of one fit: train rows, val rows, and their labels."""

    train: np.ndarray
    val: np.ndarray
    labels: np.ndarray  # label of every row of the store, by position


def fit_probes(source: FeatureSource, variant: ProbeVariant, rows: FitRows, num_classes: int, seed: int,
               progress: str | None = None) -> list[FittedProbe]:
    """Fit one probe per anchor of `source`, all in the same passes over the data."""
    device = source.device
    trains_on_val = variant.plan(len(rows.train)).train_on_val
    fit = np.concatenate([rows.train, rows.val]) if trains_on_val else rows.train
    plan = variant.plan(len(fit))
    stats = source.stats(rows.train, seed=seed)
    probes = [variant.make(AnchorContext(anchor=a, dim=d, num_classes=num_classes, n_train=len(rows.train),
                                         n_fit=len(fit), stats=stats[a], device=device, seed=seed))
              for a, d in enumerate(source.dims)]
    val_x = source.gather(rows.val)
    val_y = torch.from_numpy(rows.labels[rows.val]).to(device)
    labels = torch.from_numpy(rows.labels).to(device)
    is_val_row = torch.zeros(len(rows.labels), dtype=torch.bool, device=device)
    is_val_row[torch.from_numpy(rows.val).to(device)] = True
    active = list(range(len(probes)))
    total_steps = plan.epochs * max(1, source.steps_per_epoch(fit, plan.batch_size))
    step = 0
    shown = None
    rng = np.random.default_rng(seed)
    for epoch in range(plan.epochs):
        bar = _bar(progress, epoch, plan.epochs, len(fit))
        for positions, feats in source.blocks(fit, rng):
            pos = torch.from_numpy(positions).to(device)
            y_block, val_block = labels[pos], is_val_row[pos]
            for i in range(0, len(positions), plan.batch_size):
                sl = slice(i, i + plan.batch_size)
                progress_frac = min(step / total_steps, 1.0)
                for a in active:
                    shown = probes[a].step(feats[a][sl], y_block[sl], val_block[sl], progress_frac,
                                           report=bar is not None and a == active[-1]) or shown
                step += 1
                if bar is not None:
                    bar.update(len(y_block[sl]))
            if bar is not None and shown is not None:
                bar.set_postfix(loss=f"{float(shown[0]):.3f}", acc=f"{float(shown[1]):.3f}", anchor=active[-1])
        if bar is not None:
            bar.close()
        if plan.eval_every_epoch:
            active = [a for a in active if not probes[a].end_epoch(epoch, val_x[a], val_y)]
            if not active:
                break
    return [p.fitted(val_x[a], val_y) for a, p in enumerate(probes)]


def predict(source: FeatureSource, probes: Sequence[FittedProbe], rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """argmax and max softmax of every probe on `rows` (in row order): int32 and float32 [n, anchors]."""
    preds = np.empty((len(rows), len(probes)), dtype=np.int32)
    confs = np.empty((len(rows), len(probes)), dtype=np.float32)
    index = {r: i for i, r in enumerate(np.asarray(rows).tolist())}
    for positions, feats in source.blocks(rows):
        where = np.fromiter((index[r] for r in positions.tolist()), dtype=np.int64, count=len(positions))
        for a, (probe, x) in enumerate(zip(probes, feats, strict=True)):
            logits = x @ probe.weight.T.to(x.device) + probe.bias.to(x.device)
            conf, pred = torch.softmax(logits, dim=-1).max(dim=-1)
            preds[where, a] = pred.cpu().numpy()
            confs[where, a] = conf.cpu().numpy()
    return preds, confs


def _bar(progress: str | None, epoch: int, epochs: int, total: int):
    if progress is None:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=f"{progress} epoch {epoch + 1}/{epochs}", unit="row", leave=False,
                dynamic_ncols=True)
