"""README, docs/ and CI agree with each other and with the CLI (in the manner of sqlite-utils' test_docs).

`docs/cli.md` is every command's `--help`, generated from the CLI: after changing an option, regenerate it with
`python tests/test_docs.py` (this file run as a script).
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

from featstore.cli.main import cli  # noqa: E402

from conftest import run_cli  # noqa: E402

README = ROOT / "README.md"
DOCS = ROOT / "docs"
MARKDOWN = [README, *sorted(DOCS.glob("*.md"))]

REPO_PATH = re.compile(r"(?<![\w./-])((?:featstore|probing|analytics|workflows|api|cli|sql|tests|bench|studies|docs)"
                       r"/[\w./-]*\w\.(?:py|sql|md|toml|sh))")
OUTSIDE_REFERENCES = re.compile(r"SPEC §|seed[- ]00\d|\.\./shared|issue notes?\b|the issue\b")


def _section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same or a higher level."""
    level = heading.split(" ")[0]
    body = text.split(heading, 1)[1]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", body, re.M)]
    return body[:ends[0]] if ends else body


def _prose(text: str) -> str:
    """Markdown without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(text: str) -> set[str]:
    """The fragment GitHub gives each heading: lower case, punctuation dropped, spaces as hyphens, -N on repeats."""
    counts: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", _prose(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{counts[slug]}" if slug in counts else slug)
        counts[slug] = counts.get(slug, 0) + 1
    return anchors


def _repository_files() -> list[Path]:
    files = [p for pattern in ("*.py", "*.sql", "*.md", "*.toml") for p in ROOT.rglob(pattern)
             if not any(part.startswith(".") or part in ("build", "dist") for part in p.relative_to(ROOT).parts)]
    return [p for p in files if p.name != "test_docs.py"]


def _readme_commands() -> list[str]:
    return re.findall(r"```bash\n(python3 -m venv .+)\n```", README.read_text())


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
    table = (DOCS / "build.md").read_text().split("## Options that matter")[1].split("\n## ")[0]
    options = re.findall(r"`(--[a-z-]+)", table)
    assert len(options) > 10
    for option in options:
        assert option in help_text, option


def test_the_cli_reference_is_current():
    assert (ROOT / "docs" / "cli.md").read_text() == cli_reference(), \
        "docs/cli.md is stale: regenerate it with `python tests/test_docs.py`"


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_option_of_every_command_is_in_the_reference(name):
    section = (ROOT / "docs" / "cli.md").read_text().split(f"## featstore {name}\n")[1].split("\n## ")[0]
    for param in cli.commands[name].params:  # hidden ones are the old spellings kept as aliases (cli/options.py)
        for option in param.opts if isinstance(param, click.Option) and not param.hidden else []:
            assert option in section, f"featstore {name} {option} is not documented in docs/cli.md"


def test_readme_lists_exactly_the_cli_commands():
    listed = re.findall(r"^- `([a-z-]+)` — ", _section(README.read_text(), "## Commands"), re.M)
    assert len(listed) == len(set(listed)), f"README.md lists a command twice: {listed}"
    assert set(listed) == set(cli.commands), (f"README.md's command list and the CLI differ: missing "
                                              f"{sorted(set(cli.commands) - set(listed))}, unknown "
                                              f"{sorted(set(listed) - set(cli.commands))}")


def test_readme_stays_short():
    size = len(README.read_bytes())
    assert size <= 15 * 1024, f"README.md is {size} bytes; move details into docs/ (at most 15 KB)"


def test_every_relative_link_resolves():
    broken = []
    for page in MARKDOWN:
        for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", _prose(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, f"broken links: {broken}"


def _importable(dotted: str) -> bool:
    """`featstore.a.b.Name`: the longest importable module prefix, then attributes."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            found = getattr(found, attr, None)
        return found is not None
    return False


def test_paths_and_modules_named_in_the_docs_exist():
    missing = []
    for page in MARKDOWN:
        text = page.read_text()
        names = REPO_PATH.findall(text)
        missing += [f"{page.relative_to(ROOT)}: {path}" for path in names if not (ROOT / path).exists()]
        modules = set(re.findall(r"`(featstore(?:\.[A-Za-z_]\w*)+)", text)) - {"featstore.duckdb"}
        missing += [f"{page.relative_to(ROOT)}: {dotted}" for dotted in sorted(modules) if not _importable(dotted)]
    for file in _repository_files():
        for doc in re.findall(r"\bdocs/[\w.-]+\.(?:md|toml)", file.read_text()):
            if not (ROOT / doc).exists():
                missing.append(f"{file.relative_to(ROOT)}: {doc}")
    assert not missing, f"named in the docs but not in the repository: {missing}"


