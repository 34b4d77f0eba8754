"""Every option declared once: one `click.option` call, and every default and choice an option shares with a
record or a library function read from one declaration (featstore.schema, the record), never a second literal."""

from __future__ import annotations

import ast
import functools
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
    ("cka", "progress"): "fs.cka draws no bars unless asked (a notebook); the command draws them, as every command",
}

# options only the command line has (how it prints, a folder of its own), with why: no library default to read
CLI_ONLY = {
    **{(command, "fmt"): "how the command prints its table" for command in (
        "compare", "css", "ddb", "exit-sim", "info", "sql", "taps", "timeline", "zoo")},
    ("compare", "part"): "which part of the comparison the command prints",
    ("demo", "out"): "the command's folder in the working directory; a Python caller names one",
}


def _macro(name: str) -> dict:
    """The defaults of SQL macro `name` (sql/NAME.sql) as Python values: what a command that leaves an argument out
    of its call computes."""
    import re

    head = re.search(rf"CREATE OR REPLACE MACRO {name}\(([^)]*)\)", (ROOT / "sql" / f"{name}.sql").read_text())
    return {m[1]: ast.literal_eval(m[2]) for m in re.finditer(r"(\w+) := ('[^']*'|[\d.]+)", head[1])}


@functools.cache
def _sources():
    """command -> the records, functions and SQL macros whose defaults its options fill; every command has an entry
    (an empty one where no option has a default of the library's)."""
    from featstore.analytics.circuit_graphs import circuit_shift
    from featstore.analytics.exit_policies import DEFAULT_POLICIES as policies
    from featstore.analytics.exit_policies import ExitPolicies
    from featstore.analytics.queries import compare, k_sweep
    from featstore.analytics.report import write_report
    from featstore.api.results import Results
    from featstore.api.store import Store
    from featstore.api.tasks import anchors, cka, demo, export, gate, gc, merge, study
    from featstore.compute.attribution import CircuitConfig
    from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
    from featstore.workflows.build import BuildConfig
    from featstore.workflows.cost import measure_model
    from featstore.workflows.demo import run_demo
    from featstore.workflows.gate import train_gate
    from featstore.workflows.gc import collect
    from featstore.workflows.probe import ProbeConfig
    from featstore.workflows.zoo import ZooConfig

    specs = (ModelSpec, ImageSource, RunOptions)
    return {"build": (BuildConfig, *specs), "probe": (ProbeConfig, RunOptions), "circuits": (CircuitConfig, *specs),
            "zoo": (ZooConfig, ImageSource, RunOptions), "cost": (measure_model, RunOptions),
            "compare": (compare, Results.compare), "report": (write_report, Results.report),
            "css": (circuit_shift, Results.css, _macro("css")), "demo": (run_demo, demo, RunOptions), "cka": (cka,),
            "anchors": (anchors,), "ddb": (Results.ddb, _macro("ddb")),
            "exit-sim": (Results.early_exit, ExitPolicies, {"combined_thresholds": policies.combined}),
            "export": (export,), "gate": (gate, train_gate), "gc": (gc, collect), "info": (), "merge": (merge,),
            "sql": (Results.sql,), "study": (study,), "taps": (Results.taps,), "timeline": (Results.k_sweep, k_sweep),
            "verify": (Store.verify,)}


def _defaults(source) -> dict:
    """A record's field defaults, or a function's keyword defaults."""
    if isinstance(source, dict):
        return source
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


def _context(command: str) -> click.Context:
    """`featstore COMMAND` with no argument, every option at its default (parsed as the command parses it: '1,64' is
    [1, 64])."""
    from featstore.cli.main import cli

    group = click.Context(cli, info_name="featstore", **cli.context_settings)  # as `featstore COMMAND` makes it: a
    # command's context without the group's would cache a help option without -h (docs/cli.md would read stale)
    return cli.commands[command].make_context(command, [], parent=group, resilient_parsing=True)


