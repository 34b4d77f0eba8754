"""The prepared GPU check runs end to end on CPU at smoke sizes, so it works when a GPU session comes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "device_check.py"


def test_device_check_smoke_runs_every_section(tmp_path):
    # one thread: the probe's many small steps are slower with threads contending for 2 shared cores
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    sections = report["sections"]
    assert list(sections) == ["images", "warm-up", "resnet50", "views7", "vit", "precision", "resume", "probe",
                              "circuits"]
    assert not [name for name, out in sections.items() if "error" in out], sections
    assert sections["resume"]["killed"] and sections["resume"]["bit_identical"], sections["resume"]
    assert sections["resnet50"]["decode_gpu"]["images"] == report["sections"]["images"]["images"]
    assert sections["views7"]["images"] == 4 and sections["vit"]["images"] == 4
    anchors = sections["precision"]["anchors"]
    assert len(anchors) == 12 and all(0 < a["rel_error"] < 0.05 for a in anchors)  # bf16 vs fp32 on CPU
    table = (tmp_path / "device_check.md").read_text()
    assert "| decode gpu / bare forward |" in table and "| SIGKILL + resume bit-identical | True" in table
