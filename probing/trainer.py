"""The streaming trainer: every epoch reads each block of rows once and updates every anchor's probe."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from featstore.errors import Name
from featstore.probing.base import AnchorContext, FittedProbe, ProbeGroup, ProbeVariant, UnconvergedProbe
from featstore.probing.source import FeatureSource, holds_prepared
from featstore.threads import ThreadPolicy

if TYPE_CHECKING:
    from tqdm import tqdm


@dataclass
class FitRows:
    """Row positions (into the store) of one fit: train rows, val rows, and what the probes learn to predict."""

    train: np.ndarray
    val: np.ndarray
    labels: np.ndarray  # label of every row of the store, by position
    targets: np.ndarray | None = None  # [rows, C] float32 distributions to learn instead (`learns_from = "model"`)

    def learnt(self) -> np.ndarray:
        """Per row of the store, what the probes learn: its label, or its target distribution."""
        return self.labels if self.targets is None else self.targets


def fit_probes(source: FeatureSource, variant: ProbeVariant, rows: FitRows, num_classes: int, seed: int,
               progress: bool = False, label: str = "probe", threads: int | None = None) -> list[FittedProbe]:
    """Fit one probe per anchor of `source`, all in the same passes over the data; anchors of equal width train
    as one group (stacked features) when the variant batches them. With `progress`, one bar for the whole fit.
    `threads`: CPU threads (None: the idle cores, looked at again every epoch or pass, see `featstore.threads`);
    what was used is recorded in every probe's info, since float sums split over another number of threads can
    differ in the last bits."""
    with ThreadPolicy(threads, source.device) as policy:
        probes = _fit(source, variant, rows, num_classes, seed, progress, label, policy.update)
    for p in probes:
        p.info["threads"] = policy.recorded
    return probes


def _fit(source: FeatureSource, variant: ProbeVariant, rows: FitRows, num_classes: int, seed: int, progress: bool,
         label: str, unit: Callable[[], object]) -> list[FittedProbe]:
    device = source.device
    trains_on_val = variant.plan(len(rows.train)).train_on_val
    fit = np.concatenate([rows.train, rows.val]) if trains_on_val else rows.train
    plan = variant.plan(len(fit))
    stats = source.stats(fit, seed=seed)  # the rows it learns from (as a standardising scikit-learn user does)
    resident = holds_prepared(source.nbytes, len(fit) * sum(source.dims) * 4, source.memory_budget)
    contexts = [AnchorContext(anchor=a, dim=d, num_classes=num_classes, n_train=len(rows.train), n_fit=len(fit),
                              stats=stats[a], device=device, seed=seed, fit_rows=np.sort(fit),
                              store_rows=len(rows.labels), resident=resident) for a, d in enumerate(source.dims)]
    groups = [variant.make_group([contexts[a] for a in anchors])
              for anchors in anchor_groups(source.dims, variant.batches_anchors())]
    val_x = source.gather(rows.val)
    labels = torch.from_numpy(rows.learnt()).to(device)
    val_y = labels[torch.from_numpy(rows.val).to(device)]
    is_val_row = torch.zeros(len(rows.labels), dtype=torch.bool, device=device)
    is_val_row[torch.from_numpy(rows.val).to(device)] = True
    rng = np.random.default_rng(seed)
    batches = ResidentBatches(source, groups, fit, labels, is_val_row, seed) if resident else None
    for g in groups:
        g.resident = batches is not None
    bar = _Progress(label, len(source.dims), len(fit)) if progress else None

    def on_pass() -> None:  # one pass over the rows of a full-batch method
        unit()
        if bar is not None:
            bar.passed()

    shown = None
    for g in groups if batches is not None else ():
        if g.ready_to_finish():  # a full-batch method that starts without any epoch
            g.finish(batches.stack(g), batches.y, batches.is_val, on_pass)
            if bar is not None:
                bar.anchors_left(groups)
    for epoch in range(plan.max_epochs):
        active = [g for g in groups if g.anchors]
        if not active:
            break
        unit()
        epoch_batches = (batches.epoch(active, plan.batch_size) if batches is not None else
                         streamed_batches(source, active, fit, labels, is_val_row, rng, plan.batch_size))
        for xs, y, is_val, batch_rows in epoch_batches:
            for g, x in zip(active, xs, strict=True):
                g.batch_rows(batch_rows)
                shown = g.step(x, y, is_val, report=bar is not None and g is active[-1]) or shown
            if bar is not None:
                bar.rows(len(y))
        for g in active:
            g.end_epoch(epoch, val_x, val_y)
            if batches is not None and g.ready_to_finish():
                g.finish(batches.stack(g), batches.y, batches.is_val, on_pass)
        if bar is not None:
            bar.anchors_left(groups, epoch=f"{epoch + 1} (cap {plan.max_epochs})", shown=shown)
    if bar is not None:
        bar.close()
    fitted: dict[int, FittedProbe] = {}
    for g in groups:
        fitted.update(g.fitted(val_x, val_y))
    probes = [fitted[a] for a in range(len(source.dims))]
    unconverged = [a for a, p in enumerate(probes) if not p.converged]
    said = probes[unconverged[0]].info.get("unconverged") if unconverged else None
    if said:  # the fit said why (an estimator's ConvergenceWarning): no epoch cap of featstore's to raise
        warnings.warn(f"{label}: the probes of anchor(s) {', '.join(map(str, unconverged))} did not converge "
                      f"({said}); give the estimator more iterations or scaled features", UnconvergedProbe,
                      stacklevel=2)
    elif unconverged:
        cap = probes[unconverged[0]].info.get("cap", variant.cap_param)  # the parameter that capped it
        warnings.warn(UnconvergedProbe(
            f"{label}: the probes of anchor(s) {', '.join(map(str, unconverged))} stopped at their cap "
            f"({variant.name}:{cap}={variant.params.get(cap, plan.max_epochs)}) before converging; raise it with ",
            Name("variant", f"{variant.name}:{cap}=N")), stacklevel=2)
    return probes


Batch = tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]  # per active group [G, n, D]; labels;
# is-val flags; the rows' positions in the store


def streamed_batches(source: FeatureSource, groups: Sequence[ProbeGroup], fit: np.ndarray, labels: torch.Tensor,
                     is_val_row: torch.Tensor, rng: np.random.Generator, batch_size: int) -> Iterator[Batch]:
    """One epoch read block by block from the source (streamed chunks, or rows when memory is short)."""
    for positions, feats in source.blocks(fit, rng):
        pos = torch.from_numpy(positions).to(source.device)
        y_block, val_block = labels[pos], is_val_row[pos]
        prepared = [g.prepare(stack_anchors(feats, g.anchors)) for g in groups]
        for i in range(0, len(positions), batch_size):
            sl = slice(i, i + batch_size)
            yield [x[:, sl] for x in prepared], y_block[sl], val_block[sl], pos[sl]


class ResidentBatches:
    """The fit rows prepared once (standardised, preconditioned: whatever `ProbeGroup.prepare` does) and kept
    in memory, so an epoch is a permutation and gathers, with no per-step transform."""

    def __init__(self, source: FeatureSource, groups: Sequence[ProbeGroup], fit: np.ndarray, labels: torch.Tensor,
                 is_val_row: torch.Tensor, seed: int):
        device = source.device
        feats = source.gather(fit)
        self.x = {id(g): (list(g.anchors), g.prepare(stack_anchors(feats, g.anchors))) for g in groups}
        del feats
        self.rows = torch.from_numpy(fit).to(device)
        self.y, self.is_val = labels[self.rows], is_val_row[self.rows]
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def stack(self, g: ProbeGroup) -> torch.Tensor:
        """[G, n, D] prepared rows of the anchors `g` still trains (those that stopped leave the stack)."""
        anchors, x = self.x[id(g)]
        if anchors != g.anchors:
            keep = torch.tensor([anchors.index(a) for a in g.anchors], device=x.device)
            x = x.index_select(0, keep)
            self.x[id(g)] = (list(g.anchors), x)
        return x

    def epoch(self, groups: Sequence[ProbeGroup], batch_size: int) -> Iterator[Batch]:
        stacks = [self.stack(g) for g in groups]
        order = torch.randperm(len(self.y), generator=self.gen, device=self.y.device)
        for i in range(0, len(order), batch_size):
            idx = order[i : i + batch_size]
            yield [x.index_select(1, idx) for x in stacks], self.y[idx], self.is_val[idx], self.rows[idx]


def anchor_groups(dims: Sequence[int], batched: bool) -> list[list[int]]:
    """Anchors that train together: all anchors of one width when batched, else one anchor per group."""
    if not batched:
        return [[a] for a in range(len(dims))]
    by_width: dict[int, list[int]] = {}
    for a, d in enumerate(dims):
        by_width.setdefault(d, []).append(a)
    return list(by_width.values())


def stack_anchors(feats: Sequence[torch.Tensor], anchors: Sequence[int]) -> torch.Tensor:
    """[G, n, D] features of `anchors` (a view, no copy, for a single anchor)."""
    return feats[anchors[0]][None] if len(anchors) == 1 else torch.stack([feats[a] for a in anchors])


def predict(source: FeatureSource, probes: Sequence[FittedProbe], rows: np.ndarray,
            bar: tqdm | None = None) -> tuple[np.ndarray, ...]:
    """Class and confidence of every probe on `rows` (in row order): int32 and float32 [n, anchors]. `bar` counts
    the rows predicted (knn's predict pass searches every reference row for each: long at ImageNet's size)."""
    preds = np.empty((len(rows), len(probes)), dtype=np.int32)
    confs = np.empty((len(rows), len(probes)), dtype=np.float32)
    index = {r: i for i, r in enumerate(np.asarray(rows).tolist())}
    for positions, feats in source.blocks(rows):
        where = np.fromiter((index[r] for r in positions.tolist()), dtype=np.int64, count=len(positions))
        for a, (probe, x) in enumerate(zip(probes, feats, strict=True)):
            pred, conf = probe.predict_rows(x, positions)
            preds[where, a] = pred.cpu().numpy()
            confs[where, a] = conf.cpu().numpy()
        if bar is not None:
            bar.update(len(positions))
    return preds, confs


def predict_bar(label: str, rows: int) -> tqdm:
    """One bar over the rows a view's prediction pass reads."""
    from tqdm import tqdm

    return tqdm(total=rows, desc=label, unit="row", leave=False, dynamic_ncols=True)


