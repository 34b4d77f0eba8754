"""ImageNet's val labels as they ship (featstore/images/imagenet_val.py): the devkit's ground truth with its
meta.mat (written here by scipy.io.savemat in the devkit's struct layout) and Kaggle's LOC_val_solution.csv, both
made small here, label each image by the sorted-WNID index a torchvision/timm 1,000-way head predicts; anything
ambiguous is one line before anything is written. A build of a pretrained 1,000-way head warns when its top-1
agreement with the labels on the first chunk is about chance (labels in another class order), and only then."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.io
import torch
import torchvision
from synthetic import class_image
from timm.data import ImageNetInfo

import featstore as fs
from featstore.images.datasets import MissingImages, UnlabelledImages, discover
from featstore.store.reader import FeatureStore
from featstore.workflows.label_check import LabelsNearChance

from conftest import fails

WNIDS_1K = list(ImageNetInfo().label_names())
CLASSES = [7, 130, 404, 512, 999]  # the test's classes, as ImageNet-1k (sorted-WNID) indices
DEVKIT_ORDER = [404, 7, 999, 130, 512]  # the devkit's ids 1..5 name these classes: not the sorted order
IMAGES = 30
FIELDS = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children", "wordnet_height",
          "num_train_images"]  # the devkit's synsets struct, in its order
SMALL = {"chunk_rows": 16}
RUN = fs.RunOptions(threads=1, workers=0, batch_size=8, progress=False)


def write_meta(path, leaves: list[tuple[int, str]], inner: list[tuple[int, str, list[int]]]) -> None:
    """A meta.mat as the devkit's: a synsets struct array [n, 1], leaves (classes) first, then inner nodes."""
    synsets = np.zeros((len(leaves) + len(inner), 1), dtype=[(f, object) for f in FIELDS])
    rows = [(i, w, []) for i, w in leaves] + inner
    for row, (ident, wnid, children) in enumerate(rows):
        synsets[row, 0] = (np.array([[ident]], dtype=np.uint16), wnid, f"words of {wnid}", f"gloss of {wnid}",
                           np.array([[len(children)]], dtype=np.uint8), np.array([children], dtype=np.uint16)
                           if children else np.zeros((1, 0), dtype=np.uint16), np.array([[0 if not children else 2]]),
                           np.array([[1300]], dtype=np.uint16))
    scipy.io.savemat(str(path), {"synsets": synsets})


@pytest.fixture(scope="module")
def val(tmp_path_factory):
    """A flat val folder as ImageNet ships it, the devkit's data/ folder (ground truth + meta.mat), Kaggle's
    solution file, and each image's class (its ImageNet-1k index), drawn here."""
    where = tmp_path_factory.mktemp("imagenet")
    folder, devkit = where / "val", where / "devkit" / "data"
    folder.mkdir()
    devkit.mkdir(parents=True)
    rng = np.random.default_rng(0)
    truth = {}
    for number in range(1, IMAGES + 1):
        index = CLASSES[int(rng.integers(len(CLASSES)))] if number > len(CLASSES) else CLASSES[number - 1]
        truth[f"ILSVRC2012_val_{number:08d}.JPEG"] = index
        class_image(CLASSES.index(index), len(CLASSES), rng, (40, 32)).save(folder / f"ILSVRC2012_val_{number:08d}"
                                                                            f".JPEG", "JPEG")
    leaves = [(ident, WNIDS_1K[index]) for ident, index in enumerate(DEVKIT_ORDER, start=1)]
    write_meta(devkit / "meta.mat", leaves, [(6, "n00001740", [1, 2, 3]), (7, "n00002137", [4, 5, 6])])
    ground_truth = devkit / "ILSVRC2012_validation_ground_truth.txt"
    ground_truth.write_text("".join(f"{DEVKIT_ORDER.index(i) + 1}\n" for i in truth.values()))
    kaggle = where / "LOC_val_solution.csv"
    lines = ["ImageId,PredictionString"]
    for name in rng.permutation(list(truth)):  # Kaggle's rows are in no particular order
        wnid = WNIDS_1K[truth[name]]
        boxes = " ".join(f"{wnid} {x} 3 {x + 9} 20" for x in range(1 + int(rng.integers(3))))
        lines.append(f"{name.removesuffix('.JPEG')},{boxes} ")
    kaggle.write_text("\n".join(lines) + "\n")
    return {"folder": folder, "truth": truth, "devkit": ground_truth, "kaggle": kaggle, "where": where}