def test_every_command_is_covered():
    """Each command of the `featstore` group, as click lists it, has its entry here: a new command is checked too."""
    from featstore.cli.main import cli

    assert sorted(cli.commands) == sorted(_sources())


@pytest.mark.parametrize("command", sorted(_sources()))
def test_every_option_is_declared_once(command):
    """Each option of `command` with a default (or a choice list) takes it from a declaration: the record field,
    function argument or macro argument of the same name (a library default of None leaving it to the schema), the
    schema's `FIELDS` entry, or a schema constant for its choices; an option no library function has says why
    (`CLI_ONLY`)."""
    import featstore.schema as schema

    context = _context(command)
    sources = [_defaults(source) for source in _sources()[command]]
    choice_lists = [tuple(v) for v in vars(schema).values() if isinstance(v, tuple)]
    unexplained = []
    for param in context.command.params:
        name, value = param.name, context.params.get(param.name)
        if not isinstance(param, click.Option) or param.hidden or (command, name) in OWN_DEFAULTS:
            continue
        field = schema.FIELDS.get(name)
        declared = [] if field is None or field.default is None else [field.default]
        declared += [schema.KS] if name == "ks" else []  # --k's default: the sweep's windows
        library = [s[name] for s in sources if name in s]
        given = [*declared, *(d for d in library if d is not None)]  # None: the library leaves it to another
        for expected in given if given or value is not None else library:
            assert _plain(value) == _plain(expected), f"{command} {name}: {value!r}, declared {expected!r}"
        if isinstance(param.type, click.Choice):
            choices = tuple(param.type.choices)
            assert (field is not None and getattr(field, "choices", ()) == choices) or choices in choice_lists or (
                (command, name) in CLI_ONLY), f"{command} {name}: choices {choices} declared nowhere"
        flag_off = param.is_flag and value is False
        if not given and value is not None and not flag_off and (command, name) not in CLI_ONLY:
            unexplained.append(f"{name}={value!r}")
    assert unexplained == [], command


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


def test_every_macro_defaults_as_the_schema():
    """The SQL macros keep their own defaults (a `featstore sql` user calls `decision_layers(2)`), and the Python side
    passes every argument it has: each macro default of a declared name is the schema's (min_conf: stability alone,
    or the joint criterion's threshold in the definitions compare reads; kmax: the largest default window)."""
    import re

    import featstore.schema as schema

    allowed = {"scope": {schema.SCOPE}, "band": {schema.BAND}, "k": {schema.K}, "per_pair": {schema.PER_PAIR},
               "min_conf": {schema.MIN_CONF, schema.JOINT_MIN_CONF}, "kmax": {max(schema.KS)},
               "tau": {schema.TAU}, "top_n": {schema.TOP_N}, "bins": {schema.CALIBRATION_BINS},
               "binning": {schema.CALIBRATION_BINNINGS[0]}, "min_n": {schema.CALIBRATION_MIN_N}}
    other = {("decision_band", "k")}  # the window decision_band's thirds leave out (0: the paper's band), no k
    seen, wrong = set(), []
    for path in sorted((ROOT / "sql").glob("*.sql")):
        for head in re.finditer(r"CREATE OR REPLACE MACRO (\w+)\(([^)]*)\)", path.read_text()):
            for name, literal in re.findall(r"(\w+) := ('[^']*'|[\d.]+)", head[2]):
                if name in allowed and (head[1], name) not in other:
                    seen.add(name)
                    if ast.literal_eval(literal) not in allowed[name]:
                        wrong.append(f"{head[1]}: {name} := {literal}")
    assert wrong == [] and seen == set(allowed)


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


# a parameter or record field of one of these names defaults to the schema's declaration, read by its name
DECLARED_DEFAULTS = {"scope": "SCOPE", "band": "BAND", "split": "GATE_SPLIT", "k": "K", "ks": "KS",
                     "min_conf": "MIN_CONF", "per_pair": "PER_PAIR", "min_age": "MIN_AGE_S", "min_age_s": "MIN_AGE_S",
                     "weights": "WEIGHTS", "device": "DEVICE", "view": "VIEW", "variant": "VARIANT", "tau": "TAU",
                     "top_n": "TOP_N", "ig_steps": "IG_STEPS", "val_frac": "VAL_FRAC", "chunk_rows": "CHUNK_ROWS",
                     "memory_budget": "MEMORY_BUDGET", "repeats": "REPEATS"}
