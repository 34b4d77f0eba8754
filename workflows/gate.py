"""`featstore gate`: a learned early-exit gate, the source paper's closing proposal of a gate that reads the early
evidence to decide when to exit, fitted from a run's own stored prediction timelines.

At every anchor l of an image the gate sees only the timeline so far (anchors 0..l): the confidence at l and its
log-odds, whether the prediction repeats the previous one and for how many anchors it has, how the confidence
moved (change since l-1, margin over the best earlier confidence, mean so far), the share of anchors so far that
agree with it, how often the prediction changed, and which anchor l is (one indicator per anchor). Its target is
"the prediction at l is already the model's own final prediction and it is correct". A logistic regression
(scikit-learn's objective with C = 1 on standardised features, solved by Newton's method) is fitted on the images
of one split (default the train split) and scores every (image, anchor) of the run; the scores land in
`gate_scores`, the fit in `gates`. `featstore exit-sim` then evaluates the policy "exit at the first anchor whose
score is >= θ" on the images the gate never saw, beside the stability and confidence gates (it only reads).

On a single 70/30 split the train rows' timelines are in-sample for the probes (more confident and more often
right than on held-out images); a cross-fit run gives out-of-sample timelines everywhere, and the gate then learns
from what it will face.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featstore.analytics import db as fsdb
from featstore.analytics.queries import query, run_ids_among
from featstore.errors import FeatstoreError, Name, Step
from featstore.records import Gate, GateScores
from featstore.schema import GATE_SPLIT, check_field

FEATURES = ("conf", "logit_conf", "agrees_with_previous", "stable_for", "conf_change", "conf_over_best_before",
            "mean_conf_so_far", "share_agreeing_so_far", "changes_so_far")
TARGET = "prediction equals the model's own and the label"
WRITE_WAIT_S = 120.0


def gate_features(preds: np.ndarray, confs: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Per image and anchor [n, A, F] the features of the timeline up to that anchor (anchor indicators last)."""
    n, a = preds.shape
    t = max(1, a - 1)
    conf = confs.astype(np.float64)
    clipped = np.clip(conf, 1e-6, 1 - 1e-6)
    same = np.zeros((n, a), dtype=bool)
    same[:, 1:] = preds[:, 1:] == preds[:, :-1]
    stable_for = np.zeros((n, a))
    for layer in range(1, a):
        stable_for[:, layer] = np.where(same[:, layer], stable_for[:, layer - 1] + 1, 0)
    change = np.zeros((n, a))
    change[:, 1:] = np.diff(conf, axis=1)
    best_before = np.zeros((n, a))
    best_before[:, 1:] = conf[:, 1:] - np.maximum.accumulate(conf, axis=1)[:, :-1]
    agreeing = np.stack([(preds[:, : layer + 1] == preds[:, layer : layer + 1]).mean(axis=1) for layer in range(a)],
                        axis=1)
    columns = [conf, np.log(clipped / (1 - clipped)), same.astype(float), stable_for / t, change, best_before,
               np.cumsum(conf, axis=1) / np.arange(1, a + 1), agreeing, (np.cumsum(~same, axis=1) - 1) / t]
    indicators = np.broadcast_to(np.eye(a), (n, a, a))
    return np.concatenate([np.stack(columns, axis=-1), indicators], axis=-1), [*FEATURES, *(
        f"at_anchor_{i}" for i in range(a))]


@dataclass(frozen=True)
class LogisticFit:
    """w . standardised(x) + b, and how Newton's method ended."""

    mean: np.ndarray
    std: np.ndarray
    weight: np.ndarray
    bias: float
    iterations: int
    max_gradient: float

    def score(self, x: np.ndarray) -> np.ndarray:
        z = ((x - self.mean) / self.std) @ self.weight + self.bias
        return 1.0 / (1.0 + np.exp(-z))


