"""Every option declared once: one `click.option` call, and every default and choice an option shares with a
record or a library function read from one declaration (featstore.schema, the record), never a second literal."""

from __future__ import annotations

import ast
import inspect
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parent.parent

# options whose default differs from the record's on purpose, with why
OWN_DEFAULTS = {
    ("circuits", "weights"): "circuits read a timm checkpoint: its default tag (schema.TIMM_WEIGHTS), not the "
                             "paper's torchvision weights",
    ("--min-conf", ""): "timeline: stability alone (0), as k_sweep's own default; compare and the report take the "
                        "joint criterion's threshold",
    ("cka", "progress"): "fs.cka draws no bars unless asked (a notebook); the command draws them, as every command",
    ("report", "ks"): "None: the report's windows, DEFAULT_POLICIES.ks, which --k's default spells",
}


def _sources():
    """command -> the records and functions whose defaults its options fill."""
    from featstore.analytics.circuit_graphs import circuit_shift
    from featstore.analytics.queries import compare
    from featstore.analytics.report import write_report
    from featstore.api.results import Results
    from featstore.api.tasks import cka, demo
    from featstore.compute.attribution import CircuitConfig
    from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
    from featstore.workflows.build import BuildConfig
    from featstore.workflows.cost import measure_model
    from featstore.workflows.demo import run_demo
    from featstore.workflows.probe import ProbeConfig
    from featstore.workflows.zoo import ZooConfig

    specs = (ModelSpec, ImageSource, RunOptions)
    return {"build": (BuildConfig, *specs), "probe": (ProbeConfig, RunOptions), "circuits": (CircuitConfig, *specs),
            "zoo": (ZooConfig, ImageSource, RunOptions), "cost": (measure_model, RunOptions),
            "compare": (compare, Results.compare), "report": (write_report, Results.report),
            "css": (circuit_shift, Results.css), "demo": (run_demo, demo), "cka": (cka,)}


