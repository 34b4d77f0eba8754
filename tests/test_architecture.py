"""The code's real import graph matches the folders, and the anchor description is the one used everywhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from featstore.nets.extraction import Tapper, describe_anchors, runnable_anchor_names
from featstore.nets.models import load_model
from featstore.store.reader import FeatureStore

from conftest import fails, run_cli

ROOT = Path(__file__).resolve().parents[1]

# folder -> its package name, lowest layer first; a layer may import only the layers before it. "api" is the public
# API (the api/ folder, installed as featstore.api; docs/python.md): above the jobs, below the CLI that calls it
LAYERS = [("featstore", "featstore"), ("probing", "featstore.probing"), ("analytics", "featstore.analytics"),
          ("workflows", "featstore.workflows"), ("api", "featstore.api"), ("cli", "featstore.cli")]
# the package's front door: `import featstore as fs` re-exports the API's names (and the records its calls take),
# imported on first use. It is the one file of featstore/ that names a layer above the core (checked on its own
# below), not a part of the core
FRONT_DOOR = "featstore/__init__.py"
# the libraries a layer must never import: the core and the probes know no database, analytics knows no network,
# the API reaches the database only through analytics
FORBIDDEN = {"featstore": ("duckdb",), "probing": ("duckdb",), "analytics": ("torch", "torchvision", "timm"),
             "api": ("duckdb",)}


# the core's own house, lowest first: a part may import only the parts before it. The top-level modules are the
# foundation every part shares (errors, records, the value schema and its defaults, runtime, threads); images know
# no network and no store; the networks use the images' preprocessing; the store records the networks' anchors and
# the image table; compute (the build's forward, prefix costs, attributions, similarity, the job specs) uses all
CORE = [("foundation", "featstore"), ("images", "featstore.images"), ("nets", "featstore.nets"),
        ("store", "featstore.store"), ("compute", "featstore.compute")]
# every module of the installed package, by the folder it lives in (pyproject's package-dir)
PACKAGES = {"featstore": "featstore", "probing": "featstore.probing", "analytics": "featstore.analytics",
            "workflows": "featstore.workflows", "api": "featstore.api", "cli": "featstore.cli"}


def _files(folder: str) -> list[Path]:
    """The files of a layer: a folder's (the core's sub-packages included), the front door standing apart."""
    return sorted(p for p in (ROOT / folder).rglob("*.py") if p.relative_to(ROOT).as_posix() != FRONT_DOOR)


def _core_part(path_or_module: Path | str) -> int | None:
    """The rank in CORE of a core file or module name (None outside the core and for the API's files)."""
    if isinstance(path_or_module, Path):
        rel = path_or_module.relative_to(ROOT)
        if rel.parts[0] != "featstore" or rel.as_posix() == FRONT_DOOR:
            return None
        return next((i for i, (name, _) in enumerate(CORE) if len(rel.parts) > 2 and rel.parts[1] == name), 0)
    for rank, (_, package) in reversed(list(enumerate(CORE))):
        if rank and (path_or_module == package or path_or_module.startswith(package + ".")):
            return rank
    return 0 if _layer_of(path_or_module) == 0 else None


def _modules() -> dict[str, Path]:
    """Every module of the package, by its import name."""
    found = {}
    for folder, package in PACKAGES.items():
        for p in sorted((ROOT / folder).rglob("*.py")):
            parts = p.relative_to(ROOT / folder).with_suffix("").parts
            found[".".join((package, *parts)).removesuffix(".__init__")] = p
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (at any depth of the file), each import resolved to the longest
    module name it starts with. A module's import of its own parent package (`from featstore import __version__`)
    is no edge: a package is always initialised before its modules."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        targets = {resolve(name) for _, name in _imports(path)}
        graph[module] = {t for t in targets if t and t != module and not module.startswith(t + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _layer_of(module: str) -> int | None:
    for rank, (_, package) in reversed(list(enumerate(LAYERS))):
        if module == package or module.startswith(package + "."):
            return rank
    return None


def _imports(path: Path, prefix: str = "featstore") -> list[tuple[int, str]]:
    """Every import of a file whose module starts with `prefix`, at any depth (function-level imports included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name == prefix or name.startswith(prefix + ".")]


def test_imports_run_one_way():
    wrong = []
    for rank, (folder, _) in enumerate(LAYERS):
        files = _files(folder)
        assert files, folder
        for path in files:
            for line, name in _imports(path):
                target = _layer_of(name)
                if target is not None and target > rank:
                    wrong.append(f"{folder}/{path.name}:{line} imports {name}")
    assert not wrong, "imports against the layering cli -> workflows -> analytics -> probing -> featstore:\n" + \
        "\n".join(wrong)


def test_the_front_door_only_reexports_on_first_use():
    """featstore/__init__.py imports nothing of the package when it runs (its names' modules only in its
    `TYPE_CHECKING` block, for tools), and `import featstore` loads neither torch nor DuckDB nor any module of the
    package (each name comes on first use)."""
    import subprocess
    import sys

    tree = ast.parse((ROOT / FRONT_DOOR).read_text())
    at_run_time = [node.lineno for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)
                   and any(name.startswith("featstore") for name in [getattr(node, "module", None) or "",
                                                                     *(a.name for a in node.names)])]
    assert not at_run_time, at_run_time
    code = ("import sys, featstore\nprint(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'duckdb') "
            "or m.startswith('featstore.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_the_cli_is_thin_over_the_api():
    """cli/ imports of featstore only the API (featstore.api), its own modules and featstore.errors, function-level
    imports included: every command is options -> one fs call -> print."""
    allowed = ("featstore.api", "featstore.cli", "featstore.errors")
    wrong = [f"cli/{path.name}:{line} imports {name}" for path in _files("cli") for line, name in _imports(path)
             if not any(name == a or name.startswith(a + ".") for a in allowed)]
    assert not wrong, "\n".join(wrong)
    assert _imports(ROOT / "cli" / "main.py")  # the scan sees the CLI's imports


def test_the_core_folder_imports_nothing_above_it():
    """featstore/ (all but its front door) imports no module of probing/, analytics/, workflows/, the API or cli/."""
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}" for path in _files("featstore")
             for line, name in _imports(path) if (_layer_of(name) or 0) > 0]
    assert not wrong, "\n".join(wrong)


def test_the_layering_test_sees_function_level_imports(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from featstore.workflows import probe\n    import duckdb\n    return probe\n")
    assert _imports(bad) == [(2, "featstore.workflows"), (2, "featstore.workflows.probe")]
    assert _imports(bad, "duckdb") == [(3, "duckdb")]
    assert _layer_of("featstore.workflows.probe") == 3 and _layer_of("featstore.store.reader") == 0
    assert _layer_of("featstore.api") == 4 and _layer_of("featstore") == 0 and _layer_of("featstore.cli.main") == 5
    assert ROOT / FRONT_DOOR not in _files("featstore") and ROOT / "api" / "jobs.py" in _files("api")
    assert not (ROOT / "featstore" / "api.py").exists()  # the API is a folder of its own, not a file of the core


def test_the_core_parts_import_one_way():
    """Inside featstore/: foundation <- images <- nets <- store <- compute, function-level imports included."""
    wrong = []
    for path in _files("featstore"):
        rank = _core_part(path)
        for line, name in _imports(path):
            target = _core_part(name)
            if rank is not None and target is not None and target > rank:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({CORE[rank][0]}) imports {name} ({CORE[target][0]})")
    assert not wrong, "imports against the core's order " + " <- ".join(n for n, _ in CORE) + ":\n" + \
        "\n".join(wrong)
    parts = {p.relative_to(ROOT / "featstore").parts[0] for p in _files("featstore") if p.parent != ROOT / "featstore"}
    assert parts == {name for name, _ in CORE[1:]}, parts  # every sub-package has its place in the order


def test_the_core_order_sees_each_part(tmp_path):
    assert _core_part("featstore.store.reader") == 3 and _core_part("featstore.nets.anchors") == 2
    assert _core_part("featstore.errors") == 0 and _core_part("featstore.compute.forward") == 4
    assert _core_part("featstore.workflows.build") is None and _core_part(ROOT / FRONT_DOOR) is None
    assert _core_part(ROOT / "featstore" / "images" / "views.py") == 1
    assert _core_part(ROOT / "featstore" / "schema.py") == 0


def test_no_import_cycle_between_modules():
    """The real import graph of every module (function-level imports included) has no circle."""
    graph = _import_graph()
    assert "featstore.nets.depth" in graph["featstore.nets.listing"]
    assert "featstore.nets.extraction" in graph["featstore.nets.depth"]
    cycles = _cycles(graph)
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_name_is_shared_by_two_layers():
    """One name, one place: a module's file name (`cost.py`, `circuits.py`) appears in one layer only."""
    seen: dict[str, set[str]] = {}
    for folder, _ in LAYERS:
        for path in _files(folder):
            if path.name != "__init__.py":
                seen.setdefault(path.stem, set()).add(folder)
    shared = {name: sorted(folders) for name, folders in seen.items() if len(folders) > 1}
    assert not shared, shared


def test_each_layer_keeps_to_its_libraries():
    wrong = [f"{folder}/{path.name}:{line} imports {name}"
             for folder, banned in FORBIDDEN.items() for path in _files(folder)
             for library in banned for line, name in _imports(path, library)]
    assert not wrong, "\n".join(wrong)


def test_analytics_runs_without_loading_torch():
    """Not only its own imports: nothing analytics imports from the core may pull in torch either."""
    import subprocess
    import sys

    modules = [f"featstore.analytics.{p.stem}" for p in sorted((ROOT / "analytics").glob("*.py"))]
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            "print(sorted(m for m in ('torch', 'torchvision', 'timm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_jobs_that_persist_live_in_workflows():
    """Only analytics/db.py opens a database for writing, and only workflows/ call it that way; the CLI opens
    none itself (its query commands go through the API's `connect`, read-only: a `Results`)."""
    writers = []
    for folder in ("featstore", "probing", "analytics", "workflows", "api", "cli"):
        for path in _files(folder):
            if (folder, path.name) == ("analytics", "db.py"):
                continue
            tree = ast.parse(path.read_text())
            results = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                       and n.module == "featstore.api.results" for a in n.names if a.name == "connect"}  # read-only
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
                        == "connect") or getattr(node.func, "id", None) in results:
                    continue
                read_only = any(k.arg == "read_only" and getattr(k.value, "value", None) is True
                                for k in node.keywords)
                if folder != "workflows" and not read_only:
                    writers.append(f"{folder}/{path.name}:{node.lineno}")
    assert not writers, "writing connections outside workflows/: " + ", ".join(writers)


@pytest.mark.parametrize("model", ["resnet18", "timm/vit_tiny_patch16_224"])
def test_every_listed_name_is_accepted_verbatim_by_anchors(model, image_dir, tmp_path):
    """`featstore anchors --all` prints exactly the names a build extracts: all of them in one build."""
    loaded = load_model(model, weights="none", image_size=32)
    sample = loaded.preprocessing.normalize(torch.zeros(1, 3, 32, 32))
    names = runnable_anchor_names(loaded.module.eval(), sample)
    listed = run_cli("anchors", "--model", model, "--all").output.split()
    assert set(names) <= set(listed) and len(listed) == len(set(listed))
    if "vit" in model:
        assert {"blocks.0.resid_mid", "blocks.11.act", "blocks.3.attn.qkv"} <= set(names)
    else:
        assert {"layer1.0.mid", "layer4.1.bn2", "fc"} <= set(names)
    store = tmp_path / "s.zarr"
    run_cli("build", "--model", model, "--weights", "none", "--image-size", "32", "--data", image_dir, "--store",
            store, "--anchors", ",".join(names), "--limit", "2", "--workers", "0", "--no-progress")
    stored = FeatureStore(store).anchors(model.replace("/", "_"))
    assert [a.name for a in stored] == names


def test_unknown_anchor_names_the_closest_valid_ones(image_dir, tmp_path):
    line = fails("build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--data", image_dir,
                 "--store", tmp_path / "s.zarr", "--anchors", "layer1.0.md,relu")
    assert "layer1.0.mid" in line and "--all" in line
    assert not (tmp_path / "s.zarr").exists()


def test_the_tapper_hooks_what_the_anchor_describes():
    """Input-side taps are read before their module runs, `.mid` gets its ReLU: checked by hand."""
    torch.manual_seed(0)
    model = load_model("resnet18", weights="none", image_size=32).module.eval()
    x = torch.randn(2, 3, 32, 32)
    anchors, classes, _ = describe_anchors(model, ["layer1.0.mid", "layer2"], x)
    assert [(a.module, a.side, a.post, a.dim) for a in anchors] == [("layer1.0.bn1", "output", "relu", 64),
                                                                   ("layer2", "output", None, 128)]
    assert classes == 1000
    with Tapper(model, anchors) as tapper, torch.no_grad():
        (mid, layer2), _ = tapper.forward(x)
        stem = model.maxpool(model.relu(model.bn1(model.conv1(x))))
        block = model.layer1[0]
        assert torch.allclose(mid, torch.relu(block.bn1(block.conv1(stem))).mean((2, 3)), atol=1e-5)
        assert torch.allclose(layer2, model.layer2(model.layer1(stem)).mean((2, 3)), atol=1e-5)


def test_macro_install_order_is_derived_from_every_sql_file():
    from featstore.analytics.db import MACROS

    files = {p.stem for p in (ROOT / "sql").glob("*.sql")}
    assert set(MACROS) == files - {"schema", "derive_decisions", "merge_conflicts", "merge_disagreements", "merge_rows",
                                   "database_identity", "migrate_runs", "defined_objects", "shadowing_objects",
                                   "macro_set", "__init__"}
    position = {name: i for i, name in enumerate(MACROS)}
    assert position["prediction_islands"] < position["exit_events"] < position["exit_simulation"]
    assert position["in_scope"] < position["decision_layers"] < position["decision_summary"]


def test_islands_are_written_once():
    users = [p.name for p in (ROOT / "sql").glob("*.sql")
             if re.search(r"row_number\(\) OVER \(PARTITION BY [^)]*image_id, pred", p.read_text())]
    assert users == ["prediction_islands.sql"]
    for name in ("derive_decisions", "exit_events", "tap_decision_layers", "joint_decisions"):
        assert "prediction_islands(" in (ROOT / "sql" / f"{name}.sql").read_text()


def test_an_old_database_gets_this_versions_macros_through_featstore_sql(tmp_path):
    import duckdb

    from featstore.analytics.db import connect

    db = tmp_path / "old.duckdb"
    connect(db).close()
    con = duckdb.connect(str(db))  # what an older featstore might have left in the file
    con.execute("CREATE OR REPLACE MACRO decision_summary(k, scope := 'auto') AS TABLE SELECT 42 AS stale")
    con.close()
    header = run_cli("sql", "--db", db, "--format", "csv", "SELECT * FROM decision_summary(2)").output.splitlines()[0]
    assert "stale" not in header and "never_stable" in header
    con = duckdb.connect(str(db), read_only=True)  # the file itself is untouched by a read-only client
    assert con.execute("SELECT * FROM decision_summary(2)").fetchall() == [(42,)]
    con.close()


def test_a_duckdb_file_that_is_not_featstores_is_one_line(tmp_path):
    import duckdb

    db = tmp_path / "other.duckdb"
    duckdb.connect(str(db)).close()
    assert "is not a featstore database" in fails("sql", "--db", db, "SELECT 1")


def test_scopes_are_one_list_in_sql_and_python(tmp_path):
    from featstore.analytics.db import connect
    from featstore.analytics.queries import query
    from featstore.errors import FeatstoreError
    from featstore.schema import SCOPES

    db = tmp_path / "f.duckdb"
    con = connect(db)
    con.execute("INSERT INTO images (dataset, image_id, path, label, split) VALUES ('d', 0, 'a.png', 0, 'test')")
    con.close()
    for scope in SCOPES:
        assert query(db, "SELECT in_scope(?, 'test', 0) AS x", [scope])["x"][0] == (scope in ("auto", "all", "test"))
    with pytest.raises(FeatstoreError, match="scope 'tst': use auto, all, train, val or test"):
        query(db, "SELECT * FROM images WHERE in_scope('tst', split, 0)")


def test_a_store_written_before_anchors_had_a_side_still_resumes(image_dir, tmp_path):
    """Older stores kept the hook side in `post` ("input"); the same build must still match them."""
    import json

    import zarr

    store = tmp_path / "s.zarr"
    args = ("build", "--model", "timm/vit_tiny_patch16_224", "--weights", "none", "--image-size", "32", "--data",
            image_dir, "--store", store, "--taps", "resid_mid,ln2", "--limit", "2", "--workers", "0", "--no-progress")
    run_cli(*args)
    group = zarr.open_group(str(store), mode="a")["timm_vit_tiny_patch16_224"]
    config = json.loads(json.dumps(dict(group.attrs)["config"]))
    for a in config["anchors"]:
        side = a.pop("side")
        a["post"] = "input" if side == "input" else a["post"]
    group.attrs["config"] = config
    assert "0 chunk(s) written, 1 already done" in run_cli(*args).output
    assert FeatureStore(store).anchors("timm_vit_tiny_patch16_224")[0].side == "input"


def _sql_strings(path: Path) -> list[tuple[int, str]]:
    """The SQL text of every execute/executemany/query/sql call in a file (string literals, f-strings and
    concatenations of them as the first argument)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", None))
        if name not in ("execute", "executemany", "query", "sql"):
            continue
        arg = node.args[1] if name == "query" and len(node.args) > 1 else node.args[0]
        text = "".join(str(n.value) for n in ast.walk(arg) if isinstance(n, ast.Constant) and isinstance(n.value, str))
        if text:
            found.append((node.lineno, text))
    return found


def test_analytical_sql_lives_in_sql_files():
    """Python keeps inserts, deletes, plain lookups and macro calls; anything with a JOIN, a GROUP BY or a window
    is a macro in sql/."""
    import re

    analytical = re.compile(r"\bJOIN\b|\bGROUP\s+BY\b|\bOVER\s*\(|\bLATERAL\b", re.IGNORECASE)
    wrong = [f"{folder}/{path.name}:{line}: {text[:80]}" for folder, _ in LAYERS
             for path in _files(folder) for line, text in _sql_strings(path)
             if analytical.search(text)]
    assert not wrong, "\n".join(wrong)
    assert _sql_strings(Path(__file__))  # the scan sees calls (this file has some)


def test_the_cli_build_and_probe_call_the_public_api():
    """`featstore build` and `featstore probe` run `fs.build` / `fs.probe` (docs/python.md), not the jobs beneath."""
    tree = ast.parse((ROOT / "cli" / "main.py").read_text())
    for command in ("build", "probe"):
        body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == command)
        imported = {(n.module, a.name) for n in ast.walk(body) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert ("featstore.api.jobs", command) in imported, command
        assert not any(module in ("featstore.workflows.build", "featstore.workflows.probe") and name == command
                       for module, name in imported), command


def test_the_suites_longest_first_list_names_test_files_that_exist():
    """conftest's scheduling hint names real files (a renamed file would silently drop to the back)."""
    from conftest import LONGEST_FIRST

    here = Path(__file__).resolve().parent
    assert [name for name in LONGEST_FIRST if not (here / name).is_file()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
