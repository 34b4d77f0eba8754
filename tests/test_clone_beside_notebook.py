"""A clone named `featstore` in the folder Python starts in shadows the editable install as a namespace package
(docs/python.md, "A notebook beside the clone"): the remedies the doc names are checked to work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import featstore

ROOT = Path(__file__).resolve().parents[1]
PROBE = "import featstore; print(featstore.__file__, hasattr(featstore, 'connect'))"


def test_the_doc_says_what_a_clone_named_featstore_does_and_each_remedy_works(tmp_path):
    clone = tmp_path / "featstore"  # a clone's top folder: pyproject.toml and featstore/ inside, no __init__.py
    (clone / "featstore").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("[project]\nname = 'featstore'\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}

    def imported(*flags: str, cwd: Path = tmp_path) -> str:
        return subprocess.run([sys.executable, *flags, "-c", PROBE], cwd=cwd, env=env, capture_output=True,
                              text=True, check=True).stdout.strip()

    installed = f"{featstore.__file__} True"
    shadowed = imported()
    assert shadowed in ("None False", installed)  # None: the editable install, as this checkout's; else a wheel's
    assert imported("-P") == installed  # the working folder left off the path
    elsewhere = tmp_path / "notebooks"
    elsewhere.mkdir()
    assert imported(cwd=elsewhere) == installed  # from another folder
    doc = " ".join((ROOT / "docs" / "python.md").read_text().split())
    for said in ("A notebook beside the clone", "`featstore.__file__` is `None`", "start Python with `-P`",
                 "Clone into another name"):
        assert said in doc, said
