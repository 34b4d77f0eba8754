"""Imports a reader, an IDE and a type checker can follow: every name the CLI imports from the API is bound in the
module it names (no module `__getattr__` in api/), the front door's lazy names are the ones its `TYPE_CHECKING`
block imports, and the version is read from the package's metadata, written once."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import featstore

ROOT = Path(__file__).resolve().parents[1]
FRONT_DOOR = ROOT / "featstore" / "__init__.py"
# every folder of the installed package (pyproject's package-dir): featstore/ holds the core and the front door
PACKAGE = {"featstore": "featstore", "probing": "featstore.probing", "analytics": "featstore.analytics",
           "workflows": "featstore.workflows", "api": "featstore.api", "cli": "featstore.cli", "sql": "featstore.sql"}


def _module_file(module: str) -> Path:
    """The repository file of a package module ('featstore.api.store' -> api/store.py)."""
    folder, package = max(((f, p) for f, p in PACKAGE.items() if module == p or module.startswith(p + ".")),
                          key=lambda fp: len(fp[1]))
    rest = module.removeprefix(package).strip(".").split(".") if module != package else []
    path = ROOT.joinpath(folder, *rest)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _bound_at_top(path: Path) -> set[str]:
    """The names a module binds at its top level, outside `if TYPE_CHECKING:` (defs, classes, assignments and
    imports): what `from module import name` finds without a module `__getattr__`."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(ast.parse(path.read_text()).body)
    return names


def _type_checking_imports(path: Path) -> dict[str, str]:
    """Name -> module of every `from module import name` inside the module's `if TYPE_CHECKING:` block."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    found.update({a.asname or a.name: stmt.module for a in stmt.names})
    return found


def test_no_module_of_the_api_resolves_names_through_a_module_getattr():
    api = sorted((ROOT / "api").glob("*.py"))
    assert ROOT / "api" / "__init__.py" in api and ROOT / "api" / "declared.py" in api
    wrong = [p.name for p in api for node in ast.parse(p.read_text()).body
             if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"]
    assert not wrong, f"module __getattr__ in api/: {wrong}"


def test_every_name_the_cli_imports_from_the_api_is_bound_in_the_module_it_names():
    """`from featstore.api.results import connect` in cli/ leads grep and a type checker to a line of
    api/results.py that defines or imports `connect`, function-level imports of the CLI included."""
    seen, unbound = 0, []
    for path in sorted((ROOT / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("featstore.api"):
                bound = _bound_at_top(_module_file(node.module))
                for alias in node.names:
                    seen += 1
                    if alias.name not in bound:
                        unbound.append(f"cli/{path.name}:{node.lineno} {node.module}.{alias.name}")
    assert seen > 20  # the scan sees the CLI's imports of the API
    assert not unbound, "names the API module does not bind:\n" + "\n".join(unbound)


def test_the_front_doors_lazy_names_are_the_ones_its_type_checking_block_imports():
    """What an IDE sees of `import featstore as fs` (the block) is what `fs.NAME` gives at run time."""
    seen = _type_checking_imports(FRONT_DOOR)
    public = featstore._PUBLIC
    assert set(seen) == set(public) == set(featstore.__all__), (set(seen) ^ set(public)) | (
        set(public) ^ set(featstore.__all__))
    assert seen == public
    for name, module in seen.items():
        assert getattr(featstore, name) is getattr(importlib.import_module(module), name), name


def test_import_featstore_loads_neither_torch_duckdb_polars_nor_the_api():
    code = ("import sys, featstore\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'duckdb', 'polars', 'featstore') and m != 'featstore'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def _repository_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0:
        return [ROOT / name for name in listed.stdout.split("\0") if name]
    return [p for p in ROOT.rglob("*") if p.is_file() and not any(part.startswith(".") for part in
                                                                   p.relative_to(ROOT).parts)]


def test_the_version_is_the_packages_metadata_and_is_written_in_one_file():
    version = importlib.metadata.version("featstore")
    assert featstore.__version__ == version
    written = re.compile(rf"(?<![\w.]){re.escape(version)}(?![\w.])")
    files = [p.relative_to(ROOT).as_posix() for p in _repository_files()
             if p.is_file() and written.search(p.read_text(errors="ignore"))]
    assert files == ["pyproject.toml"], files


def test_no_module_of_the_package_reads_the_version_through_the_front_door():
    """The core's version module, not `featstore` itself: the front door is the one module above the core's
    modules that nothing inside the package imports."""
    wrong = []
    for folder in PACKAGE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == FRONT_DOOR:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                through_import = (isinstance(node, ast.ImportFrom) and node.module == "featstore" and node.level == 0
                                  and any(a.name == "__version__" for a in node.names))
                through_attribute = (isinstance(node, ast.Attribute) and node.attr == "__version__"
                                     and isinstance(node.value, ast.Name) and node.value.id in ("featstore", "fs"))
                if through_import or through_attribute:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not wrong, "the version read through `featstore`: " + ", ".join(wrong)
