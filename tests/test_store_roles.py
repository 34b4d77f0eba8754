"""The store's roles, each checked against what is known independently of the code under test: `info` as a typed
record whose JSON is what a store of a known shape holds, written out by hand; `read_probe` against the Zarr
arrays opened directly; `FeatureSource.from_arrays` against the stored source on the same rows; the estimator
variant handed to the probe job as it is, the registry untouched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from synthetic import class_clusters, write_feature_store

from featstore.errors import FeatstoreError
from featstore.store.reader import FeatureStore
from featstore.store.writer import StoreWriter

from conftest import run_cli

N, CLASSES, CHUNK, DIMS = 60, 3, 25, [4, 6]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """60 rows in chunks of 25 (3 chunks), two anchors, views clean and noisy; noisy's last chunk marked not done
    and a folder featstore did not write beside the views."""
    feats, labels = class_clusters(N, CLASSES, DIMS, seed=3)
    noisy = [f + np.float32(0.5) for f in feats]
    path = write_feature_store(tmp_path_factory.mktemp("roles") / "s.zarr", feats, labels, CLASSES,
                               views={"noisy": noisy}, chunk_rows=CHUNK)
    StoreWriter(path).undo_chunks("synthetic", "noisy", [2])
    (path / "synthetic" / "notes").mkdir()
    (path / "synthetic" / "notes" / "readme.txt").write_text("mine")
    return path


def expected_info(path: Path) -> dict:
    """What `featstore info --format json` prints for this store, by hand (the synthetic store names its classes
    class_0, class_1, ...)."""
    view = {"chunks_done": 3, "chunks": 3, "skipped": 0, "threads": [], "damaged_chunks": []}
    return {"path": str(path), "images": {"count": N, "classes": CLASSES, "source": f"synthetic features ({N} rows)",
                                          "label_space": "folder-rank",
                                          "class_names": [f"class_{c}" for c in range(CLASSES)]},
            "models": {"synthetic": {
                "model": "synthetic", "weights": "synthetic", "published_top1": None, "preprocessing": None,
                "token_pool": None, "num_classes": CLASSES, "chunk_rows": CHUNK,
                "anchors": [[0, "anchor00", "anchor00", 4], [1, "anchor01", "anchor01", 6]],
                "views": {"clean": view, "noisy": {**view, "chunks_done": 2}}, "probes": [], "versions": {},
                "foreign": ["notes"]}}}


def test_info_is_a_frozen_record_whose_json_is_what_info_prints(store):
    info = FeatureStore(store).info()
    model = info.models["synthetic"]
    assert (model.views["clean"].complete, model.views["noisy"].complete) == (True, False)
    assert [(a.index, a.name, a.dim) for a in model.anchors] == [(0, "anchor00", 4), (1, "anchor01", 6)]
    with pytest.raises(AttributeError):  # frozen
        info.path = "elsewhere"
    assert info.to_dict() == expected_info(store)
    printed = run_cli("info", "--store", store, "--format", "json").output
    assert printed == json.dumps(expected_info(store), indent=2) + "\n"


def test_damage_is_a_record_in_place_of_what_cannot_be_read(store, tmp_path):
    import shutil

    copy = Path(shutil.copytree(store, tmp_path / "s.zarr"))
    (copy / "synthetic" / "noisy" / "logits" / "zarr.json").write_text("{ not json")
    info = FeatureStore(copy).info()
    noisy = info.to_dict()["models"]["synthetic"]["views"]["noisy"]
    assert list(noisy) == ["damaged"] and noisy["damaged"].startswith("synthetic/noisy/logits: ")
    assert info.models["synthetic"].views["noisy"].what == noisy["damaged"]
    assert "view noisy: DAMAGED: synthetic/noisy/logits: " in run_cli("info", "--store", copy).output


def _direct(path: Path, *parts: str) -> zarr.Group:
    """A group of the store opened with Zarr itself, not through featstore."""
    return zarr.open_group(str(path), mode="r")["/".join(parts)]


def test_read_probe_reads_back_what_write_probe_wrote(store, tmp_path):
    import shutil

    path = Path(shutil.copytree(store, tmp_path / "s.zarr"))
    writer = StoreWriter(path)
    rng = np.random.default_rng(0)
    old, new = "v20260101T000000-00000000", "v20260102T000000-11111111"
    written = {}
    for version in (old, new):
        for a, dim in zip(("anchor00", "anchor01"), DIMS, strict=True):
            arrays = {"weight": rng.normal(size=(2, CLASSES, dim)),  # float64: kept as float32
                      "bias": rng.normal(size=(2, CLASSES)).astype(np.float32),
                      "reference": rng.random((2, N)) < 0.5,
                      "estimator": np.frombuffer(b"\x80\x04pickle bytes \xff", dtype=np.uint8)[None].repeat(2, 0)}
            writer.write_probe("synthetic", "linear@clean", a, arrays, {"fold_count": 2, "anchor": a}, version,
                               {"database": "x.duckdb"})
            written[version, a] = arrays
    writer.make_probe_current("synthetic", "linear@clean", new)
    reader = FeatureStore(path)
    for version, got in ((new, reader.read_probe("synthetic", "linear@clean")),
                         (old, reader.read_probe("synthetic", "linear@clean", old))):
        assert (got.key, got.name, got.version) == ("synthetic", "linear@clean", version)
        assert sorted(got.anchors) == ["anchor00", "anchor01"]
        for a, held in got.anchors.items():
            group = _direct(path, "synthetic", "probes", "linear@clean", version, a)
            assert dict(held.attrs) == dict(group.attrs) == {"fold_count": 2, "anchor": a}
            assert sorted(held.arrays) == sorted(k for k, _ in group.arrays())
            for name, values in held.arrays.items():
                np.testing.assert_array_equal(values, group[name][:])
                assert values.dtype == group[name].dtype
            assert held.arrays["weight"].dtype == np.float32
            np.testing.assert_allclose(held.arrays["weight"], written[version, a]["weight"], rtol=1e-6)
            assert held.arrays["reference"].dtype == bool and held.arrays["estimator"].dtype == np.uint8
            assert held.arrays["estimator"][1].tobytes() == b"\x80\x04pickle bytes \xff"
    with pytest.raises(FeatstoreError, match="holds no probes 'knn@clean' of 'synthetic'"):
        reader.read_probe("synthetic", "knn@clean")
    with pytest.raises(FeatstoreError, match="the probes linear@clean/v20990101T000000-22222222 are gone"):
        reader.read_probe("synthetic", "linear@clean", "v20990101T000000-22222222")
    with pytest.raises(FeatstoreError, match="'../x' is no stored-weights version"):
        reader.read_probe("synthetic", "linear@clean", "../x")
    with pytest.raises(FeatstoreError, match="no model 'other'"):
        reader.read_probe("other", "linear@clean")


def test_array_source_runs_the_stored_sources_code_path(store):
    """The same rows, as stored (float16 read from the store) and as arrays of those values: bit-identical
    features, projected or not, gathered in any order and in shuffled blocks."""
    from featstore.probing.source import FeatureSource

    fs = FeatureStore(store)
    anchors = fs.anchors("synthetic")
    rows = np.arange(3, N, 2)  # rows of every chunk
    projection = torch.from_numpy(np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32))
    stored = FeatureSource(fs, "synthetic", "clean", anchors, rows, torch.device("cpu"), 1 << 20, [None, projection])
    arrays = [np.asarray(fs.read("synthetic", "clean", a.name), dtype=np.float32)[rows] for a in anchors]
    held = FeatureSource.from_arrays(arrays, torch.device("cpu"), 1 << 20, [None, projection])
    assert held.dims == stored.dims == [4, 3] and held.in_memory
    order = np.random.default_rng(2).permutation(len(rows))
    for a, b in zip(stored.gather(rows[order]), held.gather(order), strict=True):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)
    assert torch.equal(held.gather(np.arange(len(rows)))[1], torch.from_numpy(arrays[1]) @ projection)
    for (_, a), (_, b) in zip(stored.blocks(rows), held.blocks(np.arange(len(rows))), strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    tiny = FeatureSource.from_arrays(arrays, torch.device("cpu"), 0, [None, projection])  # held whatever the budget
    assert tiny.in_memory


def test_array_source_moves_its_projection_to_the_device():
    """The projection goes where the features go, as the stored source sends it (a probe on a GPU multiplies
    device features by a device projection): checked on torch's meta device, which needs no GPU."""
    from featstore.probing.source import FeatureSource

    held = FeatureSource.from_arrays([np.ones((5, 4), dtype=np.float32)], torch.device("meta"), 1 << 20,
                                     [torch.ones(4, 2)])
    assert held.projections[0].device.type == "meta"
    (x,) = held.gather(np.arange(5))
    assert x.device.type == "meta" and tuple(x.shape) == (5, 2)


