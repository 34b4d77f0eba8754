"""The prepared GPU check runs end to end on CPU at smoke sizes, so it works when a GPU session comes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "device_check.py"


def test_device_check_smoke_runs_every_section_without_obstore_or_polars(tmp_path):
    """The GPU machine has neither obstore nor polars (and the script carries no wheel of them): the smoke run
    hides both, as that machine's package set does."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['obstore'] = None\nsys.modules['polars'] = None\n")
    # one thread: the probe's many small steps are slower with threads contending for 2 shared cores
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(hide)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    sections = report["sections"]
    assert list(sections) == ["images", "warm-up", "stages", "resnet50", "views7", "vit", "baseline", "precision",
                              "resume", "compile", "probe", "circuits"]
    assert not [name for name, out in sections.items() if "error" in out], sections
    assert sections["resume"]["killed"] and sections["resume"]["bit_identical"], sections["resume"]
    assert sections["resnet50"]["decode_gpu"]["images"] == report["sections"]["images"]["images"]
    assert sections["views7"]["images"] == 4 and sections["vit"]["images"] == 4
    assert sections["compile"]["refused"] is True
    stages = sections["stages"]
    assert stages["read"]["images"] == 24 and stages["input_7_views"]["views"] == 7
    # per image only its file crosses (files of 1.6-1.8 kB here), at 1 view as at 7
    per_file = stages["read"]["bytes"] / stages["read"]["images"]
    for stage in ("input_1_view", "input_7_views"):
        assert 0.8 * per_file < stages[stage]["bytes_to_device_per_image"] < 1.2 * per_file, stages
    anchors = sections["precision"]["anchors"]
    assert len(anchors) == 12 and all(0 < a["rel_error"] < 0.05 for a in anchors)  # bf16 vs fp32 on CPU
    table = (tmp_path / "device_check.md").read_text()
    assert "| --decode gpu / decode+forward ceiling |" in table and "| SIGKILL + resume bit-identical | True" in table
    assert "| input path alone, 7 views |" in table and "| main thread CPU per image, --decode gpu |" in table
