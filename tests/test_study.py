"""`featstore study`: a tiny grid end to end on generated images, resumed after a failure, skipped when done,
and closing with the paper-shaped table beside the published figures."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
import tomllib
from synthetic import make_image_folder

from featstore.workflows import probe as probe_run
from featstore.workflows.study import load_study, run_study

from conftest import fails, run_cli

ROOT = Path(__file__).resolve().parents[1]

HEADER = """
name = "{name}"
k = 2
published = "{figures}"

[data]
path = "images"

[build]
views = ["clean", "gaussian_noise-2"]
batch_size = 16
chunk_rows = 32
workers = 0
"""

TINY = HEADER.replace("{name}", "tiny") + """
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


def test_the_paper_study_declares_its_models_seeds_and_population():
    """The paper's five models with torchvision's IMAGENET1K_V1 (`paper`), timm's ImageNet-1k checkpoints of
    ViT-B/16 and ConvNeXt-T beside them, each facing a published row; 3 seeds; every image out of sample."""
    spec = tomllib.loads((ROOT / "studies" / "paper.toml").read_text())
    figures = tomllib.loads((ROOT / "docs" / "paper_figures.toml").read_text())["models"]
    entries = [(m["name"], m["weights"], m.get("figures", m["name"])) for m in spec["models"]]
    assert entries == [("resnet18", "paper", "resnet18"), ("resnet50", "paper", "resnet50"),
                       ("resnet101", "paper", "resnet101"), ("vit_b_16", "paper", "vit_b_16"),
                       ("vit_base_patch16_224", "augreg_in1k", "vit_b_16"), ("convnext_tiny", "paper", "convnext_tiny"),
                       ("timm/convnext_tiny", "fb_in1k", "convnext_tiny")]
    assert {f for _, _, f in entries} == set(figures)
    assert len(spec["build"]["views"]) == 7 and spec["probe"]["variants"] == ["paper"]
    assert len(spec["probe"]["seeds"]) >= 3 and spec["probe"]["cross_fit"] >= 2
    assert figures["resnet50"]["mean_layer"] == 5.51 and figures["convnext_tiny"]["stable_but_wrong"] == 0.303
    study = load_study(ROOT / "studies" / "paper.toml", data=ROOT)
    assert [m.key for m in study.models] == ["resnet18", "resnet50", "resnet101", "vit_b_16", "vit_base_patch16_224",
                                             "convnext_tiny", "timm_convnext_tiny"]


CROSS_FIT = HEADER + """
[probe]
variants = ["paper:epochs=3"]
seeds = [0, 1, 2]
cross_fit = 3

[[models]]
name = "timm/vit_tiny_patch16_224"
weights = "none"
image_size = 32
pool = "mean"
figures = "vit_b_16"

[[models]]
name = "timm/vit_tiny_patch16_224"
key = "vit_tiny_cls"
weights = "none"
image_size = 32
pool = "cls"
figures = "vit_b_16"
"""