class Watching:
    """An estimator (fit, predict_proba, classes_) that records the registered variant names each time it is
    fitted: the job must fit it with the registry as it was."""

    seen: list[set[str]] = []

    def get_params(self, deep: bool = True) -> dict:
        return {}

    def set_params(self, **params) -> Watching:
        return self

    def fit(self, x, y):
        from featstore.probing.base import VARIANTS

        Watching.seen.append(set(VARIANTS))
        self.classes_ = np.unique(y)
        self.prior_ = np.bincount(y, minlength=CLASSES)[self.classes_] / len(y)
        return self

    def predict_proba(self, x):
        return np.tile(self.prior_, (len(x), 1))


def test_an_estimator_variant_is_handed_to_the_job_not_registered(store, tmp_path):
    import shutil

    from featstore.probing.base import VARIANTS
    from featstore.probing.estimator_variant import EstimatorVariant
    from featstore.workflows.probe import ProbeConfig, probe_job

    store = shutil.copytree(store, tmp_path / "s.zarr")  # the probes it saves stay in the copy
    before = dict(VARIANTS)
    Watching.seen.clear()
    variant = EstimatorVariant(Watching(), name="prior")
    result = probe_job(ProbeConfig(store=store, model="synthetic", db=tmp_path / "p.duckdb", variant=variant))
    assert list(result) == ["synthetic/clean/prior"]
    assert len(Watching.seen) == len(DIMS) and all(seen == set(before) for seen in Watching.seen)
    assert VARIANTS == before
    with pytest.raises(FeatstoreError, match="name 'linear' is a registered probe variant"):
        EstimatorVariant(Watching(), name="linear")
    with pytest.raises(FeatstoreError, match=r"variant='Watching': give an instance \(Watching\(\)\)"):
        EstimatorVariant(Watching)


