"""A featstore error carries its field, value and reason as data; the CLI says the field as the option that sets it
and the value as the user typed it, found in its own declarations and this invocation's arguments, never by
rewriting the library's text; no library message names a command-line flag."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import fails

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("featstore", "analytics", "workflows", "probing", "api")
FLAG = re.compile(r"(?<![\w-])--[a-z]")  # a command-line flag, not a `--` in prose


def _calls(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            yield node, func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _message_texts(node: ast.Call) -> str:
    return "".join(n.value for a in node.args for n in ast.walk(a) if isinstance(n, ast.Constant)
                   and isinstance(n.value, str))


def test_the_cli_rewrites_no_message_text():
    """No regex substitution or compiled pattern in cli/: a message is said from its parts, not fixed up."""
    found = [f"{p.name}:{node.lineno} re.{name}" for p in sorted((ROOT / "cli").glob("*.py"))
             for node, name in _calls(p) if name in ("sub", "subn", "compile")
             and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
             and node.func.value.id == "re"]
    assert found == []


def test_no_library_message_names_a_flag():
    """Below cli/ a message names a field as a Python caller sets it (or a `Name` the CLI spells as its flag);
    a `--flag` in a raise or a warning is the CLI's word in the library."""
    found = []
    for folder in LIBRARY:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node, name in _calls(path):
                is_message = name == "warn" or name.endswith(("Error", "Warning")) or name in (
                    "UnconvergedProbe", "RenamedVariant", "TooManyThreads", "LabelsNearChance")
                if is_message and FLAG.search(_message_texts(node)):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_the_cli_keeps_no_module_level_record_of_the_invocation():
    """No module-level dict, list or set in cli/ that a command fills (what the user said lives in click's
    context of this invocation)."""
    found = []
    for path in sorted((ROOT / "cli").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            empty = (isinstance(value, ast.Dict | ast.List | ast.Set) and not getattr(value, "keys", None)
                     and not getattr(value, "elts", None)) or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id in ("dict", "list", "set") and not value.args)
            if empty:
                found.append(f"{path.name}:{node.lineno}")
    assert found == []


def test_a_bad_field_is_data_a_program_can_read(tmp_path):
    """The field, the value and the reason of a refusal, as attributes (scikit-learn's InvalidParameterError names
    its parameter), and the one line says them."""
    import featstore as fs

    with pytest.raises(fs.FeatstoreError) as refused:
        fs.ModelSpec("resnet18", image_size=0)
    e = refused.value
    assert (e.field, e.value) == ("image_size", 0)
    assert e.reason.startswith("must be") and str(e) == f"image_size=0: {e.reason}"

    missing = tmp_path / "none.zarr"
    with pytest.raises(fs.FeatstoreError) as refused:
        fs.open_store(missing)
    e = refused.value
    assert e.field == "store" and Path(e.value) == missing.absolute()
    assert "fs.build(" in str(e) and "featstore build" not in str(e)  # a Python caller is told the Python call


@pytest.mark.parametrize("args, head", [
    (("info", "--store", "sub/none.zarr"), "--store sub/none.zarr: no featstore store there"),
    (("info", "./sub/../sub/none.zarr"), "--store ./sub/../sub/none.zarr: "),  # the old positional spelling
    (("info", "--store", "view=clean.zarr"), "--store view=clean.zarr: "),  # a value that reads like a field
    (("timeline", "--db", "sub/none.duckdb"), "--db sub/none.duckdb: no database there"),
    (("report", "--db", "./sub/none.duckdb"), "--db ./sub/none.duckdb: no database there"),
])
def test_the_cli_says_the_flag_and_the_value_as_typed(tmp_path, monkeypatch, args, head):
    """A relative path the library made absolute is said as the user typed it, under the flag that set it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    line = fails(*args)
    assert line.startswith(f"featstore: error: {head}"), line
    assert str(tmp_path) not in line, line


def test_a_field_named_inside_a_reason_is_said_as_the_commands_flag(tmp_path):
    """A field the reason names (`Name`) is the flag of the command that runs: `merge` without a source."""
    line = fails("merge", "--db", tmp_path / "t.duckdb")
    assert line == "featstore: error: name at least one source database to fold into --db", line


def test_a_warning_that_names_a_field_carries_it():
    """featstore's warnings are data as its errors are: `--threads` past the cores names the field and the value."""
    import os

    from featstore.threads import TooManyThreads, check_pinned

    many = len(os.sched_getaffinity(0)) + 1  # the cores this process may run on, read independently
    with pytest.warns(TooManyThreads) as caught:
        check_pinned(many)
    warning = caught[0].message
    assert (warning.field, warning.value) == ("threads", many)
    assert str(warning) == f"threads={many}: {warning.reason}" and "`threads`" in warning.reason
