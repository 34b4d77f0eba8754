"""README, docs/ and CI agree with each other and with the CLI (in the manner of sqlite-utils' test_docs).

`docs/cli.md` is every command's `--help`, generated from the CLI: after changing an option, regenerate it with
`python tests/test_docs.py` (this file run as a script).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

from featstore.cli.main import cli  # noqa: E402

from conftest import run_cli  # noqa: E402

OUTSIDE_REFERENCES = re.compile(r"SPEC §|seed[- ]00\d|\.\./shared|issue notes?\b|the issue\b")


def _readme_commands() -> list[str]:
    return re.findall(r"```bash\n(python3 -m venv .+)\n```", (ROOT / "README.md").read_text())


def cli_reference() -> str:
    """The text docs/cli.md must hold: each command's help at a fixed width."""
    parts = ["# Command reference\n\nGenerated from the CLI by `python tests/test_docs.py`; "
             "`tests/test_docs.py` checks that it is current.\n"]
    group = click.Context(cli, info_name="featstore", **cli.context_settings)
    for name in sorted(cli.commands):
        command = cli.commands[name]
        ctx = click.Context(command, parent=group, info_name=name, max_content_width=100, terminal_width=100)
        parts.append(f"## featstore {name}\n\n```\n{command.get_help(ctx)}\n```\n")
    return "\n".join(parts)


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


def test_the_cli_reference_is_current():
    assert (ROOT / "docs" / "cli.md").read_text() == cli_reference(), \
        "docs/cli.md is stale: regenerate it with `python tests/test_docs.py`"


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_option_of_every_command_is_in_the_reference(name):
    section = (ROOT / "docs" / "cli.md").read_text().split(f"## featstore {name}\n")[1].split("\n## ")[0]
    for param in cli.commands[name].params:
        for option in param.opts if isinstance(param, click.Option) else []:
            assert option in section, f"featstore {name} {option} is not documented in docs/cli.md"


def test_readme_names_every_command():
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in cli.commands if f"`{name}`" not in readme]
    assert not missing, f"README.md does not mention: {', '.join(missing)}"


def test_nothing_refers_to_documents_outside_the_repository():
    files = [p for pattern in ("*.py", "*.sql", "*.md", "*.toml") for p in ROOT.rglob(pattern)
             if not any(part.startswith(".") or part in ("build", "dist") for part in p.relative_to(ROOT).parts)]
    files = [p for p in files if p.name != "test_docs.py"]
    assert len(files) > 40
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if OUTSIDE_REFERENCES.search(line)]
    assert not hits, f"references to documents outside the repository: {hits}"


if __name__ == "__main__":
    (ROOT / "docs" / "cli.md").write_text(cli_reference())
    print("wrote docs/cli.md")
