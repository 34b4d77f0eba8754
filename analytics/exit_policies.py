"""Which early-exit policies a simulation compares (sql/exit_simulation.sql); kept apart from the queries so the
CLI can read the defaults without loading DuckDB."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExitPolicies:
    """Stability gates at each k, confidence gates at each threshold, stability AND confidence gates at each
    `combined` threshold, and the learned gate (where `featstore gate` fitted one) at each of `learned` (default:
    the confidence thresholds, the gate's score being a probability too; `()` leaves the gate out). With the gate
    in, every policy is counted on the images it did not learn from (sql/exit_images.sql), so that all of them
    compare on one population. `featstore exit-sim` and the report both start from these defaults."""

    ks: tuple[int, ...] = (1, 2, 3, 4)
    thresholds: tuple[float, ...] = tuple(round(0.5 + 0.01 * i, 2) for i in range(50))  # 0.5:0.99:0.01
    combined: tuple[float, ...] = (0.5, 0.7, 0.9)
    learned: tuple[float, ...] | None = None

    def args(self) -> list:
        return [list(self.ks), [float(t) for t in self.thresholds], [float(t) for t in self.combined]]

    def gate_args(self) -> list[float]:
        return [float(t) for t in (self.thresholds if self.learned is None else self.learned)]


DEFAULT_POLICIES = ExitPolicies()
