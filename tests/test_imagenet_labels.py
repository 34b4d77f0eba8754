"""WNID-named classes are labelled by their ImageNet-1k index, whatever subset is present, so that a 1000-way
head's accuracy (`model_outputs`, the full-depth baseline) is scored against the right classes."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
import torch
import torchvision
from synthetic import class_image
from timm.data import ImageNetInfo

from featstore.images.datasets import discover
from featstore.store.reader import FeatureStore

from conftest import fails, run_cli

INDICES = [5, 120, 250, 333, 404, 517, 640, 777, 888, 999]  # a 10-class subset, in WNID (= index) order
PREDICTED = 333
SMALL = ["--image-size", "32", "--chunk-rows", "16", "--batch-size", "8", "--workers", "0", "--no-progress"]


@pytest.fixture(scope="module")
def wnid_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("wnids") / "val"
    wnids = ImageNetInfo().label_names()
    rng = np.random.default_rng(0)
    for label, index in enumerate(INDICES):
        folder = root / wnids[index]
        folder.mkdir(parents=True)
        for j in range(3):
            class_image(label, len(INDICES), rng, (40, 32)).save(folder / f"ILSVRC_{index:04d}_{j}.JPEG", "JPEG")
    return root


def test_wnid_folders_and_wnid_labels_files_get_imagenet_indices(wnid_dir, tmp_path):
    images = discover(wnid_dir)
    wnids = ImageNetInfo().label_names()
    folder_of = [p.split("/")[0] for p in images.paths]
    assert images.label_space == "imagenet-1k"
    assert images.labels.tolist() == [wnids.index(w) for w in folder_of]
    assert sorted(set(images.labels.tolist())) == INDICES
    assert images.with_folder_ranks().labels.tolist() == [INDICES.index(wnids.index(w)) for w in folder_of]

    flat = tmp_path / "flat"
    flat.mkdir()
    lines = ["filename,label"]
    for path in images.paths:
        (flat / path.replace("/", "_")).write_bytes((wnid_dir / path).read_bytes())
        lines.append(f"{path.replace('/', '_')},{path.split('/')[0]}")
    (tmp_path / "labels.csv").write_text("\n".join(lines) + "\n")
    from_csv = discover(flat, tmp_path / "labels.csv")
    assert from_csv.label_space == "imagenet-1k" and from_csv.labels.tolist() == images.labels.tolist()


def _checkpoint(path, num_classes: int, predicted: int):
    """A resnet18 whose head always answers `predicted` (zero weights, one positive bias)."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    with torch.no_grad():
        model.fc.weight.zero_()
        model.fc.bias.zero_()
        model.fc.bias[predicted] = 10.0
    torch.save(model.state_dict(), path)
    return path


def test_head_accuracy_is_scored_against_imagenet_indices(wnid_dir, tmp_path):
    store, db = tmp_path / "s.zarr", tmp_path / "f.duckdb"
    weights = _checkpoint(tmp_path / "in1k.pth", 1000, PREDICTED)
    run_cli("build", "--model", "resnet18", "--weights", weights, "--data", wnid_dir, "--store", store, *SMALL)
    run_cli("probe", "--store", store, "--model", "resnet18", "--db", db, "--variant", "linear:tol=0.02",
            "--no-progress")
    fs = FeatureStore(store)
    wnids = ImageNetInfo().label_names()
    truth = np.array([wnids.index(p.split("/")[0]) for p in fs.image_table()["path"]])
    expected = np.mean(fs.read_logits("resnet18", "clean").astype(np.float32).argmax(axis=1) == truth)
    assert expected == pytest.approx(0.1)  # the head answers class 333, one of the ten classes
    con = duckdb.connect(str(db), read_only=True)
    got = con.execute("SELECT avg((m.pred = i.label)::INT) FROM model_outputs m JOIN images i USING (image_id)"
                      ).fetchone()[0]
    names = con.execute("SELECT DISTINCT path, class_name FROM images").fetchall()
    probe_preds = {p for (p,) in con.execute("SELECT DISTINCT pred FROM predictions").fetchall()}
    con.close()
    assert got == pytest.approx(expected)
    assert all(path.split("/")[0] == name for path, name in names)
    assert probe_preds <= set(INDICES)  # 1000-way probes, trained on ImageNet indices, answer with them
    assert "in 10 classes labelled as ImageNet-1k indices" in run_cli("info", store).output

    narrow = _checkpoint(tmp_path / "ten.pth", 10, 3)
    line = fails("build", "--model", "resnet18", "--weights", narrow, "--name", "ten", "--data", wnid_dir,
                 "--store", store, *SMALL)
    assert "imagenet-1k classes" in line and "new --store" in line


def test_a_head_that_is_not_imagenet_keeps_folder_ranks(wnid_dir, tmp_path):
    store = tmp_path / "s.zarr"
    weights = _checkpoint(tmp_path / "ten.pth", 10, 3)
    run_cli("build", "--model", "resnet18", "--weights", weights, "--data", wnid_dir, "--store", store, *SMALL)
    fs = FeatureStore(store)
    wnids = ImageNetInfo().label_names()
    ranks = [INDICES.index(wnids.index(p.split("/")[0])) for p in fs.image_table()["path"]]
    assert fs.image_table()["label"].tolist() == ranks
    assert fs.image_attrs()["label_space"] == "folder-rank"


@pytest.mark.parametrize(("classes", "predicted", "label"), [(10, 3, "folder rank 3"), (1000, 333, "index 333")])
def test_circuits_score_a_wnid_folder_with_the_labels_a_build_would_store(wnid_dir, tmp_path, classes, predicted,
                                                                          label):
    """One label rule: a head that is not 1000 wide is scored against folder ranks, a 1000-wide one against
    ImageNet indices, by `featstore circuits` as by `featstore build`. The head always answers one class, so the
    right accuracy is that class's share of the images (3 of 30), counted here from the folder names."""
    import timm

    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=classes)
    with torch.no_grad():
        vit.head.weight.zero_()
        vit.head.bias.zero_()
        vit.head.bias[predicted] = 10.0
    weights = tmp_path / "vit.pth"
    torch.save(vit.state_dict(), weights)
    db = tmp_path / "f.duckdb"
    run_cli("circuits", "--model", "vit_tiny_patch16_224", "--weights", weights, "--image-size", "32", "--data",
            wnid_dir, "--db", db, "--ig-steps", "1", "--workers", "0", "--no-progress")
    con = duckdb.connect(str(db), read_only=True)
    accuracy = float(con.execute("SELECT params->>'accuracy' FROM circuit_runs").fetchone()[0])
    con.close()
    wnids = ImageNetInfo().label_names()
    answered = wnids[INDICES[predicted]] if classes == 10 else wnids[predicted]  # the class the head names
    share = sum(1 for p in (wnid_dir).rglob("*.JPEG") if p.parent.name == answered) / 30
    assert share == pytest.approx(0.1) and accuracy == pytest.approx(share), label