def test_the_heads_class_order_is_the_sorted_wnids():
    assert WNIDS_1K == sorted(WNIDS_1K) and len(WNIDS_1K) == 1000  # what the mapping below relies on


@pytest.mark.parametrize("which", ["devkit", "kaggle"])
def test_shipped_labels_are_the_heads_indices(val, which):
    images = discover(val["folder"], val[which])
    expected = [sorted(WNIDS_1K).index(WNIDS_1K[val["truth"][p]]) for p in images.paths]
    assert images.paths == sorted(val["truth"])
    assert images.labels.tolist() == expected == [val["truth"][p] for p in images.paths]
    assert images.label_space == "imagenet-1k" and images.class_names == WNIDS_1K
    assert images.with_folder_ranks().labels.tolist() == [CLASSES.index(val["truth"][p]) for p in images.paths]


def test_a_subset_of_the_val_images_is_the_set_with_one_line_each_way(val, tmp_path):
    folder = tmp_path / "val"
    folder.mkdir()
    kept = sorted(val["truth"])[::3]
    for name in kept:
        (folder / name).write_bytes((val["folder"] / name).read_bytes())
    (folder / "extra.JPEG").write_bytes((val["folder"] / kept[0]).read_bytes())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        images = discover(folder, val["devkit"])
    assert images.paths == kept and images.labels.tolist() == [val["truth"][p] for p in kept]
    missing = [str(w.message) for w in said if issubclass(w.category, MissingImages)]
    unlisted = [str(w.message) for w in said if issubclass(w.category, UnlabelledImages)]
    assert len(missing) == 1 and f"lists 30 images; {30 - len(kept)} of them are not in" in missing[0], missing
    assert len(unlisted) == 1 and "'extra.JPEG'" in unlisted[0], unlisted


def _refused(tmp_path, folder, labels) -> str:
    store = tmp_path / "s.zarr"
    line = fails("build", "--model", "resnet18", "--weights", "none", "--data", folder, "--labels", labels,
                 "--store", store, "--image-size", "32", "--no-progress")
    assert not store.exists()
    return line


def test_a_ground_truth_without_its_meta_mat_is_refused(val, tmp_path):
    alone = tmp_path / "ILSVRC2012_validation_ground_truth.txt"
    alone.write_bytes(val["devkit"].read_bytes())
    assert "put the devkit's meta.mat beside it" in _refused(tmp_path, val["folder"], alone)
    plain = tmp_path / "ids.txt"  # the same content under another name: still the devkit's format
    plain.write_bytes(val["devkit"].read_bytes())
    assert "is the devkit's ground truth" in _refused(tmp_path, val["folder"], plain)


def test_an_id_the_meta_mat_lacks_is_refused(val, tmp_path):
    (tmp_path / "meta.mat").write_bytes((val["devkit"].parent / "meta.mat").read_bytes())
    truth = tmp_path / "ILSVRC2012_validation_ground_truth.txt"
    truth.write_text("1\n2\n6\n")  # 6 is an inner node of the hierarchy, no class
    assert "line 3: ILSVRC2012_ID 6 is no class of" in _refused(tmp_path, val["folder"], truth)


def test_ambiguous_kaggle_rows_and_names_are_refused(val, tmp_path):
    two = tmp_path / "LOC_val_solution.csv"
    two.write_text(f"ImageId,PredictionString\nILSVRC2012_val_00000001,{WNIDS_1K[7]} 1 2 3 4 {WNIDS_1K[8]} 1 2 3 4\n")
    assert "has boxes of 2 classes" in _refused(tmp_path, val["folder"], two)
    misnamed = tmp_path / "sub" / "LOC_val_solution.csv"
    misnamed.parent.mkdir()
    misnamed.write_text("filename,label\nILSVRC2012_val_00000001.JPEG,3\n")
    line = _refused(tmp_path, val["folder"], misnamed)
    assert "is named as Kaggle's LOC_val_solution.csv but reads as a filename,label CSV" in line, line


