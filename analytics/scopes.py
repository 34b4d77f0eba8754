"""Which images a summary counts (the `scope` argument of every macro, see sql/in_scope.sql)."""

from __future__ import annotations

# auto = the test split, or every image of a cross-fit run (all its predictions are out of sample)
SCOPES = ("auto", "all", "train", "val", "test")
