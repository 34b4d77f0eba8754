"""The typed records that cross featstore's boundaries: one default each, older shapes read in one place,
unknown TOML keys refused, duplicate variant names refused."""

from __future__ import annotations

import pytest

from featstore.compute.specs import ImageSource, ModelSpec, RunOptions, split_options
from featstore.errors import FeatstoreError
from featstore.probing.base import ProbeVariant, register
from featstore.store.config import StoreConfig

from conftest import fails

OLD_CONFIG = {  # the shape a store of format 1 wrote before the decoder was recorded and anchors had a side
    "model": "m", "library": "timm", "weights_id": "none:seed=0", "token_pool": "mean", "num_classes": 3,
    "preprocessing": {"resize": 37, "crop": 32, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
                      "interpolation": "bicubic"},
    "chunk_rows": 4, "batch_size": 2, "precision": "fp32", "memory_format": "contiguous_format",
    "anchors": [{"index": 0, "name": "blocks.0.resid_mid", "module": "blocks.0.norm2", "dim": 8, "depth_frac": 0.0,
                 "post": "input", "block": 0, "tap": "resid_mid"}],
    "images_fingerprint": "abc"}


def test_store_config_reads_the_older_shape_and_writes_todays():
    cfg = StoreConfig.from_dict(OLD_CONFIG)
    assert cfg.decoder == "pil" and cfg.anchors[0].side == "input" and cfg.anchors[0].post is None
    again = StoreConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.differences(cfg) == []
    other = StoreConfig.from_dict({**OLD_CONFIG, "chunk_rows": 8, "decoder": "torchvision-cpu"})
    assert cfg.differences(other) == ["chunk_rows", "decoder"]


def test_split_options_builds_each_record_from_a_flat_dict():
    (model, images, run), rest = split_options(
        {"model": "resnet18", "weights": "none", "image_size": 32, "data": "imgs", "limit": 5, "device": "cpu",
         "seed": 3, "progress": False, "store": "s.zarr"}, ModelSpec, ImageSource, RunOptions)
    assert model == ModelSpec("resnet18", "none", 32)
    assert images.data.name == "imgs" and images.labels is None and images.limit == 5
    assert run == RunOptions(device="cpu", seed=3, progress=False) and rest == {"store": "s.zarr"}


@pytest.mark.parametrize("bad, message", [(dict(batch_size=0), "^batch_size=0: "), (dict(workers=-1), "^workers=-1: "),
                                          (dict(threads=0), "^threads=0: ")])
def test_run_options_refuse_bad_values(bad, message):
    with pytest.raises(FeatstoreError, match=message):
        RunOptions(**bad)


def test_bad_record_values_are_one_line_before_anything_is_written(image_dir, tmp_path):
    store = tmp_path / "s.zarr"
    assert "--batch-size 0" in fails("build", "--model", "resnet18", "--weights", "none", "--data", image_dir,
                                     "--store", store, "--batch-size", "0")
    assert "--limit -3" in fails("build", "--model", "resnet18", "--weights", "none", "--data", image_dir,
                                 "--store", store, "--limit", "-3")
    assert not store.exists()


def test_the_cli_defaults_are_the_records_defaults():
    import click

    from featstore.analytics.exit_policies import DEFAULT_POLICIES
    from featstore.cli.main import cli

    ctx = click.Context(cli.commands["exit-sim"])
    exit_sim = {p.name: p for p in cli.commands["exit-sim"].params}
    parsed = {name: exit_sim[name].process_value(ctx, exit_sim[name].get_default(ctx))
              for name in ("ks", "thresholds", "combined_thresholds")}
    assert tuple(parsed["ks"]) == DEFAULT_POLICIES.ks
    assert tuple(parsed["thresholds"]) == pytest.approx(DEFAULT_POLICIES.thresholds)
    assert tuple(parsed["combined_thresholds"]) == pytest.approx(DEFAULT_POLICIES.combined)
    assert len(parsed["thresholds"]) == 50


def test_a_second_variant_of_the_same_name_is_refused():
    class Again(ProbeVariant):
        name = "linear"

        def plan(self, n_fit):
            raise NotImplementedError

    with pytest.raises(ValueError, match="'linear' is already registered"):
        register(Again)
    from featstore.probing.base import VARIANTS
    from featstore.probing.linear import Linear

    assert VARIANTS["linear"] is Linear and register(Linear) is Linear  # registering the same class again is fine


@pytest.mark.parametrize("text, key", [
    ('[[models]]\nname = "resnet18"\nseed = 1\n', "'seed'"),
    ('[probe]\nvariant = ["linear"]\n[[models]]\nname = "resnet18"\n', "'variant'"),
    ('[build]\nview = ["clean"]\n[[models]]\nname = "resnet18"\n', "'view'"),
    ('seeds = [0]\n[[models]]\nname = "resnet18"\n', "'seeds'"),
])
def test_a_study_file_refuses_unknown_keys_naming_the_key_and_the_file(tmp_path, text, key):
    path = tmp_path / "typo.toml"
    path.write_text('[data]\npath = "images"\n' + text)
    line = fails("study", path, "--out", tmp_path / "out")
    assert f"unknown key {key}" in line and str(path) in line
    assert not (tmp_path / "out").exists()


def test_a_zoo_file_refuses_unknown_keys_naming_the_key_and_the_file(tmp_path):
    path = tmp_path / "zoo.toml"
    path.write_text('[id]\ndata = "x"\nseed = 3\n[[ood]]\nname = "n"\nview = "gaussian_noise-1"\n'
                    + "".join(f'[[models]]\nname = "m{i}"\nmodel = "test_vit"\n' for i in range(3)))
    line = fails("zoo", path, "--db", tmp_path / "z.duckdb")
    assert "unknown key 'seed'" in line and str(path) in line
    assert not (tmp_path / "z.duckdb").exists()


def test_the_study_passes_its_k_to_the_report(tmp_path, monkeypatch):
    from featstore.workflows import study

    (tmp_path / "images").mkdir()
    path = tmp_path / "s.toml"
    path.write_text('k = 3\n[data]\npath = "images"\n[[models]]\nname = "resnet18"\n')
    seen = []
    monkeypatch.setattr(study, "write_report", lambda db, out, **kw: seen.append(kw))
    monkeypatch.setattr(study, "declared_run_ids", lambda s: ["declared"])  # (they need the built store)
    report = [s for s in study.plan(study.load_study(path)) if s.id == "report"][0]
    report.run()
    assert seen == [{"k": 3, "runs": ["declared"]}]
