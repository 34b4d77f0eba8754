"""The code and the manual say what is: no comment, docstring, message or page cites the tracker entry a change
came from (git's log keeps that), so a reader is never sent to a tracker to understand a line."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# an issue number as prose cites one: the word, then its number (with or without '#'), or '(#' and a number')
CITED = re.compile(r"\b" + "issue" + r"s?\s+#?\d+|\(#\d+\)", re.IGNORECASE)
CODE = ("featstore", "analytics", "workflows", "probing", "api", "cli", "sql", "bench", "tests")
# a dated log of measurements, each against the commit and the change it measured: its record, not the manual's
LOGS = {"docs/benchmarks.md"}


def _files() -> list[Path]:
    found = [p for folder in CODE for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".sql", ".md")]
    found += [p for p in (ROOT / "docs").rglob("*.md") if p.relative_to(ROOT).as_posix() not in LOGS]
    return sorted(p for p in [*found, ROOT / "README.md"] if ".venv" not in p.parts)


def test_no_file_cites_an_issue_number():
    cited = [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}" for path in _files()
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if CITED.search(line)]
    assert cited == []


def test_the_scan_reads_every_kind_of_file_and_citation():
    names = {p.relative_to(ROOT).as_posix() for p in _files()}
    assert {"probing/knn.py", "sql/in_scope.sql", "docs/probes.md", "README.md", "bench/knobs.py",
            "tests/conftest.py"} <= names and "docs/benchmarks.md" not in names
    said = ["named `lens` until issue " + "50", "(issue " + "32's comparison)", "see (#" + "12)", "Issue #" + "7"]
    assert all(CITED.search(s) for s in said)
    assert not any(CITED.search(s) for s in ["issue a warning", "issued 3 times", "tissue 3"])