def test_commands_in_the_docs_use_options_the_cli_has():
    """Every `featstore COMMAND --option` written in README.md and docs/ (code blocks and code spans) is real."""
    wrong = []
    for page in MARKDOWN:
        text = page.read_text()
        lines = [line for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
                 for line in block.replace("\\\n", " ").splitlines()]
        spans = [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", _prose(text))]
        lines += [span for span in spans if not span.startswith("featstore: ")]  # quoted messages, not commands
        for line in lines:
            for name, rest in re.findall(r"(?<!import )\bfeatstore\)? ([a-z][a-z-]*)([^#;]*)", line):
                if name not in cli.commands:
                    wrong.append(f"{page.relative_to(ROOT)}: featstore {name} (no such command)")
                    continue
                known = {o for p in cli.commands[name].params for o in [*p.opts, *p.secondary_opts]} | {"--help"}
                rest = re.split(r" \| |&&", rest)[0]
                wrong += [f"{page.relative_to(ROOT)}: featstore {name} {flag}"
                          for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest) if flag not in known]
    assert not wrong, f"options the CLI does not have: {wrong}"


# -- the store layout and the tables, checked against what the code writes ---------------------------------------

LAYOUT_LINE = re.compile(r"(?P<path>\S+)\s+(?P<kind>group|string|bool|int16|int64|uint64|float16|float32)"
                         r"(?:\s+\[(?P<shape>[^\]]*)\]\s+chunks\s+\[(?P<chunks>[^\]]*)\])?(?:\s+attrs:\s*(?P<attrs>.+))?")


def documented_layout() -> dict[str, dict]:
    block = _section((DOCS / "store.md").read_text(), "## Layout").split("```text\n")[1].split("```")[0]
    entries = {}
    for line in block.splitlines():
        m = LAYOUT_LINE.fullmatch(line.strip())
        assert m, f"docs/store.md: cannot read layout line {line!r}"
        entries[m["path"]] = m.groupdict()
    return entries


def _placeholder_path(parts: list[str]) -> str:
    """A store node's path with its names replaced by the placeholders docs/store.md uses."""
    if not parts:
        return "<store>.zarr"
    if parts[0] == "images":
        return "/".join(parts)
    named = ["<model>"]
    if len(parts) > 1 and parts[1] == "head":
        named += parts[1:3]
    elif len(parts) > 1 and parts[1] == "probes":
        named += ["probes", "<probe>", "<version>", "<anchor>", *parts[5:6]]
    else:
        named += ["<view>", *parts[2:3], "<anchor>"] if len(parts) > 2 and parts[2] == "anchors" else \
            ["<view>", *parts[2:3]]
    return "/".join(named[:len(parts)])


@pytest.fixture(scope="module")
def built_store(image_dir, tmp_path_factory):
    """A real store: two views of resnet18 built by `featstore build`, linear and knn probes saved into it by
    `featstore probe`."""
    out = tmp_path_factory.mktemp("layout")
    store = out / "s.zarr"
    run_cli("build", "--model", "resnet18", "--weights", "none", "--image-size", "32", "--data", image_dir,
            "--store", store, "--views", "clean,gaussian_noise-1", "--chunk-rows", "8", "--no-progress")
    run_cli("probe", "--store", store, "--model", "resnet18", "--db", out / "db.duckdb", "--view", "all",
            "--variant", "linear:tol=0.02", "--cross-fit", "2", "--no-progress")
    run_cli("probe", "--store", store, "--model", "resnet18", "--db", out / "db.duckdb", "--view", "clean",
            "--variant", "knn:k=3", "--cross-fit", "2", "--no-progress")  # knn keeps `reference`, not weights
    return store


