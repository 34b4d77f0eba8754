"""README and CI agree with each other and with the CLI."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    return re.findall(r"```bash\n(python3 -m venv .+)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_exactly_the_readme_test_command():
    demo, tests = _readme_commands()
    assert demo.endswith("featstore demo") and "pytest" in tests
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci_lines


def test_documented_build_options_exist():
    help_text = run_cli("build", "--help").output
    table = (ROOT / "README.md").read_text().split("### Options that matter")[1].split("###")[0]
    for option in re.findall(r"`(--[a-z-]+)", table):
        assert option in help_text, option
