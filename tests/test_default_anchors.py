"""Default anchors of models without a preset, on a spread of torchvision and timm architectures with random
weights: each builds, probes and answers `featstore timeline`, and its last anchor is what the classifier reads
(checked against timm's `forward_head(pre_logits=True)` and against the model's own logits through its head)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import timm
import torch
import torchvision

from featstore.nets.depth import default_anchor_names, dominator_chain
from featstore.store.reader import FeatureStore

from conftest import assert_fp16_close, reference_batch, run_cli

# (model, image size): the smallest size each architecture takes; docs/design.md ("Anchors") lists them
SPREAD = [
    ("squeezenet1_0", 32), ("densenet121", 32), ("googlenet", 32), ("inception_v3", 80), ("mobilenet_v2", 32),
    ("mobilenet_v3_small", 32), ("shufflenet_v2_x0_5", 32), ("mnasnet0_5", 32), ("efficientnet_b0", 32),
    ("regnet_y_400mf", 32), ("swin_t", 32),
    ("timm/regnety_002", 32), ("timm/tf_efficientnet_lite0", 32), ("timm/mobilenetv3_small_050", 32),
    ("timm/deit_tiny_patch16_224", 32), ("timm/convnext_atto", 32), ("timm/ghostnet_050", 32),
    ("timm/lcnet_050", 32), ("timm/mixer_s16_224", 32), ("timm/levit_128s", 64), ("timm/dla34", 32),
]


def _reference_model(name: str, size: int) -> torch.nn.Module:
    """The same seeded random model, built here with the libraries' own constructors."""
    torch.manual_seed(0)
    if name.startswith("timm/"):
        arch = name.removeprefix("timm/")
        try:
            return timm.create_model(arch, pretrained=False, img_size=size).eval()
        except TypeError:
            return timm.create_model(arch, pretrained=False).eval()
    return torchvision.models.get_model(name, weights=None).eval()


@pytest.mark.filterwarnings("ignore::featstore.probing.base.UnconvergedProbe")  # 3 epochs: the pipeline, not fit
@pytest.mark.filterwarnings("ignore::FutureWarning")  # torchvision's GoogLeNet init
@pytest.mark.parametrize(("name", "size"), SPREAD, ids=[n for n, _ in SPREAD])
def test_default_anchors_build_probe_and_end_where_the_head_reads(name, size, image_dir, tmp_path):
    store, db, key = tmp_path / "s.zarr", tmp_path / "f.duckdb", name.replace("/", "_")
    run_cli("build", "--model", name, "--weights", "none", "--image-size", size, "--data", image_dir, "--store",
            store, "--chunk-rows", 12, "--batch-size", 6, "--workers", 0, "--no-progress")
    fs = FeatureStore(store)
    anchors = fs.anchors(key)
    assert 5 <= len(anchors) <= 12 and anchors[-1].name.endswith(".input") and anchors[-1].side == "input"
    model = _reference_model(name, size)
    head = dict(model.named_modules())[anchors[-1].module]
    paths = [image_dir / p for p in fs.image_table()["path"]]
    x = reference_batch(paths, fs.model_attrs(key)["config"]["preprocessing"])
    with torch.no_grad():
        logits = torch.cat([model(part) for part in x.split(6)])
        last = torch.from_numpy(fs.read(key, "clean", anchors[-1].name).astype(np.float32))
        if name.startswith("timm/"):
            pre = torch.cat([model.forward_head(model.forward_features(p), pre_logits=True) for p in x.split(6)])
            assert_fp16_close(fs.read(key, "clean", anchors[-1].name), pre.numpy(), "pre-logits")
        if isinstance(head, torch.nn.Linear) and "levit" not in name:  # LeViT averages two heads
            through_head = head(last)
            scale = float(logits.pow(2).mean().sqrt())
            assert float((through_head - logits).abs().max()) <= 0.01 * scale + 1e-6, "the head reads the last anchor"
    for a in anchors:
        assert np.isfinite(fs.read(key, "clean", a.name)).all(), a.name
    run_cli("probe", "--store", store, "--model", key, "--db", db, "--variant", "paper:epochs=3", "--no-progress")
    rows = run_cli("timeline", "--db", db, "--format", "csv").stdout.splitlines()
    assert rows[0].startswith("run_id,k,n,mean") and len(rows) == 5  # header + k = 1..4
    run = f"{key}/clean/paper:epochs=3,"
    assert all(r.startswith(run) and r.split(",")[2] == "4" for r in rows[1:])  # the 4 test images


def test_defaults_are_places_the_whole_forward_passes_through():
    """Never a branch of an inception module nor a layer inside a residual block: on torchvision's ResNet-50
    (whose preset is not used here) only the stem and whole blocks; on GoogLeNet, whole inception modules."""
    torch.manual_seed(0)
    resnet = torchvision.models.resnet50(weights=None).eval()
    names = default_anchor_names(resnet, torch.zeros(1, 3, 64, 64))
    assert names[-1] == "fc.input" and len(names) == 12
    assert all(re.fullmatch(r"relu|maxpool|layer\d\.\d+", n) for n in names[:-1]), names
    assert "layer4.2" not in names  # its average pool is what fc reads: fc.input already holds it
    googlenet = torchvision.models.googlenet(weights=None, init_weights=False).eval()
    names = default_anchor_names(googlenet, torch.zeros(1, 3, 64, 64))
    assert not any("branch" in n for n in names) and "inception4c" in names and names[-1] == "fc.input"


def test_the_dominator_chain_of_a_small_graph():
    """y = relu(a) + a with a = 2x: `a` and the sum dominate x; relu(a) (a branch) does not."""
    x = torch.ones(3, requires_grad=True)
    a = x * 2
    branch = torch.relu(a)
    y = (branch + a).sum()
    chain = dominator_chain(y.grad_fn, x.grad_fn or _accumulate(a))
    assert branch.grad_fn not in chain and a.grad_fn in chain


def _accumulate(t: torch.Tensor):
    """x's AccumulateGrad node, the leaf end of the graph (x itself has no grad_fn)."""
    return t.grad_fn.next_functions[0][0]


def test_anchors_command_lists_defaults_of_a_model_without_numbered_blocks():
    out = run_cli("anchors", "--model", "inception_v3").output
    assert "Mixed_6e" in out and "fc.input  (hooks fc input)" in out