def test_two_files_of_one_image_are_refused(val, tmp_path):
    folder = tmp_path / "val"
    folder.mkdir()
    for name in sorted(val["truth"])[:3]:
        (folder / name).write_bytes((val["folder"] / name).read_bytes())
    (folder / "ILSVRC2012_val_00000002.png").write_bytes(b"")
    line = _refused(tmp_path, folder, val["kaggle"])
    assert "both image ILSVRC2012_val_00000002" in line and "ambiguous" in line, line


# -- the build's check of a pretrained head against its labels ------------------------------------------------------


def _build(val, weights, store, labels):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = fs.build(model=fs.ModelSpec("resnet18", weights=str(weights), image_size=32),
                          images=fs.ImageSource(val["folder"], labels), store=store, run=RUN, **SMALL)
    return result, [str(w.message) for w in said if issubclass(w.category, LabelsNearChance)]


def _first_chunk_agreement(store, rows: int = SMALL["chunk_rows"]) -> float:
    """Top-1 of the stored logits against the stored labels over the first chunk, in numpy."""
    handle = FeatureStore(store)
    logits = handle.read_logits("resnet18", "clean").astype(np.float64)[:rows]
    return float(np.mean(logits.argmax(axis=1) == np.asarray(handle.image_table()["label"])[:rows]))


def test_a_head_at_chance_on_its_labels_warns_and_a_right_one_does_not(val, tmp_path):
    from sklearn.linear_model import LogisticRegression

    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None, num_classes=1000)
    random_head = tmp_path / "random.pth"
    torch.save(net.state_dict(), random_head)
    first, _ = _build(val, random_head, tmp_path / "a.zarr", val["devkit"])
    handle = FeatureStore(tmp_path / "a.zarr")
    head_input = handle.anchors("resnet18")[-1].name  # avgpool: what fc reads (flattened)
    assert head_input == "avgpool"
    x = handle.read("resnet18", "clean", head_input).astype(np.float64)
    y = np.asarray(handle.image_table()["label"])
    fitted = LogisticRegression(C=100.0, max_iter=5000).fit(x, y)  # a head accurate on these images
    assert fitted.score(x, y) == 1.0
    with torch.no_grad():
        net.fc.weight.zero_()
        net.fc.bias.fill_(-1e4)
        net.fc.weight[fitted.classes_] = torch.from_numpy(fitted.coef_).float()
        net.fc.bias[fitted.classes_] = torch.from_numpy(fitted.intercept_).float()
    accurate = tmp_path / "accurate.pth"
    torch.save(net.state_dict(), accurate)

    right, said = _build(val, accurate, tmp_path / "right.zarr", val["devkit"])
    assert said == []
    assert right.head_agreement.agreement == _first_chunk_agreement(tmp_path / "right.zarr") == 1.0
    assert right.head_agreement.rows == 16

    shuffled = tmp_path / "shuffled" / "ILSVRC2012_validation_ground_truth.txt"
    shuffled.parent.mkdir()
    shuffled.write_text("\n".join(np.random.default_rng(3).permutation(val["devkit"].read_text().split())) + "\n")
    (shuffled.parent / "meta.mat").write_bytes((val["devkit"].parent / "meta.mat").read_bytes())
    wrong, said = _build(val, accurate, tmp_path / "shuffled.zarr", shuffled)
    agreement = _first_chunk_agreement(tmp_path / "shuffled.zarr")
    assert wrong.head_agreement.agreement == agreement < 0.5
    assert len(said) == 1 and "agrees with the labels" in said[0] and f"on {agreement:.1%}" in said[0], said

    # the devkit's ids written into a filename,label CSV (the mistake the formats above prevent): warned too
    as_indices = tmp_path / "ids.csv"
    ids = val["devkit"].read_text().split()
    as_indices.write_text("filename,label\n" + "".join(f"{p},{i}\n" for p, i in zip(sorted(val["truth"]), ids,
                                                                                     strict=True)))
    misread, said = _build(val, accurate, tmp_path / "ids.zarr", as_indices)
    assert misread.head_agreement.agreement == 0.0 and len(said) == 1, said
    assert first.head_agreement is not None  # a random head is checked too (it agrees about chance)
