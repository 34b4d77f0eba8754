"""Reading the TOML files that declare studies and zoos: a missing, unreadable or invalid file is one line."""

from __future__ import annotations

import sys
from pathlib import Path

from featstore.errors import FeatstoreError

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


def section(where: str, table: object, required: set[str], optional: set[str]) -> dict:
    """A TOML table holding every required key and no key outside `required | optional`; else one line that
    names the file (in `where`) and the key."""
    if not isinstance(table, dict):
        raise FeatstoreError(f"{where} must be a table of keys")
    unknown = set(table) - required - optional
    if unknown:
        raise FeatstoreError(f"{where}: unknown key {sorted(unknown)[0]!r} (allowed: "
                             f"{', '.join(sorted(required | optional))})")
    missing = required - set(table)
    if missing:
        raise FeatstoreError(f"{where}: missing key {sorted(missing)[0]!r}")
    return table


def local_path(value: str | Path, base: Path) -> Path:
    """A path from a TOML file: relative paths are relative to the file's folder."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p
