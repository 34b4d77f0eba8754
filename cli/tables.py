"""The table text the CLI prints: Polars' own table under the CLI's settings, and the same text written directly for a
result of plain rows (`Rows`: numbers, text, booleans), so that `featstore sql` and `timeline` answer without
importing Arrow or Polars. Where the direct text could differ from Polars' (text beyond printable ASCII, floats
Polars writes in scientific notation, a table wider than the width Polars wraps at), Polars prints it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

    from featstore.api.results import Rows

FLOAT_DECIMALS = 4  # decimals of every float cell
TEXT_CHARS, FULL_TEXT_CHARS = 80, 10_000  # a text cell (or column name) is cut to this many characters, then '…'
WIDTH_CHARS, FULL_WIDTH_CHARS = 240, 10_000  # a wider table is wrapped by Polars
FIXED_BELOW = 1e12  # Polars writes larger floats in scientific notation (1.0000e14): those go through Polars
# each plain DuckDB type (analytics/plain_rows.py PLAIN_TYPES): the Polars dtype DuckDB hands over for it, and the
# name Polars prints under a column of it
POLARS_DTYPES = {"BOOLEAN": ("Boolean", "bool"), "TINYINT": ("Int8", "i8"), "SMALLINT": ("Int16", "i16"),
                 "INTEGER": ("Int32", "i32"), "BIGINT": ("Int64", "i64"), "UTINYINT": ("UInt8", "u8"),
                 "USMALLINT": ("UInt16", "u16"), "UINTEGER": ("UInt32", "u32"), "UBIGINT": ("UInt64", "u64"),
                 "FLOAT": ("Float32", "f32"), "DOUBLE": ("Float64", "f64"), "VARCHAR": ("String", "str")}
DTYPES = {duckdb_type: shown for duckdb_type, (_, shown) in POLARS_DTYPES.items()}


def polars_settings(full: bool) -> dict[str, object]:
    """pl.Config's settings of the table format; `full` shows whole lists and strings."""
    wide = {"fmt_table_cell_list_len": -1, "fmt_str_lengths": FULL_TEXT_CHARS} if full else \
        {"fmt_str_lengths": TEXT_CHARS}
    return {"tbl_rows": -1, "tbl_cols": -1, "tbl_width_chars": FULL_WIDTH_CHARS if full else WIDTH_CHARS,
            "tbl_hide_dataframe_shape": True, "float_precision": FLOAT_DECIMALS, **wide}


def frame_text(frame: pl.DataFrame, full: bool = False) -> str:
    """Polars' table of `frame` under the CLI's settings."""
    import polars as pl

    with pl.Config(**polars_settings(full)):
        return str(frame)


def _text(value: str, chars: int) -> str | None:
    if not (value.isascii() and value.isprintable()):
        return None
    return value if len(value) <= chars else value[:chars] + "…"


def _cell(value: object, chars: int) -> str | None:
    """One cell as Polars writes it, or None where this cannot be sure to write it the same."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.{FLOAT_DECIMALS}f}" if abs(value) < FIXED_BELOW else None
    if isinstance(value, str):
        return _text(value, chars)
    return None


def rows_text(rows: Rows, full: bool = False) -> str | None:
    """The table Polars prints of `rows` (as `frame_text`), written without Polars; None where it could differ."""
    chars = FULL_TEXT_CHARS if full else TEXT_CHARS
    if not rows.columns or len(set(rows.columns)) != len(rows.columns) or not set(rows.types) <= DTYPES.keys():
        return None
    names = [name for name in (_text(column, chars) for column in rows.columns) if name is not None]
    if len(names) != len(rows.columns):
        return None
    header = [names, ["---"] * len(rows.columns), [DTYPES[t] for t in rows.types]]
    cells = [[_cell(value, chars) for value in row] for row in rows.rows]
    body = [[cell for cell in line if cell is not None] for line in cells]
    if any(len(line) != len(rows.columns) for line in body):  # a cell Polars may print otherwise
        return None
    lines = header + body
    widths = [max(len(line[i]) for line in lines) for i in range(len(rows.columns))]
    if 1 + sum(w + 3 for w in widths) > (FULL_WIDTH_CHARS if full else WIDTH_CHARS):
        return None

    def rule(left: str, line: str, join: str, right: str) -> str:
        return left + join.join(line * (w + 2) for w in widths) + right

    def row(cells: list[str]) -> str:
        return "│" + "┆".join(f" {cell:<{w}} " for cell, w in zip(cells, widths, strict=True)) + "│"

    return "\n".join([rule("┌", "─", "┬", "┐"), *map(row, header), rule("╞", "═", "╪", "╡"), *map(row, body),
                      rule("└", "─", "┴", "┘")])


def as_frame(rows: Rows) -> pl.DataFrame:
    """`rows` as the Polars frame DuckDB would have handed over (the same dtypes)."""
    import polars as pl

    schema = {c: getattr(pl, POLARS_DTYPES[t][0]) for c, t in zip(rows.columns, rows.types, strict=True)}
    return pl.DataFrame(rows.rows, schema=schema, orient="row")


def table_text(rows: Rows, full: bool = False) -> str:
    """The table of `rows`: written directly where that is Polars' own text, else by Polars."""
    text = rows_text(rows, full)
    return frame_text(as_frame(rows), full) if text is None else text
