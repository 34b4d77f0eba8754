"""Which early-exit policies a simulation compares (sql/exit_simulation.sql); kept apart from the queries so the
CLI can read the defaults without loading DuckDB."""

from __future__ import annotations

import math
from dataclasses import dataclass

from featstore.errors import FeatstoreError
from featstore.schema import KS

MAX_THRESHOLDS = 10_000  # values a threshold list may hold: each is a policy simulated over every image


@dataclass(frozen=True)
class ExitPolicies:
    """Stability gates at each k, confidence gates at each threshold, stability AND confidence gates at each
    `combined` threshold, and the learned gate (where `featstore gate` fitted one) at each of `learned` (default:
    the confidence thresholds, the gate's score being a probability too; `()` leaves the gate out). With the gate
    in, every policy is counted on the images it did not learn from (sql/exit_images.sql), so that all of them
    compare on one population. `featstore exit-sim` and the report both start from these defaults."""

    ks: tuple[int, ...] = KS
    thresholds: tuple[float, ...] = tuple(round(0.5 + 0.01 * i, 2) for i in range(50))  # 0.5:0.99:0.01
    combined: tuple[float, ...] = (0.5, 0.7, 0.9)
    learned: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        """Refused in one line naming the field (the Python API's words: `combined_thresholds`), before a query: a
        confidence outside [0, 1] is no policy, and every threshold is a policy simulated over every image."""
        if not self.ks or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in self.ks):
            raise FeatstoreError("give stability windows, integers >= 1",
                                 field="ks", value=self.ks)
        named = {"thresholds": self.thresholds, "combined_thresholds": self.combined, "learned": self.learned or ()}
        for name, values in named.items():
            if len(values) > MAX_THRESHOLDS:
                raise FeatstoreError(f"{name}=({len(values):,} values): at most {MAX_THRESHOLDS:,}; give fewer")
            bad = [v for v in values if not (isinstance(v, int | float) and math.isfinite(v) and 0 <= v <= 1)]
            if bad:
                raise FeatstoreError(f"{name}={bad[0]!r}: confidences lie in [0, 1]")
        if not self.thresholds:
            raise FeatstoreError("thresholds=(): give at least one confidence threshold")

    def args(self) -> list:
        return [list(self.ks), [float(t) for t in self.thresholds], [float(t) for t in self.combined]]

    def gate_args(self) -> list[float]:
        return [float(t) for t in (self.thresholds if self.learned is None else self.learned)]


DEFAULT_POLICIES = ExitPolicies()
