"""CI's installs ahead of README.md's test command, so that the command then finds everything installed.

README's `pip install` resolves and unpacks its ~140 packages one after another on one core: torch's 5.5 GB of
CUDA libraries (from this disk), then the rest (from PyPI). Here the same work runs as two pip processes at once:
one installs the packages README names (torch, torchvision) with everything they need, while the other resolves
README's whole install (`--dry-run --report`) and installs the rest of it, `--no-deps`, every version pinned as
resolved. The two sets are disjoint (the second leaves out every package the first's requirements can reach,
extras as requested, other markers counted as true), so no package is written twice. README's own command, run
next, finds the same set and installs featstore itself (editable). The requirements are read from README's test
command; the one package named here is pip itself.

First the venv's pip goes from the machine's 23.2.1 to `PIP_VERSION` (pinned, so that CI installs the same way
every run): 23.2.1 spends most of its time matching wheel tags for every file of every index page (resolving
README's install: 39 s of CPU; 26.3: 17 s, the same 134 packages), and every pip run of CI's resolves (both here,
then README's). With it this script took 88.8 s and README's command after it 4.5 s, where 23.2.1 took 118 s
here. A failed upgrade leaves the old pip to do the same work, slower.

Both compile to bytecode, as pip does by default; never `--no-compile`: where PYTHONDONTWRITEBYTECODE is set (it is
on these machines) no process writes .pyc files when it imports, and every test process then imports torch,
torchvision and timm from source, 14.7 s of CPU instead of 4.8 s (measured: the suite 833 s instead of ~760 s)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIP = [str(ROOT / ".venv" / "bin" / "python"), "-m", "pip", "install", "-q"]
PIP_VERSION = "pip==26.3"
REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?[^;]*(?:;(.*))?")


def readme_requirements() -> list[str]:
    """The arguments of `pip install` in README's test command (the line that runs pytest)."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if "pytest" in line and "pip install" in line:
            words = shlex.split(line.split("pip install", 1)[1].split("&&", 1)[0])
            return [w for w in words if w != "-q"]
    sys.exit("ci: no `pip install ... && ... pytest` line in README.md")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(requirement: str) -> tuple[str, set[str], set[str]]:
    """(name, extras asked for, extras whose marker it sits under) of a requirement string."""
    m = REQUIREMENT.match(requirement)
    if m is None:
        raise SystemExit(f"ci: cannot read requirement {requirement!r}")
    extras = {canonical(e) for e in (m[2] or "").split(",") if e.strip()}
    under = {canonical(e) for e in re.findall(r"""extra\s*==\s*['"]([^'"]+)['"]""", m[3] or "")}
    return canonical(m[1]), extras, under


def reach(report: dict, roots: list[str]) -> set[str]:
    """Every package of the report that the requirements `roots` can need (a superset: markers other than extras
    count as true)."""
    items = {canonical(item["metadata"]["name"]): item["metadata"] for item in report["install"]}
    visited: set[tuple[str, frozenset[str]]] = set()  # a package again with other extras can need more
    todo = [parse(r)[:2] for r in roots]
    while todo:
        name, extras = todo.pop()
        if name not in items or (name, frozenset(extras)) in visited:
            continue
        visited.add((name, frozenset(extras)))
        for requirement in items[name].get("requires_dist", []):
            dep, dep_extras, under = parse(requirement)
            if not under or under & extras:
                todo.append((dep, dep_extras))
    return {name for name, _ in visited}


def main() -> None:
    if subprocess.run([*PIP, PIP_VERSION], cwd=ROOT).returncode != 0:
        print(f"ci: could not install {PIP_VERSION}; the venv's own pip installs (slower)", file=sys.stderr)
    requirements = readme_requirements()
    named = [r for r in requirements if not r.startswith(("-", "."))]  # torch==..., torchvision==...
    first = subprocess.Popen([*PIP, *named], cwd=ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "report.json"
        # --ignore-installed: the first process is writing packages meanwhile, which pip must not read half-written
        subprocess.run([*PIP, "--dry-run", "--ignore-installed", "--report", str(path), *requirements], cwd=ROOT,
                       check=True)
        report = json.loads(path.read_text())
    taken = reach(report, named)
    rest = [f"{item['metadata']['name']}=={item['metadata']['version']}" for item in report["install"]
            if canonical(item["metadata"]["name"]) not in taken and "dir_info" not in item.get("download_info", {})]
    second = subprocess.run([*PIP, "--no-deps", *rest], cwd=ROOT).returncode if rest else 0
    if first.wait() != 0 or second != 0:
        sys.exit("ci: a pip install failed (above)")


if __name__ == "__main__":
    main()
