"""Reading the TOML files that declare studies and zoos: a missing, unreadable or invalid file, an unknown key and a
value of the wrong type or out of range are each one line naming the file and the key."""

from __future__ import annotations

import sys
from pathlib import Path

from featstore.errors import FeatstoreError
from featstore.schema import Value, shown

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def read_toml(path: Path, missing: str, label: str) -> dict:
    """The parsed file; `missing` is the error when there is no file, `label` names it in a parse error."""
    if not path.is_file():
        raise FeatstoreError(missing)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise FeatstoreError(f"{label} is not valid TOML ({e})") from e


TABLE = None  # a key holding a table (or an array of tables) that the caller reads with its own `section` call


def section(where: str, table: object, keys: dict[str, Value | None], required: set[str] = frozenset()) -> dict:
    """A TOML table whose keys are all in `keys`, holding every `required` one, each value of the type and range
    its `Value` declares (`featstore.schema`); else one line that names the file (in `where`), the key and what
    it must be. Returns the table with its values checked (whole-number floats as ints); TABLE keys as given."""
    if not isinstance(table, dict):
        raise FeatstoreError(f"{where} must be a table of keys, not {shown(table)}")
    unknown = set(table) - set(keys)
    if unknown:
        raise FeatstoreError(f"{where}: unknown key {sorted(unknown)[0]!r} (allowed: {', '.join(sorted(keys))})")
    missing = required - set(table)
    if missing:
        raise FeatstoreError(f"{where}: missing key {sorted(missing)[0]!r}")
    checked = {}
    for key, value in table.items():
        kind = keys[key]
        try:
            checked[key] = value if kind is None else kind.check(value)
        except ValueError as e:
            raise FeatstoreError(f"{where}: {key} = {shown(value)} {e}") from None
    return checked


def entries(value: object) -> list:
    """A key that holds one table or an array of tables, as a list (each checked by the caller's `section`)."""
    return value if isinstance(value, list) else [value]


def local_path(value: str | Path, base: Path) -> Path:
    """A path from a TOML file: relative paths are relative to the file's folder."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p
