"""A query's result as plain Python rows (no Arrow, no Polars, no DuckDB import): what `featstore sql` and
`timeline` print at once."""

from __future__ import annotations

from dataclasses import dataclass, replace

PLAIN_TYPES = ("BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
               "UBIGINT", "FLOAT", "DOUBLE", "VARCHAR")  # DuckDB types whose Python values are what every format prints


@dataclass(frozen=True)
class Rows:
    """A result as Python values, read without Arrow or Polars: column names, their DuckDB types, and rows (tuples)
    of numbers, text, booleans and None."""

    columns: tuple[str, ...]
    types: tuple[str, ...]
    rows: list[tuple]

    @property
    def height(self) -> int:
        return len(self.rows)

    def head(self, n: int) -> Rows:
        return replace(self, rows=self.rows[:n])
