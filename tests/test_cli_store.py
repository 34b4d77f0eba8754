"""`featstore info`, `anchors`, `demo`, stable image ids under --limit, and adding a view to a store."""

from __future__ import annotations

import json

import numpy as np

from featstore.images.datasets import discover
from featstore.store.reader import FeatureStore

from conftest import run_cli

SMALL = ["--model", "resnet18", "--weights", "none", "--image-size", "32", "--chunk-rows", "6",
         "--batch-size", "3", "--workers", "0", "--no-progress"]


def test_limit_keeps_the_ids_of_the_full_set(image_dir):
    full, part = discover(image_dir), discover(image_dir, limit=5)
    assert len(part) == 5 and part.image_ids.tolist() == sorted(part.image_ids.tolist())
    for i, path, label in zip(part.image_ids, part.paths, part.labels, strict=True):
        assert full.paths[i] == path and full.labels[i] == label
    assert discover(image_dir, limit=5).fingerprint() == part.fingerprint()


def test_info_reports_anchors_views_and_completeness(image_dir, tmp_path):
    store = tmp_path / "s.zarr"
    run_cli("build", "--data", image_dir, "--store", store, *SMALL, "--views", "clean", "--threads", "1")
    run_cli("build", "--data", image_dir, "--store", store, *SMALL, "--views", "clean,brightness-1", "--threads", "1")
    summary = json.loads(run_cli("info", store, "--json").output)
    m = summary["models"]["resnet18"]
    assert summary["images"]["count"] == 12 and summary["images"]["classes"] == 3
    assert [a[1] for a in m["anchors"]][:3] == ["relu", "maxpool", "layer1.0"]
    assert [a[3] for a in m["anchors"]] == [64, 64, 64, 64, 128, 128, 256, 256, 512, 512, 512, 512]
    assert m["anchors"][8][2] == "layer4.0.bn1"
    assert m["views"] == {v: {"chunks_done": 2, "chunks": 2, "skipped": 0, "threads": [1], "damaged_chunks": []}
                          for v in ["brightness-1", "clean"]}
    assert {"torch", "torchvision", "zarr", "featstore"} <= set(m["versions"])
    text = run_cli("info", store).output
    assert "view brightness-1: 2/2 chunks, 0 skipped, complete (CPU threads 1)" in text


def test_second_build_adds_only_the_missing_view(image_dir, tmp_path):
    store = tmp_path / "s.zarr"
    run_cli("build", "--data", image_dir, "--store", store, *SMALL)
    before = FeatureStore(store).read("resnet18", "clean", "avgpool")
    out = run_cli("build", "--data", image_dir, "--store", store, *SMALL, "--views", "clean,gaussian_blur-2").output
    assert "2 chunk(s) written" in out
    fs = FeatureStore(store)
    assert np.array_equal(fs.read("resnet18", "clean", "avgpool"), before)
    assert not np.array_equal(fs.read("resnet18", "gaussian_blur-2", "avgpool"), before)
    assert "0 chunk(s) written, 2 already done" in run_cli("build", "--data", image_dir, "--store", store,
                                                          *SMALL, "--views", "gaussian_blur-2").output


def test_info_on_a_missing_store_is_one_line(tmp_path):
    result = run_cli("info", tmp_path / "nothing.zarr", ok=False)
    assert result.exit_code == 2 and "featstore build" in result.output


def test_anchors_command_lists_preset_and_modules():
    out = run_cli("anchors", "--model", "resnet18").output
    assert "layer4.0.mid  (hooks layer4.0.bn1 output + relu)" in out and "conv2" not in out
    names = run_cli("anchors", "--model", "resnet18", "--all").output.splitlines()
    assert {"layer3.1.conv2", "layer4.0.mid", "avgpool"} <= set(names)


def test_default_anchors_for_a_model_without_preset(image_dir, tmp_path):
    store = tmp_path / "s.zarr"
    run_cli("build", "--data", image_dir, "--store", store, *SMALL[2:], "--model", "mobilenet_v3_small")
    names = [a.name for a in FeatureStore(store).anchors("mobilenet_v3_small")]
    # the last anchor is what the classifier reads (its hidden 1024-wide layer), not a block before the head
    assert len(names) == 12 and names[0] == "features.0" and names[-1] == "classifier.3.input"


def test_demo_digits_preset_runs_offline_end_to_end(tmp_path):
    out = run_cli("demo", "--dataset", "digits", "--out", tmp_path / "demo", "--limit", "200", "--epochs", "1",
                  "--no-progress").output
    assert "Where the clean test images decide" in out and "gaussian_noise-2" in out
    report = tmp_path / "demo" / "digits" / "report"
    page = (report / "report.html").read_text()
    assert page.count("class='plot-spec'") >= 5 and "<script>" in page  # plots drawn from their data, offline
    fs = FeatureStore(tmp_path / "demo" / "digits" / "store.zarr")
    assert fs.model_attrs("resnet18")["config"]["weights_id"].startswith("file:resnet18-e1.pth")
    assert sorted(fs.views("resnet18")) == ["clean", "gaussian_blur-1", "gaussian_noise-2"]