@pytest.mark.filterwarnings("ignore::featstore.probing.base.UnconvergedProbe")
def test_a_cross_fit_study_counts_every_image_over_three_seeds(tmp_path):
    """Every figure is the mean over 3 probe seeds beside their spread, counted over all 30 images (3-fold
    cross-fit); the readout is chosen per model; checked against numpy over the per-seed paper_table rows."""
    import numpy as np

    from featstore.analytics.queries import paper_table
    from featstore.store.reader import FeatureStore

    make_image_folder(tmp_path / "images", n_classes=3, per_class=10, size=(40, 32), seed=2)
    path = tmp_path / "cf.toml"
    path.write_text(CROSS_FIT.format(name="cf", figures=ROOT / "docs" / "paper_figures.toml"))
    out = tmp_path / "out"
    printed = run_cli("study", path, "--out", out, "--no-progress").output
    images = len(list((tmp_path / "images").rglob("*.jpg")))
    assert f"population: {images} of {images} images (3 classes) of ImageFolder" in printed
    assert "every image out of sample (3-fold cross-fit); probe seeds 0, 1, 2" in printed
    fs = FeatureStore(out / "store.zarr")
    assert fs.config("timm_vit_tiny_patch16_224").token_pool == "mean" and fs.config("vit_tiny_cls").token_pool == "cls"

    result = run_study(path, out=out, progress=False)
    table = result.table
    per_seed = paper_table(result.db, 2)
    for key in ("timm_vit_tiny_patch16_224", "vit_tiny_cls"):
        mine = per_seed.filter(per_seed["model"] == key)
        assert sorted(mine["run_id"].to_list()) == [f"{key}/clean/paper:epochs=3/cf3{s}" for s in ("", "/seed1",
                                                                                                   "/seed2")]
        for statistic in ("last_anchor_accuracy", "mean_layer", "f_early", "stable_but_wrong_of_all"):
            values = np.array(mine[statistic].to_list(), dtype=float)
            row = table.filter((table["model"] == key) & (table["statistic"] == statistic)).row(0, named=True)
            assert row["seeds"] == 3 and row["n"] == images and row["pool"] in ("mean", "cls")
            assert row["featstore"] == pytest.approx(values.mean())
            assert row["seed_std"] == pytest.approx(values.std(ddof=1))
            assert (row["seed_min"], row["seed_max"]) == (pytest.approx(values.min()), pytest.approx(values.max()))
            assert row["paper"] is not None  # faces the ViT-B/16 row
    assert "seed_std" in printed and "seed_max" in printed
    report = (out / "report" / "report.html").read_text()
    assert "Across probe seeds" in report and "Population (the images each clean run counts)" in report


def test_study_models_must_have_distinct_keys_and_a_known_pool(tmp_path):
    bad = tmp_path / "bad.toml"
    two = "[data]\npath = '.'\n[[models]]\nname = 'resnet18'\n[[models]]\nname = 'resnet18'\n"
    bad.write_text(two)
    assert "share the key 'resnet18'" in fails("study", bad) and "key = " in fails("study", bad)
    bad.write_text("[data]\npath = '.'\n[[models]]\nname = 'resnet18'\npool = 'max'\n")
    assert "[[models]] #1: pool = 'max' must be one of 'cls', 'mean'" in fails("study", bad)


def test_a_rerun_reports_what_the_file_declares_now(tiny, tmp_path):
    """After the file dropped a seed and a view, the table still counted both seeds and the
    corrupted view's delta. Now it reads the runs the file declares (the database keeps the others)."""
    out = tmp_path / "out"
    both = run_study(tiny, out=out, progress=False)
    assert set(both.table["seeds"].drop_nulls().to_list()) == {2}
    page = both.report.read_text()
    assert "linear:tol=0.02/seed1" in page and "resnet18/gaussian_noise-2/" in page
    tiny.write_text(tiny.read_text().replace("seeds = [0, 1]", "seeds = [0]").replace(
        'views = ["clean", "gaussian_noise-2"]', 'views = ["clean"]'))
    one = run_study(tiny, out=out, progress=False)
    table = {r["statistic"]: r for r in one.table.to_dicts()}
    assert {r["seeds"] for r in table.values() if r["featstore"] is not None} == {1}
    assert table["corruption_delta"]["featstore"] is None  # no corrupted view is declared now
    con = duckdb.connect(str(out / "featstore.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 4  # nothing was deleted
    seed0 = con.execute("SELECT mean_layer, f_early FROM paper_table(2) WHERE run_id = "
                        "'resnet18/clean/linear:tol=0.02'").fetchone()
    con.close()
    assert table["mean_layer"]["featstore"] == pytest.approx(seed0[0])
    assert table["f_early"]["featstore"] == pytest.approx(seed0[1])
    assert "probe seeds 0" in one.population and "probe seeds 0, 1" in both.population
    page = one.report.read_text()  # the HTML report too shows only the declared runs, and was redone
    assert "resnet18/clean/linear:tol=0.02" in page
    assert "/seed1" not in page and "gaussian_noise-2" not in page