def test_the_store_layout_in_the_docs_is_what_build_and_probe_write(built_store):
    import zarr

    from featstore.store.reader import FeatureStore

    fs = FeatureStore(built_store)
    config = fs.config("resnet18")
    dims = {a.name: a.dim for a in config.anchors}
    n = fs.num_images
    documented = documented_layout()
    seen, wrong = set(), []

    def check(node, parts: list[str]) -> None:
        is_group = isinstance(node, zarr.Group)
        pattern = _placeholder_path(parts) + ("/" if is_group else "")
        seen.add(pattern)
        doc = documented.get(pattern)
        if doc is None:
            wrong.append(f"{pattern} is not in docs/store.md")
        else:
            kind = "group" if is_group else ("string" if node.dtype.kind in "TUO" else str(node.dtype))
            if doc["kind"] != kind:
                wrong.append(f"{pattern}: documented {doc['kind']}, written {kind}")
            attrs = {a.strip() for a in (doc["attrs"] or "").split(",") if a.strip()}
            if attrs != set(node.attrs.keys()):
                wrong.append(f"{pattern}: documented attrs {sorted(attrs)}, written {sorted(node.attrs.keys())}")
            if not is_group:
                symbols = {"N": n, "C": dims.get(parts[-1], dims.get(parts[-2])), "head": config.num_classes,
                           "classes": 3, "folds": 2,
                           "D": config.anchors[-1].dim, "chunk_rows": config.chunk_rows, "min": min, "ceil": math.ceil,
                           "arrays": len(config.anchors) + 2}
                for what in ("shape", "chunks"):
                    expected = eval(f"({doc[what]},)", {"__builtins__": {}}, symbols)  # noqa: S307 (our own doc)
                    if tuple(expected) != tuple(getattr(node, what)):
                        wrong.append(f"{pattern}: documented {what} [{doc[what]}] = {expected}, written "
                                     f"{getattr(node, what)}")
        if is_group:
            for name, child in sorted(node.members()):
                check(child, [*parts, name])

    check(zarr.open_group(str(built_store), mode="r"), [])
    assert {"<model>/<view>/anchors/<anchor>", "<model>/probes/<probe>/<version>/<anchor>/weight",
            "<model>/probes/<probe>/<version>/<anchor>/reference"} <= seen
    wrong += [f"{p} is in docs/store.md but not in a built store" for p in sorted(set(documented) - seen)]
    assert not wrong, "docs/store.md and the store differ:\n" + "\n".join(wrong)


def test_the_model_config_table_names_every_field_written(built_store):
    import zarr

    written = set(zarr.open_group(str(built_store), mode="r")["resnet18"].attrs["config"])
    table = _section((DOCS / "store.md").read_text(), "### Model config")
    assert set(re.findall(r"^\| `(\w+)` \|", table, re.M)) == written


def documented_tables() -> dict[str, list[str]]:
    block = _section((DOCS / "analytics.md").read_text(), "## Tables").split("```text\n")[1].split("```")[0]
    block = re.sub(r"--[^\n]*", "", block)
    return {name: [c.strip() for c in columns.split(",")] for name, columns in re.findall(r"(\w+)\(([^)]*)\)", block)}


def test_the_table_list_in_the_docs_is_the_schema():
    import duckdb

    con = duckdb.connect()
    con.execute((ROOT / "sql" / "schema.sql").read_text())
    created: dict[str, list[str]] = {}
    for table, column in con.execute("SELECT table_name, column_name FROM information_schema.columns "
                                     "ORDER BY table_name, ordinal_position").fetchall():
        created.setdefault(table, []).append(column)
    assert len(created) >= 15
    assert documented_tables() == created, "docs/analytics.md's table list differs from sql/schema.sql"


def test_every_macro_and_view_is_documented():
    defined = re.findall(r"CREATE OR REPLACE (?:MACRO|VIEW) (\w+)",
                         "\n".join(p.read_text() for p in (ROOT / "sql").glob("*.sql")))
    docs = "\n".join(p.read_text() for p in DOCS.glob("*.md") if p.name != "cli.md")
    missing = [name for name in defined if not re.search(rf"`{name}[`(]", docs)]
    assert len(defined) > 30 and not missing, f"macros and views no page of docs/ names: {missing}"


def test_the_study_key_table_is_the_reader():
    from featstore.workflows.study import KEYS, REQUIRED

    rows = dict(re.findall(r"^\| (.+?) \| (.+) \|$", _section((DOCS / "study.md").read_text(), "## Keys"), re.M))
    labels = {"": "top level", "data": "`[data]`", "build": "`[build]`", "probe": "`[probe]`", "models": "`[[models]]`"}
    for key, allowed in KEYS.items():
        cell = rows[labels[key]]
        assert set(re.findall(r"\*\*`(\w+)`\*\*", cell)) == REQUIRED.get(key, set()), key
        assert set(re.findall(r"`([a-z_]+)`", cell)) == set(allowed), key


def test_nothing_refers_to_documents_outside_the_repository():
    files = _repository_files()
    assert len(files) > 40
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if OUTSIDE_REFERENCES.search(line)]
    assert not hits, f"references to documents outside the repository: {hits}"


if __name__ == "__main__":
    (ROOT / "docs" / "cli.md").write_text(cli_reference())
    print("wrote docs/cli.md")