class _Progress:
    """A fit's bar: anchors done out of the anchors fitted (the total is known; passes are not: a probe stops by
    its criterion, not at its cap), with rows read and, for epoch methods, the last batch's train loss and train
    accuracy (on the rows it learns from: a growing regulariser lowers it, which is no regression)."""

    def __init__(self, label: str, anchors: int, fit_rows: int):
        from tqdm import tqdm

        self.fit_rows, self.read, self.passes, self.shown_at = fit_rows, 0, 0, 0.0
        self.bar = tqdm(total=anchors, desc=label, unit="anchor", leave=False, dynamic_ncols=True)

    def passed(self) -> None:
        self.passes += 1
        self.rows(self.fit_rows, passes=self.passes)

    def rows(self, n: int, **postfix) -> None:
        self.read += n
        now = time.monotonic()
        if now - self.shown_at > 0.5:  # tqdm throttles update(), not set_postfix
            self.shown_at = now
            self.bar.set_postfix(rows=f"{self.read:,}", **postfix)

    def anchors_left(self, groups, epoch: str | None = None, shown=None) -> None:
        done = self.bar.total - sum(len(g.anchors) for g in groups)
        postfix = {"rows": f"{self.read:,}"} | ({"passes": self.passes} if self.passes else {})
        if epoch is not None and shown is not None:
            postfix |= {"epoch": epoch, "train loss": f"{float(shown[0]):.3f}",
                        "train acc": f"{float(shown[1]):.3f}"}
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        self.bar.update(self.bar.total - self.bar.n)
        self.bar.refresh()  # the last frame shows, however soon after the one before
        self.bar.close()