def test_the_api_estimator_probe_and_load_probe_go_through_the_layers_below(store, tmp_path):
    """`fs.probe(variant=estimator)` fits with the registry untouched, and `fs.load_probe` reads its pickles back
    through `read_probe`: each anchor's fit predicts the train rows' class frequencies, counted here."""
    import shutil

    import featstore as fs
    from featstore.probing.base import VARIANTS
    from featstore.probing.split import make_split

    store = shutil.copytree(store, tmp_path / "s.zarr")
    before, db = dict(VARIANTS), tmp_path / "p.duckdb"
    Watching.seen.clear()
    (run,) = fs.probe(store=store, model="synthetic", db=db, variant=Watching(), name="prior")
    assert run == "synthetic/clean/prior" and VARIANTS == before
    assert len(Watching.seen) == len(DIMS) and all(seen == set(before) for seen in Watching.seen)
    labels = FeatureStore(store).image_table()["label"]
    train = make_split(np.arange(N), 0) == "train"
    prior = np.bincount(labels[train], minlength=CLASSES) / train.sum()
    loaded = fs.load_probe(store, "synthetic", run, db=db, trust_pickle=True)
    for a, dim in zip(loaded.anchors, DIMS, strict=True):
        np.testing.assert_allclose(loaded.predict_proba(a, np.zeros((2, dim))), [prior, prior])


@pytest.mark.parametrize("arch", ["vit_tiny_patch16_224", "deit_tiny_patch16_224", "resnet18"])
def test_info_shows_the_token_pool_where_the_build_read_a_class_token(arch):
    """`featstore info` names a model's token pool only where it says something: the class-token families' rule
    (StoreInfo's `reads_tokens`, by name, since a store records `cls` for every model) agrees with what the build
    finds in the network itself (a class-token parameter), for a random-init model of each."""
    import timm

    from featstore.nets.extraction import default_token_pool
    from featstore.store.summary import ModelInfo

    model = timm.create_model(arch, pretrained=False, num_classes=10).eval()
    has_class_token = any(name.rpartition(".")[2] in ("cls_token", "class_token") for name, _ in
                          model.named_parameters())
    pool = default_token_pool(model, torch.zeros(1, 3, 224, 224))
    info = ModelInfo(f"timm/{arch}", "none:seed=0", None, None, pool, 10, 8, (), {}, (), {})
    assert info.reads_tokens == has_class_token and pool == "cls"