PACKAGE = ("featstore", "analytics", "workflows", "probing", "api", "cli")


def _literal_defaults(tree: ast.AST) -> list[tuple[str, ast.expr]]:
    """(name, default) of every function parameter and class-body field with a default, as written."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = args.posonlyargs + args.args
            found += [(a.arg, d) for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults,
                                                 strict=True)]
            found += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
        elif isinstance(node, ast.ClassDef):
            found += [(s.target.id, s.value) for s in node.body
                      if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None]
    return found


def test_no_library_default_repeats_a_declared_value():
    """A parameter named `scope` defaulting to the literal 'auto' (or `band` to 'paper', `k` to 2, ...) is a second
    declaration of featstore.schema's value: every function and record reads the declared name instead. A literal of
    another value (`device='cpu'` of a CPU-only helper) is another choice, not a repetition."""
    import featstore.schema as schema

    repeated = []
    for folder in PACKAGE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name, default in _literal_defaults(ast.parse(path.read_text())):
                if name not in DECLARED_DEFAULTS:
                    continue
                try:
                    value = ast.literal_eval(default)
                except ValueError:
                    continue  # a name or a call: read from somewhere
                if _plain(value) == _plain(getattr(schema, DECLARED_DEFAULTS[name])):
                    repeated.append(f"{path.relative_to(ROOT)}:{default.lineno} {name}={value!r}")
    assert repeated == []
    source = "def f(scope: str = 'auto', k: int = K, band='window'):\n    pass\nclass C:\n    view: str = 'clean'\n"
    assert [(n, ast.unparse(d)) for n, d in _literal_defaults(ast.parse(source))] == [
        ("scope", "'auto'"), ("k", "K"), ("band", "'window'"), ("view", "'clean'")]  # the scan reads what it must


def _fresh(code: str) -> list[str]:
    """`code` run in a fresh Python (nothing imported yet), then whether torch got imported: its output lines."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint('torch' in sys.modules)"],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    return done.stdout.strip().splitlines()


def test_an_image_size_no_crop_can_take_is_refused_before_any_model_loads(tmp_path, image_dir, monkeypatch):
    """The smallest crop (16: the preprocessing's rule) is FIELDS' rule: the command, the record and load_model
    refuse 8 in one line before torch is imported or a network built."""
    import featstore.nets.models as models
    from featstore.schema import FIELDS

    assert FIELDS["image_size"].check(16) == 16
    args = ["build", "--model", "resnet18", "--weights", "none", "--data", str(image_dir), "--store",
            str(tmp_path / "s.zarr"), "--image-size", "8"]
    said = _fresh(f"from click.testing import CliRunner\nfrom featstore.cli.main import cli\n"
                  f"r = CliRunner().invoke(cli, {args!r})\nprint(r.exit_code)\nprint(r.output.strip())")
    assert said == ["2", "featstore: error: --image-size 8: must be a whole number >= 16 (featstore build -h lists "
                    "the options)", "False"]
    assert not (tmp_path / "s.zarr").exists()
    said = _fresh("from featstore.compute.specs import ModelSpec\ntry:\n    ModelSpec('resnet18', 'none', 8)\n"
                  "except ValueError as e:\n    print(e)")
    assert said == ["image_size=8: must be a whole number >= 16", "False"]

    def built(*_args, **_kwargs):
        raise AssertionError("a network was built")

    monkeypatch.setattr(models, "_create_torchvision", built)
    monkeypatch.setattr(models, "_create_timm", built)
    with pytest.raises(ValueError, match=r"^image_size=8: must be a whole number >= 16$"):
        models.load_model("resnet18", "none", image_size=8)
