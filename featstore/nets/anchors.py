"""Anchors: the layers whose pooled activations featstore stores, one description used everywhere.

An anchor names the module whose output is hooked plus an optional elementwise step applied before
pooling (`X.mid` = inside a ResNet BasicBlock after bn1 + ReLU; the block's `relu` module runs twice, so it
cannot be hooked). The list is built once per model, written into the store and later into DuckDB, and read
back by probes and reports (the idea of timm's FeatureInfo).
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from featstore.errors import FeatstoreError, Name, Step
from featstore.schema import comma_list

if TYPE_CHECKING:  # the records above are read without torch (`featstore info`); the functions below take a model
    from torch import nn

# Presets (docs/design.md, "Anchors"), per library, in that library's module names. Names are anchor names;
# `.mid` suffixes are resolved by `resolve_anchor`. torchvision's ViT-B/16 and ConvNeXt-T anchors are the same
# places as timm's: blocks 0-10 then the final norm (whose CLS token the head reads), and the stem, stage blocks and
# the head's norm (the pooled pre-logits).
_VIT_B16_TV = [f"encoder.layers.encoder_layer_{i}" for i in range(11)] + ["encoder.ln"]
PRESETS: dict[str, list[str]] = {  # torchvision
    "resnet18": ["relu", "maxpool", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1",
                 "layer4.0.mid", "layer4.0", "layer4.1.mid", "avgpool"],
    "resnet50": ["maxpool", "layer1.1", "layer1.2", "layer2.1", "layer2.3", "layer3.1", "layer3.3", "layer3.4",
                 "layer3.5", "layer4.0", "layer4.1", "avgpool"],
    "resnet101": ["maxpool", "layer1.2", "layer2.3", "layer3.3", "layer3.7", "layer3.11", "layer3.15",
                  "layer3.18", "layer3.22", "layer4.0", "layer4.1", "avgpool"],
    "vit_b_16": _VIT_B16_TV,
    "convnext_tiny": ["features.0", "features.1.1", "features.1.2", "features.3.1", "features.3.2", "features.5.2",
                      "features.5.4", "features.5.6", "features.5.8", "features.7.0", "features.7.1", "classifier.0"],
}
TIMM_PRESETS: dict[str, list[str]] = {
    "vit_base_patch16_224": [f"blocks.{i}" for i in range(11)] + ["norm"],
    "convnext_tiny": ["stem", "stages.0.blocks.1", "stages.0.blocks.2", "stages.1.blocks.1", "stages.1.blocks.2",
                      "stages.2.blocks.2", "stages.2.blocks.4", "stages.2.blocks.6", "stages.2.blocks.8",
                      "stages.3.blocks.0", "stages.3.blocks.1", "head.norm"],
}
_PRESETS_BY_LIBRARY = {"torchvision": PRESETS, "timm": TIMM_PRESETS}


def preset_for(library: str, arch: str) -> list[str] | None:
    """The preset anchors of `arch` in `library` (a timm pretrained tag, `convnext_tiny.fb_in1k`, is ignored)."""
    return _PRESETS_BY_LIBRARY.get(library, {}).get(arch.partition(".")[0])


# Transformer module taps per block (docs/design.md, "Transformer module taps"): tap -> (submodule of the
# block, which side of it).
# "input" taps read what enters the module (a forward pre-hook); "" is the block itself.
TAPS: dict[str, tuple[str, str]] = {
    "ln1": ("norm1", "output"), "attn": ("ls1", "output"), "resid_mid": ("norm2", "input"),
    "ln2": ("norm2", "output"), "fc1": ("mlp.fc1", "output"), "act": ("mlp.act", "output"),
    "fc2": ("mlp.fc2", "output"), "resid": ("", "output"),
}


HOOK_SIDES = ("output", "input")
POST_OPS = ("relu", "grid")
INPUT_SUFFIX = ".input"  # `X.input`: what enters module X (`<head>.input` is what the classifier reads)
# The anchor `input`: the preprocessed image the model receives (a forward pre-hook on the model itself), averaged
# over an INPUT_GRID x INPUT_GRID grid of cells (adaptive average pooling, post-op `grid`) and flattened channel by
# channel: 3 x 8 x 8 = 192 values, where a global average would keep 3 (each channel's mean). Baldock et al.'s layer
# 0, at a width a store of many images can hold (the full pixels are 150,528 values at 224 x 224). Opt-in, first in
# `anchors`; a model module named `input` is read as this anchor, not as the module.
INPUT_ANCHOR = "input"
INPUT_GRID = 8
DEFAULT_ANCHORS = "default"  # in `anchors`: the model's default anchors at that place (`input,default`)


@dataclass(frozen=True)
class Anchor:
    """One tap, resolved: what users and tables see (`name`), and how the extractor records it: a forward hook
    on `module`'s output (`side="output"`) or a pre-hook on what enters it (`side="input"`), then `post` (an
    elementwise op, `relu` for `.mid`) before pooling. `dim` is the pooled width, known after one forward;
    `channels_last` says a 4-D output is [B,H,W,C] (Swin's stages), so pooling averages H and W, not W and C;
    `dtype` is the type the store keeps it in (`featstore.nets.stored_types`)."""

    index: int
    name: str
    module: str
    dim: int
    depth_frac: float
    side: str = "output"
    post: str | None = None
    block: int | None = None  # Transformer module taps: the block index ...
    tap: str | None = None  # ... and the tap name (ln1, attn, resid_mid, ln2, fc1, act, fc2, resid)
    channels_last: bool = False
    dtype: str = "float16"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Anchor:
        side, post = d.get("side", "output"), d.get("post")
        if post == "input":  # stores written before `side` existed kept the hook side in `post`
            side, post = "input", None
        return cls(d["index"], d["name"], d["module"], d["dim"], d["depth_frac"], side, post, d.get("block"),
                   d.get("tap"), bool(d.get("channels_last", False)), d.get("dtype", "float16"))


def _taps_of(block: nn.Module, block_name: str, modules: dict[str, nn.Module]) -> list[str]:
    """The module taps a timm ViT-style block offers (those whose submodule exists)."""
    if not hasattr(block, "norm2"):
        return []
    return [tap for tap, (sub, _) in TAPS.items() if not sub or f"{block_name}.{sub}" in modules]


def _has_mid(module: nn.Module) -> bool:
    from torch import nn

    return isinstance(getattr(module, "bn1", None), nn.Module)


def valid_anchor_names(model: nn.Module) -> list[str]:
    """Every name `--anchors` accepts, in model order (the idea of torchvision's `get_graph_node_names`):
    `input` (the model's input on a grid, `INPUT_ANCHOR`), each module, `X.mid` inside blocks with a bn1, `X.<tap>`
    for timm ViT-style blocks, and `<head>.input`, what the classifier reads (`X.input` is accepted for any module
    X)."""
    modules = dict(model.named_modules())
    head = head_name(model)
    names: list[str] = [INPUT_ANCHOR]
    for name, module in modules.items():
        if not name:
            continue
        if name == head:
            names.append(name + INPUT_SUFFIX)
        names.append(name)
        if _has_mid(module):
            names.append(f"{name}.mid")
        names.extend(f"{name}.{tap}" for tap in _taps_of(module, name, modules))
    return list(dict.fromkeys(names))  # a tap may share its name with a module (`attn`): the tap wins


def resolve_anchor(model: nn.Module, name: str) -> tuple[str, str, str | None]:
    """Anchor name -> (module path to hook, hook side, post-op). Unknown names fail with the closest valid ones.
    `input` is what enters the model itself (module path ''), on a grid."""
    if name == INPUT_ANCHOR:
        return "", "input", "grid"
    modules = dict(model.named_modules())
    block_name, _, tap = name.rpartition(".")
    if tap in TAPS and block_name in modules and hasattr(modules[block_name], "norm2"):
        if tap not in _taps_of(modules[block_name], block_name, modules):
            raise FeatstoreError(f"anchor {name!r}: this block has no {TAPS[tap][0]}; taps need timm ViT-style "
                                 f"blocks")
        sub, side = TAPS[tap]
        return (f"{block_name}.{sub}" if sub else block_name), side, None
    if name.endswith(".mid"):
        block = name[: -len(".mid")]
        if block in modules and _has_mid(modules[block]):
            return f"{block}.bn1", "output", "relu"
        raise FeatstoreError(f"anchor {name!r}: {block!r} is not a block with a bn1 layer; "
                             f"`.mid` taps exist only inside ResNet blocks")
    if name in modules and name != "":
        return name, "output", None
    target = name.removesuffix(INPUT_SUFFIX)
    if target != name and target and target in modules:
        return target, "input", None
    close = difflib.get_close_matches(name, valid_anchor_names(model), n=5, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise FeatstoreError(f"anchor {name!r} is not a module of this model{hint}; ",
                         Step("fs.anchors(model, every=True)", "anchors", ("every",)), " lists the valid names")


def head_name(model: nn.Module) -> str | None:
    """The classifier: the last Linear module (torchvision's fc/heads.head, timm's head/head.fc)."""
    from torch import nn

    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    return linears[-1] if linears else None


def check_anchor_names(names: list[str]) -> list[str]:
    """A usable anchor list: no name twice, a start and an end, and the input (if listed) first: it comes before
    every module, and a timeline is in depth order."""
    if len(set(names)) != len(names):
        raise FeatstoreError(Name("anchors"), f" lists a name twice: {','.join(names)}")
    if INPUT_ANCHOR in names[1:]:
        raise FeatstoreError(Name("anchors"),
                             f" lists {INPUT_ANCHOR} at place {names.index(INPUT_ANCHOR) + 1}: the model's "
                             f"input comes before every module, so it goes first ({INPUT_ANCHOR},{names[0]},...)")
    if len(names) < 2:
        raise FeatstoreError("need at least 2 anchors: a decision timeline has a start and an end")
    return names


def check_anchor_choice(anchors: str | None, taps: str | None) -> None:
    """What of `anchors` and `taps` can be refused without the model (before torch loads): both given, or a list
    without `default` that `check_anchor_names` refuses (names that the model lacks are known once it loads)."""
    if taps and anchors:
        raise FeatstoreError(Name("taps"), " and ", Name("anchors"), " exclude each other: taps define the anchors")
    names = comma_list(anchors) if anchors else []
    if names and DEFAULT_ANCHORS not in names:
        check_anchor_names(names)


def tap_anchor_names(model: nn.Module, taps: str) -> list[str]:
    """'all' or 'ln2,act' -> blocks.<i>.<tap> for every block of a timm VisionTransformer, block-major."""
    from torch import nn

    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.Sequential, nn.ModuleList)) or not all(hasattr(b, "norm2") for b in blocks):
        raise FeatstoreError(Name("taps"),
                             " needs a timm VisionTransformer-style model (blocks with norm1/attn/norm2/mlp)")
    names = list(TAPS) if taps == "all" else comma_list(taps)
    unknown = [t for t in names if t not in TAPS]
    if unknown:
        raise FeatstoreError(f"unknown tap(s) {', '.join(unknown)}; use all or {','.join(TAPS)}",
                             field="taps", value=taps)
    return [f"blocks.{i}.{tap}" for i in range(len(blocks)) for tap in names]


def resolve_anchors(model: nn.Module, names: list[str]) -> list[Anchor]:
    """The anchor list of a model, resolved once before extraction: modules, hook sides, post-ops and depth
    fractions (index/T; for module taps block/(L-1), the layer x module paper's depth%). `dim` stays 0 until
    `featstore.nets.extraction.describe_anchors` measures it."""
    last = len(names) - 1
    blocks = [_block_of(n) for n in names]
    last_block = max((b for b in blocks if b is not None), default=0) or 1
    out = []
    for i, (name, block) in enumerate(zip(names, blocks, strict=True)):
        module, side, post = resolve_anchor(model, name)
        tap = name.rpartition(".")[2] if block is not None else None
        depth = block / last_block if block is not None else i / last
        out.append(Anchor(i, name, module, 0, depth, side, post, block, tap))
    return out


def _block_of(name: str) -> int | None:
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() and parts[2] in TAPS:
        return int(parts[1])
    return None