def _defaults(source) -> dict:
    """A record's field defaults, or a function's keyword defaults."""
    if is_dataclass(source):
        return {f.name: f.default for f in fields(source) if f.default is not MISSING}
    return {name: p.default for name, p in inspect.signature(source).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _plain(value):
    return [_plain(v) for v in value] if isinstance(value, list | tuple) else value


def test_one_click_option_call():
    calls = [(path.name, node.lineno) for path in sorted((ROOT / "cli").glob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "option"
             and getattr(node.func.value, "id", None) == "click"]
    assert len(calls) == 1 and calls[0][0] == "options.py", calls


@pytest.mark.parametrize("command", sorted(_sources()))
def test_every_option_is_declared_once(command):
    """Each option of `command` that fills a record field or a function argument of the same name defaults to what
    that record or function says (parsed as the command parses it: '1,64' is (1, 64))."""
    from featstore.cli.main import cli

    cmd = cli.commands[command]
    group = click.Context(cli, info_name="featstore", **cli.context_settings)  # as `featstore COMMAND` makes it: a
    # command's context without the group's would cache a help option without -h (docs/cli.md would read stale)
    given = cmd.make_context(command, [], parent=group, resilient_parsing=True).params  # every option, defaulted
    checked = []
    for source in _sources()[command]:
        for name, expected in _defaults(source).items():
            if name not in given or (command, name) in OWN_DEFAULTS:
                continue
            assert _plain(given[name]) == _plain(expected), f"{command} {name}: {given[name]!r}, {source}: {expected!r}"
            checked.append(name)
    assert checked, command


def _declarations() -> list[tuple[str, str, str, ast.Call]]:
    """(flag, role, dest, the keyword call) of every entry of cli/options.py's OPTIONS table, as written."""
    tree = ast.parse((ROOT / "cli" / "options.py").read_text())
    table = next(n.value for n in tree.body
                 if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "OPTIONS")
    found = []
    for flag, roles in zip(table.keys, table.values, strict=True):
        for role, entry in zip(roles.keys, roles.values, strict=True):
            extra, call = entry.elts
            name = flag.value.split("/")[0].lstrip("-").replace("-", "_")
            dest = extra.elts[0].value if extra.elts else name
            found.append((flag.value, role.value, dest, call))
    return found


def test_no_option_repeats_a_declared_default_or_choice():
    """A default or a choice list written as a literal in cli/options.py, for a name a record, a library function
    or featstore.schema.FIELDS declares, is a second declaration: it must be read from the first."""
    from featstore.schema import FIELDS

    declared = set(FIELDS)
    for sources in _sources().values():
        for source in sources:
            declared |= set(_defaults(source))
    repeated = []
    for flag, role, dest, call in _declarations():
        if dest not in declared or (flag, role) in OWN_DEFAULTS:
            continue
        for keyword in call.keywords:
            if keyword.arg == "default" and isinstance(keyword.value, ast.Constant) and not isinstance(
                    keyword.value.value, bool | type(None)):
                repeated.append(f"{flag} ({role or 'one role'}): default={keyword.value.value!r}")
            if keyword.arg == "type" and any(isinstance(n, ast.List | ast.Tuple) for n in ast.walk(keyword.value)):
                repeated.append(f"{flag} ({role or 'one role'}): its choices")
    assert repeated == []
    assert ("--decode", "", "decode") in [d[:3] for d in _declarations()]  # the scan sees the table


def test_the_decode_choices_are_the_schemas():
    from featstore.cli.main import cli
    from featstore.schema import DECODES

    decode = next(p for p in cli.commands["build"].params if p.name == "decode")
    assert tuple(decode.type.choices) == DECODES == ("auto", "cpu", "gpu")


def test_the_strength_search_defaults_are_the_grids():
    """Every variant that searches C declares the search's defaults as StrengthGrid / Tolerances hold them."""
    from featstore.probing.base import VARIANTS
    from featstore.probing.strength import StrengthGrid, Tolerances

    grid, tol = StrengthGrid(), Tolerances()
    expected = {"C": grid.pinned, "C_low": grid.low, "C_high": grid.high, "C_per_decade": grid.per_decade,
                "C_step": grid.step, "search_gtol": tol.search_gtol, "gtol": tol.gtol,
                "max_iterations": tol.max_iterations, "memory": tol.memory}
    searching = [cls for cls in VARIANTS.values() if "C_low" in cls.parameters]
    assert len(searching) >= 2  # linear and head-probe
    for cls in searching:
        for name, value in expected.items():
            if name in cls.parameters:
                assert cls.parameters[name].default == value, (cls.name, name)


@pytest.mark.parametrize("file, name, expected", [("ddb.sql", "tau", "TAU"), ("css.sql", "top_n", "TOP_N"),
                                                   ("ddb.sql", "variant", "DDB_VARIANTS"),
                                                   ("css.sql", "distance", "CSS_DISTANCES")])
def test_the_sql_macros_default_as_the_schema(file, name, expected):
    """A macro called without the argument computes what the command does without the option."""
    import re

    import featstore.schema as schema

    text = (ROOT / "sql" / file).read_text()
    said = re.search(rf"CREATE OR REPLACE MACRO \w+\([^)]*\b{name} := ('?[\w.]+'?)", text)
    value = getattr(schema, expected)
    assert said and ast.literal_eval(said.group(1)) == (value[0] if isinstance(value, tuple) else value)


def test_a_comma_list_reads_alike_everywhere():
    from featstore.images.views import parse_views
    from featstore.schema import comma_list

    assert comma_list(" clean, ,brightness-1,") == ["clean", "brightness-1"]
    assert [v.name for v in parse_views(" clean, ,brightness-1,")] == ["clean", "brightness-1"]


def test_the_library_names_the_field_and_the_cli_its_flag(tmp_path, image_dir):
    """A Python caller reads the field it set (`val_frac=1.5: ...`, no flag); the command line reads the flag it gave,
    in the same words as before."""
    import featstore as fs
    from featstore.store.location import StoreLocation
    from featstore.workflows.probe import ProbeConfig

    from conftest import fails

    db = tmp_path / "p.duckdb"
    for call in (lambda: ProbeConfig(store=tmp_path / "s.zarr", model="m", db=db, val_frac=1.5),
                 lambda: fs.probe(store=tmp_path / "s.zarr", model="m", db=db, val_frac=1.5)):
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == "val_frac=1.5: must be a number > 0 and < 1"
    assert fails("probe", "--store", tmp_path / "s.zarr", "--model", "m", "--db", db, "--val-frac", "1.5") == (
        "featstore: error: --val-frac 1.5: must be a number > 0 and < 1 (featstore probe -h lists the options)")
    assert not db.exists()
    # a message raised deep in the library (the store's URL), as each face says it
    with pytest.raises(ValueError, match="^store=.ftp://b/s.zarr.: ftp:// is not a storage featstore can reach; "):
        StoreLocation.parse("ftp://b/s.zarr")
    line = fails("build", "--model", "resnet18", "--weights", "none", "--data", image_dir, "--store", "ftp://b/s.zarr")
    assert line.startswith("featstore: error: --store ftp://b/s.zarr: ftp:// is not a storage featstore can reach; ")


def test_what_the_user_gave_is_said_as_given(tmp_path, monkeypatch):
    """A value of the user's that reads like a field (a folder `view=clean.zarr`) is said as typed, under the flag
    that set it."""
    from conftest import fails

    monkeypatch.chdir(tmp_path)
    (tmp_path / "view=clean.zarr").mkdir()
    line = fails("info", "--store", "view=clean.zarr")
    assert line == (
        "featstore: error: --store view=clean.zarr: no featstore store there; build one with `featstore build`")


def test_project_dim_stands_for_the_default_variant_only(tmp_path):
    """--project-dim D means projected:dim=D in place of the default variant: beside the default it is taken, beside
    another variant refused, before anything is read or written."""
    from conftest import fails

    db = tmp_path / "p.duckdb"
    args = ("probe", "--store", tmp_path / "s.zarr", "--model", "m", "--db", db, "--project-dim", "4")
    assert "--project-dim and --variant exclude each other" in fails(*args, "--variant", "knn")
    assert "exclude each other" not in fails(*args, "--variant", "linear")  # the default: on to the missing store
    assert not db.exists()
