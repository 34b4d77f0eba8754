""".ci/install.py: README's packages split into two disjoint pip installs (what the first one's requirements can
reach, extras as asked for, and the rest), read from README's own test command."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _install():
    spec = importlib.util.spec_from_file_location("ci_install", ROOT / ".ci" / "install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _item(name: str, *requires: str) -> dict:
    return {"metadata": {"name": name, "version": "1.0", "requires_dist": list(requires)},
            "download_info": {"url": f"https://example.invalid/{name}.whl"}}


def test_the_first_half_is_what_its_requirements_reach_with_the_extras_asked_for():
    report = {"install": [
        _item("torch", "filelock", "cuda-toolkit[cublas]==13.0.3; platform_system == \"Linux\"",
              "opt-einsum>=3.3; extra == \"opt-einsum\""),
        _item("cuda-toolkit", "nvidia-cublas==13.1; extra == \"cublas\"", "nvidia-cufft; extra == 'cufft'"),
        _item("nvidia_cublas"), _item("nvidia-cufft"), _item("opt-einsum"), _item("filelock"),
        _item("Jinja2", "MarkupSafe>=2.0"), _item("markupsafe"), _item("moto", "Jinja2>=2.10.1", "filelock"),
    ]}
    ci = _install()
    assert ci.reach(report, ["torch==2.14.1"]) == {"torch", "filelock", "cuda-toolkit", "nvidia-cublas"}
    assert ci.reach(report, ["moto[server]>=5"]) == {"moto", "jinja2", "markupsafe", "filelock"}


def test_the_requirements_are_those_of_readmes_test_command():
    assert _install().readme_requirements() == ["torch==2.14.1", "torchvision==0.29.1", "-e", ".[dev]"]
