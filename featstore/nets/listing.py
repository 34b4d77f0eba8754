"""What `featstore anchors` prints: a model's default anchors with what they hook, or every name a build can
extract. Loads the model (but for a preset's defaults), so it sits above the tapper (`extraction`) and the depth
choice (`depth`), which import neither it nor each other's callers."""

from __future__ import annotations

from featstore.nets.anchors import PRESETS, preset_for


def anchor_listing(model_name: str, every: bool = False) -> list[str]:
    """Lines for `featstore anchors`: the default anchors with what they hook, or every name a build can
    extract, one per line (each accepted verbatim by `--anchors`). A preset's default anchors are read from the
    preset, without torch or the model (a second, not four and 850 MB)."""
    preset = None if every else preset_listing(model_name)
    return preset if preset is not None else _built_listing(model_name, every)


def preset_listing(model_name: str) -> list[str] | None:
    """The default anchors of a preset model with what they hook, from the preset's names alone (a `.mid` anchor
    hooks the block's bn1 and applies its ReLU); None for a model without a preset. The same lines as the model
    itself gives (tests/test_cli_newcomer.py compares them)."""
    library, _, arch = model_name.rpartition("/")  # a bare name is torchvision's where torchvision has it
    timm = preset_for("timm", arch)  # as the build reads it: a pretrained tag (`convnext_tiny.fb_in1k`) ignored
    presets = {"": PRESETS.get(arch) or timm, "torchvision": PRESETS.get(arch), "timm": timm}.get(library)
    if presets is None:
        return None
    lines = []
    for i, name in enumerate(presets):
        how = f"  (hooks {name.removesuffix('.mid')}.bn1 output + relu)" if name.endswith(".mid") else ""
        lines.append(f"{i:3d}  {name}{how}")
    return lines


def _built_listing(model_name: str, every: bool) -> list[str]:
    import torch

    from featstore.nets.anchors import resolve_anchors
    from featstore.nets.depth import anchor_names_for
    from featstore.nets.extraction import default_token_pool, runnable_anchor_names
    from featstore.nets.models import load_model

    loaded = load_model(model_name, weights="none")
    model = loaded.module.eval()
    crop = loaded.preprocessing.crop
    sample = loaded.preprocessing.normalize(torch.zeros(1, 3, crop, crop))
    if every:
        return runnable_anchor_names(model, sample)
    lines = []
    names = anchor_names_for(loaded.arch, loaded.library, model, None, sample, default_token_pool(model, sample))
    for a in resolve_anchors(model, names):
        how = "" if a.module == a.name else f"  (hooks {a.module or 'the model'} {a.side}" \
            f"{' + ' + a.post if a.post else ''})"
        lines.append(f"{a.index:3d}  {a.name}{how}")
    return lines
