"""Which early/mid/late band a sweep uses (the `band` argument of decision_sweep, see sql/band_window.sql)."""

from __future__ import annotations

# paper = the thirds of T, never-stable images (placed at T) counted late, as the source paper counts them;
# window = the thirds of T - k, the anchors a stable l*(k) can take, never-stable images in no band (docs/design.md §5)
BANDS = ("paper", "window")
