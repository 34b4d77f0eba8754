"""Full-batch L-BFGS for the softmax probes of several anchors at once, on rows held in memory.

The last stretch of a convex, smooth objective is where a quasi-Newton method is fast (it learns the curvature
that the step-size cuts of SGD only guess), so `linear` solves its resident rows with this solver.

Each anchor keeps its own curvature pairs, step length and stopping state; only the expensive part, the loss
and gradient over all rows, is one batched computation for every anchor still running. An anchor stops when
its largest gradient entry is at most `gtol` (scikit-learn's test), or when `PATIENCE` iterations in a row
lower its loss by less than the evaluation's precision can resolve (`RESOLUTION`: the precision floor), or at
`max_iter` (unconverged). Float32 reaches its floor at a largest gradient entry of ~1e-5 on hard anchors, so a
tight solve finishes in float64 (`SoftmaxObjective.dtype`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from featstore.probing import targets

WOLFE_DECREASE = 1e-3  # sufficient decrease (scipy L-BFGS-B's ftol of its line search)
WOLFE_CURVATURE = 0.9  # curvature condition (its gtol)
MAX_EVALUATIONS = 20  # per line search
RESOLUTION = {torch.float32: 1e-6, torch.float64: 1e-14}  # relative loss decrease each precision cannot resolve
PATIENCE = 3
# a chunk of rows' logits: on a CPU small enough to stay in cache through the softmax passes and both products
# (one evaluation at 7,000 rows x 2 anchors 32 wide x 1,000 classes in float64: 225 ms in one chunk, 124 ms in
# 8 MiB ones; at 512 wide 391 -> 361 ms; at 10 classes one chunk either way); elsewhere (a GPU) few large launches
CPU_LOGIT_BYTES = 8 * 2**20
LOGIT_BYTES = 256 * 2**20
MIN_CHUNK_ROWS = 256
# at most this many classes, the probe's weights are held class-major ([g, C, D] in memory) for the logits z @ M:
# CPU batched products with a narrow last axis are MKL's slow case (840 rows x 512 wide x 10 classes: 2.5 vs
# 1.3 ms); at 100-1000 classes the two layouts were within 10% of each other, at 1000 the row-major one the faster
FEW_CLASSES = 128
# the rows an objective evaluates are copied once, in its precision and transposed for the gradient product, when
# both copies together take at most this much memory (the demo's widest group: 2 x 7 MB); larger ones are
# converted chunk by chunk on every evaluation, as they are read
ROW_COPY_BYTES = 512 * 2**20

Objective = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
Precondition = Callable[[torch.Tensor, int], torch.Tensor]  # (q [D+1, K], anchor) -> P q, P symmetric positive


@dataclass
class RowPreconditioner:
    """P = (A + l2 I_D)^-1 per anchor, A = mean over rows of w_i z~_i z~_i^T (z~ = [z, 1], w_i the row's curvature
    of the loss in its logits, taken at the solve's start): the feature side of the Hessian's Kronecker
    approximation (K-FAC's, for one linear layer), applied to every class column alike. The features are
    standardised but correlated, and the rows a probe already predicts confidently add almost no curvature, so
    with a weak penalty the Hessian's eigenvalues span 4-6 decades that plain L-BFGS crawls across (the demo's
    512-wide translator refit: 730 passes); with P as its initial inverse Hessian, 70 (same optimum, same
    predictions). Made in float64 at one thread (its products' last bits then never depend on the count),
    applied by a [D+1, D+1] x [D+1, K] product, whose bits did not move with the thread count at these shapes."""

    inverse: torch.Tensor  # [G, D+1, D+1] float64
    cast: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def at(cls, z: torch.Tensor, weights: torch.Tensor, l2: torch.Tensor) -> RowPreconditioner:
        """z [G, n, D] rows, weights [G, n] their curvature (float64), l2 [G] the penalty strengths."""
        g, n, d = z.shape
        saved = torch.get_num_threads()
        out = torch.empty(g, d + 1, d + 1, dtype=torch.float64, device=z.device)

        def one(a: int) -> None:
            za = torch.cat([z[a].double(), torch.ones(n, 1, dtype=torch.float64, device=z.device)], dim=1)
            gram = (za * (weights[a] / n)[:, None]).T @ za
            gram.diagonal()[:d] += float(l2[a])
            gram[d, d] += 1e-12  # every row confident: the bias's curvature ~0, its gradient too
            out[a] = torch.linalg.inv(gram)

        torch.set_num_threads(1)
        try:  # the anchors side by side on the threads the solve has, each on one: the same bits as one by one
            if min(saved, g) > 1:
                with ThreadPoolExecutor(min(saved, g)) as pool:
                    list(pool.map(one, range(g)))
            else:
                for a in range(g):
                    one(a)
        finally:
            torch.set_num_threads(saved)
        return cls(out)

    def __call__(self, q: torch.Tensor, i: int) -> torch.Tensor:
        inverse = self.cast.get(q.dtype)
        if inverse is None:
            inverse = self.cast[q.dtype] = self.inverse.to(q.dtype)
        return inverse[i] @ q


def class_major(m: torch.Tensor) -> torch.Tensor:
    """Weights M [g, D, C], laid out for the logits z @ M; the same values."""
    return m.mT.contiguous().mT if m.shape[2] <= FEW_CLASSES else m


def add_row_products_(grad: torch.Tensor, z: torch.Tensor, p: torch.Tensor, z_t: torch.Tensor | None = None) -> None:
    """grad += z^T p for rows z [g, r, D] and logit gradients p [g, r, C], into a row-major grad [g, D, C]; from
    `z_t`, the same rows transposed [g, D, r] with the rows contiguous, where the caller holds it (`RowCopies`).

    Always this product, never its transpose p^T z into class-major memory, although that is 5-7x faster at 10
    classes: MKL splits p^T z's sum over the rows differently at 1 and 2 threads (its last bits differ, measured
    at 840-1437 rows x 64-512 wide x 10 classes on an AMD EPYC), and the solver's path then stops elsewhere and
    can choose another C; z^T p came out bit-identical at those shapes (docs/threads.md). Read from a transposed
    copy rather than a transposed view, the same product is 1.5-2x faster at up to `FEW_CLASSES` classes and
    the same bits (measured at the demo's and the digits' shapes, float32 and float64, 1 and 2 threads)."""
    grad.baddbmm_(z.mT if z_t is None else z_t, p)


class RowCopies:
    """An objective's rows z [G, n, D] as its evaluations read them: in its precision `dtype` and, where
    `transposed`, also [G, D, n] with the rows contiguous for the gradient product (`add_row_products_`), made
    once when they fit `ROW_COPY_BYTES`; else each chunk is converted on every call, as it is read, and read
    through a transposed view. The same values either way: an evaluation is not copied per call for nothing."""

    def __init__(self, z: torch.Tensor, dtype: torch.dtype, transposed: bool) -> None:
        self.z, self.dtype = z, dtype
        self.kept = (1 + transposed) * z.numel() * dtype.itemsize <= ROW_COPY_BYTES
        if self.kept:
            self.rows = z.to(dtype).contiguous()
            self.rows_t = self.rows.mT.contiguous() if transposed else None

    def chunk(self, start: int, stop: int, picks: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows start:stop of every anchor (`picks` None: views, no copy) or of the anchors `picks`: [g, r, D], and
        [g, D, r] where kept transposed (else None)."""
        if not self.kept:
            zc = self.z[:, start:stop] if picks is None else self.z[:, start:stop].index_select(0, picks)
            return zc.to(self.dtype), None
        rows = self.rows[:, start:stop]
        rows_t = None if self.rows_t is None else self.rows_t[:, :, start:stop]
        if picks is not None:
            rows = rows.index_select(0, picks)
            rows_t = None if rows_t is None else rows_t.index_select(0, picks)
        return rows, rows_t


def chunk_rows(anchors: int, classes: int, dtype: torch.dtype, device: torch.device) -> int:
    """Rows per chunk of an evaluation over `anchors` anchors' logits to `classes` classes (`CPU_LOGIT_BYTES`,
    `LOGIT_BYTES`). It depends on the shapes, the precision and the device type only, never the thread count: the
    chunks' sums are added in one order at any thread count."""
    budget = CPU_LOGIT_BYTES if torch.device(device).type == "cpu" else LOGIT_BYTES
    return max(MIN_CHUNK_ROWS, budget // max(1, dtype.itemsize * anchors * classes))


def row_major_zeros(m: torch.Tensor) -> torch.Tensor:
    """A zero gradient for weights m [g, D, C], row-major whatever m's layout (`add_row_products_`)."""
    return torch.zeros(m.shape, dtype=m.dtype, device=m.device)


def strengths(l2: float | torch.Tensor, z: torch.Tensor, which: torch.Tensor) -> torch.Tensor:
    """[g, 1, 1] float64 penalty strength of the anchors `which` of rows z [G, n, D], from one strength for every
    anchor or one per anchor [G]."""
    l2 = torch.as_tensor(l2, dtype=torch.float64, device=z.device).reshape(-1)
    l2 = l2.expand(z.shape[0]) if l2.numel() == 1 else l2
    return l2.index_select(0, which)[:, None, None]


@dataclass
class SoftmaxObjective:
    """f(W) = mean CE(z W[:D] + W[D], y) + l2 |W[:D]|^2 / 2 for G anchors; W: [G, D+1, C], z: [G, n, D]; y labels
    or target distributions (`probing.targets`). `l2` is one strength for every anchor or one per anchor [G].
    With `dtype` float64 every chunk of rows is evaluated in float64 (W must be float64 then): float32 sums stop
    resolving the loss's decrease near the optimum, and their last bits move with the thread count."""

    z: torch.Tensor
    y: torch.Tensor
    num_classes: int
    l2: float | torch.Tensor
    dtype: torch.dtype = torch.float32
    rows: RowCopies = field(init=False)

    def __post_init__(self) -> None:
        self.rows = RowCopies(self.z, self.dtype, transposed=self.num_classes <= FEW_CLASSES)

    def __call__(self, w: torch.Tensor, which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss [g] and gradient [g, D+1, C] of the anchors `which` (indices into z's first axis); a subset is
        read as views of z, never copied."""
        g, n, d = len(which), self.z.shape[1], self.z.shape[2]
        everyone = g == self.z.shape[0] and bool((which == torch.arange(g, device=which.device)).all())
        rows = chunk_rows(g, self.num_classes, self.dtype, self.z.device)
        loss = torch.zeros(g, dtype=torch.float64, device=self.z.device)
        m, bias = class_major(w[:, :d]), w[:, d:]
        grad_m, grad_b = row_major_zeros(m), torch.zeros_like(bias)
        picks = None if everyone else which
        for start in range(0, n, rows):
            yc = self.y[start : start + rows]
            zc, zc_t = self.rows.chunk(start, start + rows, picks)
            nll, p = targets.nll_and_gradient_(torch.baddbmm(bias, zc, m), yc)
            loss += nll.sum(dim=1).double()
            add_row_products_(grad_m, zc, p, zc_t)
            grad_b += p.sum(dim=1, keepdim=True)
        l2 = strengths(self.l2, self.z, which)
        grad = torch.cat([grad_m, grad_b], dim=1).div_(n)
        grad[:, :d].add_(w[:, :d] * l2.to(w.dtype))
        loss = loss / n + 0.5 * (l2[:, 0, 0] * w[:, :d].double().pow(2).sum(dim=(1, 2)))
        return loss, grad


@dataclass
class SolverState:
    """One anchor's curvature pairs and how its solve ended."""

    s: list[torch.Tensor] = field(default_factory=list)
    y: list[torch.Tensor] = field(default_factory=list)
    rho: list[float] = field(default_factory=list)
    iterations: int = 0
    evaluations: int = 0  # passes over the rows (the first one, at the start, included)
    stalls: int = 0
    stop: str = ""  # "gradient", "precision" (no step lowers the loss any more) or "cap"
    loss: float = float("nan")
    max_gradient: float = float("nan")

    def converged(self, gtol: float) -> bool:
        """By the gradient test, or at the float32 floor within 10x of it (not where a line search failed far
        from the optimum)."""
        return self.stop == "gradient" or (self.stop == "precision" and self.max_gradient <= 10 * gtol)


def minimise(objective: Objective, w: torch.Tensor, gtol: float, max_iter: int, memory: int = 10,
             on_evaluation: Callable[[], None] | None = None, precondition: Precondition | None = None
             ) -> tuple[torch.Tensor, list[SolverState]]:
    """Minimise every anchor's objective from `w` [G, ...]; returns the minimisers and each anchor's state.
    `on_evaluation()` hears of every batched evaluation, one pass over the rows (for a progress bar).
    `precondition(q, i)`: anchor i's initial inverse Hessian P applied to q (scaled as L-BFGS scales its
    identity), where the curvature is known to be far from isotropic (`RowPreconditioner`)."""
    resolution = RESOLUTION.get(w.dtype, RESOLUTION[torch.float32])
    w = w.clone()
    states = [SolverState() for _ in range(w.shape[0])]
    f, grad = objective(w, torch.arange(w.shape[0], device=w.device))
    if on_evaluation:
        on_evaluation()
    for i, st in enumerate(states):
        st.evaluations = 1
        st.loss, st.max_gradient = float(f[i]), float(grad[i].abs().max())
        st.stop = "gradient" if st.max_gradient <= gtol else ""
    active = [i for i, st in enumerate(states) if not st.stop]
    while active:
        for i in active:
            if states[i].iterations >= max_iter:
                states[i].stop = "cap"
        active = [i for i in active if not states[i].stop]
        if not active:
            break
        dirs, searches, steps, tried = {}, {}, {}, {}
        for i in active:
            st = states[i]
            scale = None if precondition is None else (lambda q, i=i: precondition(q, i))
            d = _direction(grad[i], st, scale)
            slope = float((grad[i] * d).sum())
            if slope >= 0:  # stale curvature: restart from the (preconditioned) gradient
                st.s.clear(), st.y.clear(), st.rho.clear()
                d = _direction(grad[i], st, scale)
                slope = float((grad[i] * d).sum())
            # the first step is one unit long (as scipy's L-BFGS-B takes it); later ones the quasi-Newton step
            first = 1.0 if st.s else min(1.0, 1.0 / max(float(d.norm()), 1e-12))
            dirs[i], tried[i] = d, []
            searches[i] = _strong_wolfe(float(f[i]), slope, first, float(d.abs().max()))
            steps[i] = next(searches[i])
        chosen: dict[int, int] = {}
        pending = list(active)
        while pending:
            idx = torch.tensor(pending, device=w.device)
            trial = w.index_select(0, idx) + torch.stack([steps[i] * dirs[i] for i in pending])
            f_new, g_new = objective(trial, idx)
            if on_evaluation:
                on_evaluation()
            still = []
            for j, i in enumerate(pending):
                value = float(f_new[j]) if math.isfinite(float(f_new[j])) else math.inf
                states[i].evaluations += 1
                tried[i].append((trial[j], value, g_new[j]))
                try:
                    steps[i] = searches[i].send((value, float((g_new[j] * dirs[i]).sum())))
                    still.append(i)
                except StopIteration as done:
                    chosen[i] = done.value
            pending = still
        for i in active:
            st = states[i]
            if chosen[i] < 0:  # no step lowered the loss
                st.iterations += 1
                if st.s:  # the curvature pairs misled: start again from the gradient
                    st.s.clear(), st.y.clear(), st.rho.clear()
                else:  # along the gradient itself: float32 precision reached
                    st.stop = "precision"
                continue
            point, value, g_point = tried[i][chosen[i]]
            _accept(st, point - w[i], g_point - grad[i], float(f[i]) - value, memory, resolution)
            w[i], grad[i], f[i] = point, g_point, value
            st.loss, st.max_gradient = value, float(g_point.abs().max())
            if st.max_gradient <= gtol:
                st.stop = "gradient"
            elif st.stalls >= PATIENCE:
                st.stop = "precision"
        active = [i for i in active if not states[i].stop]
    return w, states


def _accept(st: SolverState, s: torch.Tensor, yv: torch.Tensor, decrease: float, memory: int,
            resolution: float) -> None:
    st.iterations += 1
    st.stalls = st.stalls + 1 if decrease <= resolution * max(abs(st.loss), 1e-12) else 0
    sy = float((s * yv).sum())
    if sy > 1e-10 * float((yv * yv).sum()):
        st.s.append(s), st.y.append(yv), st.rho.append(1.0 / sy)
        if len(st.s) > memory:
            st.s.pop(0), st.y.pop(0), st.rho.pop(0)


def _direction(grad: torch.Tensor, st: SolverState,
               precondition: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """-H grad by the two-loop recursion over the anchor's stored pairs, from H0 = gamma I (or gamma P with a
    preconditioner P), gamma = s^T y / y^T H0 y of the newest pair (1 without pairs)."""
    q = grad.clone()
    alphas = []
    for s, y, rho in zip(reversed(st.s), reversed(st.y), reversed(st.rho), strict=True):
        a = rho * float((s * q).sum())
        alphas.append(a)
        q.add_(y, alpha=-a)
    if precondition is not None:
        q = precondition(q)
        if st.s:
            q.mul_(float((st.s[-1] * st.y[-1]).sum()) / float((st.y[-1] * precondition(st.y[-1])).sum()))
    elif st.s:
        q.mul_(float((st.s[-1] * st.y[-1]).sum()) / float((st.y[-1] * st.y[-1]).sum()))
    for s, y, rho, a in zip(st.s, st.y, st.rho, reversed(alphas), strict=True):
        q.add_(s, alpha=a - rho * float((y * q).sum()))
    return q.neg_()


Point = tuple[float, float, float, int]  # step, loss, slope along the direction, index of the evaluation (-1: start)


def _strong_wolfe(f0: float, slope0: float, step: float, longest: float
                  ) -> Generator[float, tuple[float, float], int]:
    """One anchor's line search for a step meeting the strong Wolfe conditions (Nocedal & Wright, algorithms 3.5
    and 3.6, with cubic interpolation; the constants of scipy's L-BFGS-B, which scikit-learn runs). A generator,
    so that the searches of all anchors advance in lockstep and share each batched evaluation: it yields the
    next step to evaluate, is sent (loss, slope) there, and returns the index of the accepted evaluation (the
    lowest loss seen when no step meets the conditions), or -1 when none lowered the loss. Extrapolating (up to
    10x per evaluation) matters: backtracking from the quasi-Newton step alone crawls where the loss keeps falling
    along a direction (near-separable classes)."""
    start: Point = (0.0, f0, slope0, -1)
    best = start  # the lowest loss seen: the fall-back when no step meets the conditions

    def armijo(p: Point) -> bool:
        return p[1] <= f0 + WOLFE_DECREASE * p[0] * slope0

    def curvature(p: Point) -> bool:
        return abs(p[2]) <= -WOLFE_CURVATURE * slope0

    value, slope = yield step
    prev, cur, n = start, (step, value, slope, 0), 1
    best = min(best, cur, key=lambda p: p[1])
    bracket: list[Point] | None = None
    while n < MAX_EVALUATIONS:  # widen until the minimum along the line is bracketed
        if not armijo(cur) or (n > 1 and cur[1] >= prev[1]) or cur[2] >= 0:
            bracket = [prev, cur]
            break
        if curvature(cur):
            return cur[3]
        low, high = cur[0] + 0.01 * (cur[0] - prev[0]), 10 * cur[0]
        nxt = _cubic_minimum(prev, cur, (low, high))
        value, slope = yield nxt
        prev, cur, n = cur, (nxt, value, slope, n), n + 1
        best = min(best, cur, key=lambda p: p[1])
    if bracket is None:
        return cur[3] if armijo(cur) else best[3]
    low, high = sorted(bracket, key=lambda p: p[1])
    stuck = False
    while n < MAX_EVALUATIONS and abs(high[0] - low[0]) * longest >= 1e-9:  # zoom in
        a, b = min(low[0], high[0]), max(low[0], high[0])
        t = _cubic_minimum(low, high, (a, b))
        margin = 0.1 * (b - a)
        if min(b - t, t - a) < margin:  # too close to an end: step away from it, or at least next time
            if stuck or t >= b or t <= a:
                t = b - margin if abs(t - b) < abs(t - a) else a + margin
                stuck = False
            else:
                stuck = True
        else:
            stuck = False
        value, slope = yield t
        new: Point = (t, value, slope, n)
        n += 1
        best = min(best, new, key=lambda p: p[1])
        if not armijo(new) or new[1] >= low[1]:
            high = new
        else:
            if curvature(new):
                return new[3]
            if new[2] * (high[0] - low[0]) >= 0:
                high = low
            low = new
    if low[3] >= 0 and armijo(low):
        return low[3]
    return best[3]  # the conditions cannot be met (a loss far from smooth at this scale): any decrease, or -1


def _cubic_minimum(p: Point, q: Point, bounds: tuple[float, float]) -> float:
    """The minimiser of the cubic through two points' losses and slopes, kept within `bounds`."""
    lo, hi = bounds
    if p[0] == q[0]:
        return (lo + hi) / 2
    d1 = p[2] + q[2] - 3 * (p[1] - q[1]) / (p[0] - q[0])
    square = d1 * d1 - p[2] * q[2]
    if not math.isfinite(square) or square < 0:
        return (lo + hi) / 2
    d2 = math.sqrt(square)
    (x1, _, g1, _), (x2, _, g2, _) = sorted([p, q])
    denominator = g2 - g1 + 2 * d2
    t = x2 - (x2 - x1) * (g2 + d2 - d1) / denominator if denominator else (lo + hi) / 2
    return min(max(t, lo), hi)
