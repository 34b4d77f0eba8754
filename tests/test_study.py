"""`featstore study`: a tiny grid end to end on generated images, resumed after a failure, skipped when done,
and closing with the paper-shaped table beside the published figures."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
import tomllib
from synthetic import make_image_folder

from featstore.workflows import probe as probe_run

from conftest import fails, run_cli

ROOT = Path(__file__).resolve().parents[1]

TINY = """
name = "tiny"
k = 2
published = "{figures}"

[data]
path = "images"

[build]
views = ["clean", "gaussian_noise-2"]
batch_size = 16
chunk_rows = 32
workers = 0

[probe]
variants = ["linear:tol=0.02"]
seeds = [0, 1]

[[models]]
name = "resnet18"
weights = "none"
image_size = 32
"""


@pytest.fixture()
def tiny(tmp_path):
    make_image_folder(tmp_path / "images", n_classes=3, per_class=10, size=(40, 32), seed=2)
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(figures=ROOT / "docs" / "paper_figures.toml"))
    return path


def test_study_runs_resumes_and_prints_beside_the_paper(tiny, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real_probe = probe_run.probe
    calls = []

    def dies_on_the_second_seed(cfg):
        calls.append(cfg.run.seed)
        if cfg.run.seed == 1:
            raise OSError("killed")
        return real_probe(cfg)

    monkeypatch.setattr("featstore.workflows.study.probe", dies_on_the_second_seed)
    with pytest.raises(OSError, match="killed"):
        run_cli("study", tiny, "--out", out, "--no-progress")
    monkeypatch.setattr("featstore.workflows.study.probe", lambda cfg: calls.append(cfg.run.seed) or real_probe(cfg))
    calls.clear()
    first = run_cli("study", tiny, "--out", out, "--no-progress").output
    assert calls == [1]  # build and the seed-0 probes were done: only the failed step reruns
    assert "2 step(s) run, 2 already done" in first  # probe seed 1 and the report
    con = duckdb.connect(str(out / "featstore.duckdb"), read_only=True)
    runs = sorted(r for (r,) in con.execute("SELECT run_id FROM runs").fetchall())
    created = con.execute("SELECT max(created_at) FROM runs").fetchone()
    con.close()
    assert runs == ["resnet18/clean/linear:tol=0.02", "resnet18/clean/linear:tol=0.02/seed1",
                    "resnet18/gaussian_noise-2/linear:tol=0.02/train=clean",
                    "resnet18/gaussian_noise-2/linear:tol=0.02/train=clean/seed1"]
    assert (out / "report" / "report.html").is_file()
    lines = first.splitlines()
    row = next(line for line in lines if "mean_layer" in line)
    assert "resnet18" in row and "7.4" in row  # ours beside the paper's ResNet-18 mean l* at k = 2
    assert any("stable_but_wrong_of_all" in line for line in lines)

    calls.clear()
    again = run_cli("study", tiny, "--out", out, "--no-progress").output
    assert calls == [] and "0 step(s) run, 4 already done" in again
    con = duckdb.connect(str(out / "featstore.duckdb"), read_only=True)
    assert con.execute("SELECT max(created_at) FROM runs").fetchone() == created
    con.close()


def test_study_file_errors_are_one_line(tmp_path):
    assert "does not exist" in fails("study", tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[models]]\nname = 'resnet18'\n")
    assert "--data" in fails("study", bad)
    bad.write_text("[data]\npath = '.'\n[probe]\nvariants = ['svm']\n[[models]]\nname = 'resnet18'\n")
    assert "unknown probe variant" in fails("study", bad)


def test_the_paper_study_declares_five_models_and_seven_views():
    spec = tomllib.loads((ROOT / "studies" / "paper.toml").read_text())
    figures = tomllib.loads((ROOT / "docs" / "paper_figures.toml").read_text())["models"]
    names = [m["name"] for m in spec["models"]]
    assert names == ["resnet18", "resnet50", "resnet101", "vit_base_patch16_224", "convnext_tiny"]
    assert all(m["weights"] == "paper" for m in spec["models"]) and set(names) == set(figures)
    assert len(spec["build"]["views"]) == 7 and spec["probe"]["variants"] == ["paper"]
    assert figures["resnet50"]["mean_layer"] == 5.51 and figures["convnext_tiny"]["stable_but_wrong"] == 0.303
