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