def fit_logistic(x: np.ndarray, y: np.ndarray, c: float = 1.0, max_iterations: int = 100,
                 gtol: float = 1e-8) -> LogisticFit:
    """min C * sum log-loss + |w|^2 / 2 (bias not penalised) on standardised x: scikit-learn's
    LogisticRegression(C) objective, solved by Newton's method with a backtracking line search."""
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    z = np.concatenate([(x - mean) / std, np.ones((len(x), 1))], axis=1)
    penalty = np.ones(z.shape[1])
    penalty[-1] = 0.0
    w = np.zeros(z.shape[1])

    def objective(w: np.ndarray) -> float:
        m = z @ w
        return float(c * np.sum(np.logaddexp(0, m) - y * m) + 0.5 * np.sum(penalty * w * w))

    iterations, gradient = 0, np.inf
    for iterations in range(1, max_iterations + 1):  # noqa: B007 (the count is reported)
        p = 1.0 / (1.0 + np.exp(-(z @ w)))
        grad = c * z.T @ (p - y) + penalty * w
        gradient = float(np.abs(grad).max())
        if gradient <= gtol * max(1.0, c * len(y)):
            break
        hessian = c * (z * (p * (1 - p))[:, None]).T @ z + np.diag(penalty + 1e-12)
        step = np.linalg.solve(hessian, grad)
        value, scale = objective(w), 1.0
        while objective(w - scale * step) > value - 1e-4 * scale * float(grad @ step) and scale > 1e-8:
            scale /= 2
        w = w - scale * step
    return LogisticFit(mean, std, w[:-1], float(w[-1]), iterations, gradient)


@dataclass(frozen=True)
class GateResult:
    """What `featstore gate` reports: the run, the split it learnt from, and the fit."""

    run_id: str
    trained_on: str
    n_images: int
    n_rows: int
    positive_share: float
    weights: dict[str, float]  # per standardised feature
    iterations: int


def train_gate(db: str | Path, run_id: str, split: str = GATE_SPLIT, c: float = 1.0,
               on_start: Callable[[], None] | None = None) -> GateResult:
    """Fit the learned exit gate of one run on the images of `split` and store it with its scores; `on_start` is
    called once the input is checked (the timelines read, a split that can teach a gate), before the fit (the CLI
    says what it does then, not before a refusal)."""
    check_field("split", split)  # the gate learns from one split
    if not run_ids_among(db, [run_id]):
        raise FeatstoreError(f"no run {run_id!r} in {db}; list them with ", Step("fs.connect(db).runs", "sql"))
    frame = query(db, "SELECT * FROM head_timelines(?)", [run_id])
    if frame["head_pred"].null_count() == len(frame):
        raise FeatstoreError(f"run {run_id!r} in {db} has no stored model outputs (the head's predictions the gate "
                             f"learns to recognise); rerun ", Step("fs.probe(...)", "probe"), " for it")
    frame = frame.filter(frame["head_pred"].is_not_null())
    preds = np.array(frame["preds"].to_list(), dtype=np.int64)
    confs = np.array(frame["confs"].to_list(), dtype=np.float64)
    labels, heads = frame["label"].to_numpy(), frame["head_pred"].to_numpy()
    learnt = (frame["split"] == split).to_numpy()
    x, names = gate_features(preds, confs)
    y = (preds == labels[:, None]) & (preds == heads[:, None])
    train_x, train_y = x[learnt].reshape(-1, x.shape[-1]), y[learnt].reshape(-1).astype(np.float64)
    if len(train_y) == 0 or train_y.min() == train_y.max():
        raise FeatstoreError(f"run {run_id!r}: the {split} split has {int(learnt.sum())} images and their anchors "
                             f"are {'all' if len(train_y) and train_y.max() else 'never'} right and final; a gate "
                             f"needs both kinds (pass another ", Name("split"), ")")
    if on_start is not None:
        on_start()
    fit = fit_logistic(train_x, train_y, c)
    score = fit.score(x.reshape(-1, x.shape[-1])).reshape(y.shape).astype(np.float32)
    weights = dict(zip(names, map(float, fit.weight), strict=True))
    con = fsdb.connect(db, wait_s=WRITE_WAIT_S)
    try:
        gate = Gate(run_id, split, len(train_y), TARGET,
                    {"names": names, "mean": fit.mean.tolist(), "std": fit.std.tolist()},
                    {"weight": weights, "bias": fit.bias, "c": c},
                    {"iterations": fit.iterations, "max_gradient": fit.max_gradient, "n_images": int(learnt.sum()),
                     "positive_share": float(train_y.mean())})
        fsdb.write_gate(con, GateScores(gate, frame["image_id"].to_numpy(), score, learnt))
    finally:
        con.close()
    return GateResult(run_id, split, int(learnt.sum()), len(train_y), float(train_y.mean()), weights,
                      fit.iterations)
