"""A type checker follows the CLI into the API and the run records and finds nothing wrong: mypy, configured in
pyproject.toml ([tool.mypy]), on featstore.api, featstore.cli and featstore.records."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["-p", "featstore.api", "-p", "featstore.cli", "-m", "featstore.records"]


def _package_dirs() -> dict[str, str]:
    """Import name -> the repository folder it is installed from (pyproject's package-dir)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-dir"]


def installed_layout(where: Path) -> Path:
    """The package as it is installed (probing/, api/, cli/ ... under featstore/), made of links to the
    repository's files: mypy reads the modules by their import names, which an editable install's import hook
    does not show it."""
    package = where / "featstore"
    package.mkdir(parents=True)
    dirs = _package_dirs()
    for entry in (ROOT / dirs["featstore"]).iterdir():
        (package / entry.name).symlink_to(entry)
    for name, folder in dirs.items():
        if name != "featstore":
            (package / name.removeprefix("featstore.")).symlink_to(ROOT / folder)
    return where


def test_mypy_finds_no_error_in_the_api_the_cli_and_the_records(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed (it is in the `dev` extras: pip install -e '.[dev]')")
    tree = installed_layout(tmp_path / "tree")
    env = {**os.environ, "MYPYPATH": str(tree)}
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", *CHECKED],
                          cwd=tree, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not done.stdout.strip(), done.stdout
