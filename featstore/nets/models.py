"""One registry over torchvision and timm: a name and a weights choice in, an eval-mode model out.

Names: a torchvision name (`resnet50`, `vit_b_16`, `convnext_tiny`) is torchvision's model; a name only timm knows
(`vit_base_patch16_224`) is timm's; `timm/NAME` and `torchvision/NAME` choose the library. A bare name both
libraries know goes to timm only when `--weights` is one of timm's pretrained tags for it (`convnext_tiny
--weights fb_in1k`), since torchvision's weights names (`IMAGENET1K_V1`) never are.

Weights: `auto` (the paper's weights for the paper's five models; timm's ImageNet-1k-only checkpoints for timm's
ViT-B/16 and ConvNeXt-T; else the library default), `paper` (the source paper's weights, see `PAPER_WEIGHTS`),
`default` (the library's pretrained weights, fetched by torch/timm), a torchvision weights name such as
`IMAGENET1K_V1` or a timm pretrained tag such as `fb_in1k`, a local state-dict path (loaded with
`weights_only=True`), or `none` (seeded random init). Every choice gets a `weights_id` recorded in the store, so
a store never mixes two models. docs/paper.md gives the reasoning and the published top-1 of each.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from featstore.errors import FeatstoreError, Name
from featstore.images.preprocessing import Preprocessing
from featstore.nets.anchors import head_name
from featstore.schema import WEIGHTS, check_field

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# The source paper's weights: it studies "torchvision's ResNet-18/50/101" (ResNet-50 at full depth 76.15%,
# resize 256 -> crop 224), extended to ViT-B/16 and ConvNeXt-T; these are torchvision's original ImageNet-1k
# checkpoints of all five, each with its own eval transform.
PAPER_WEIGHTS = {("torchvision", arch): "IMAGENET1K_V1"
                 for arch in ("resnet18", "resnet50", "resnet101", "vit_b_16", "convnext_tiny")}

# timm's checkpoints of the same two architectures trained on ImageNet-1k only: what `auto` gives under timm's
# names, the timm row beside the torchvision one in studies/paper.toml. Their published ImageNet-1k val top-1 (%)
# is from timm's results/results-imagenet.csv (torchvision weights carry theirs in `meta["_metrics"]`).
TIMM_IN1K = {"vit_base_patch16_224": "augreg_in1k", "convnext_tiny": "fb_in1k"}
TIMM_PUBLISHED_TOP1 = {"vit_base_patch16_224.augreg_in1k": 79.154, "convnext_tiny.fb_in1k": 82.066}
PAPER_TWIN = {"vit_base_patch16_224": "vit_b_16", "convnext_tiny": "convnext_tiny"}  # timm name -> paper's model
SPECIAL_WEIGHTS = (WEIGHTS, "paper", "default", "none")


@dataclass
class LoadedModel:
    """An eval-mode classifier with what the store records about it."""

    name: str
    arch: str  # the name inside its library
    library: str  # "torchvision" | "timm"
    module: nn.Module
    weights_id: str
    preprocessing: Preprocessing
    num_classes: int


@lru_cache(maxsize=1)
def _torchvision_names() -> frozenset[str]:
    import torchvision.models

    return frozenset(torchvision.models.list_models())


def library_of(name: str, weights: str = WEIGHTS) -> tuple[str, str]:
    """'resnet50' -> ('torchvision', 'resnet50'); 'timm/resnet50' forces timm; a name both libraries know goes to
    timm when `weights` is one of timm's pretrained tags for it; unknown names fail."""
    if name.startswith("timm/"):
        return "timm", name[len("timm/"):]
    if name.startswith("torchvision/"):
        return "torchvision", name[len("torchvision/"):]
    if name in _torchvision_names():
        return ("timm" if _is_timm_tag(name, weights) else "torchvision"), name
    import timm

    if timm.is_model(name):
        return "timm", name
    import difflib

    names = list(dict.fromkeys([*_torchvision_names(), *timm.list_models()]))  # a name both libraries know: once
    close = difflib.get_close_matches(name, names, n=4)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise FeatstoreError(f"unknown model {name!r}: not a torchvision or timm model name{hint}")


def _is_timm_tag(name: str, weights: str) -> bool:
    if weights in SPECIAL_WEIGHTS or _weights_path(weights) is not None or not weights.islower():
        return False
    import timm

    return bool(timm.list_pretrained(f"{name}.{weights}"))


def resolve_weights(library: str, arch: str, weights: str) -> str:
    """`auto` -> the paper's weights where the paper names a model (timm's ImageNet-1k checkpoint for timm's
    twins of its ViT-B/16 and ConvNeXt-T), else `default`; `paper` -> the paper's weights."""
    base = arch.partition(".")[0]
    paper = PAPER_WEIGHTS.get((library, base))
    if weights == WEIGHTS:
        return paper or (TIMM_IN1K.get(base) if library == "timm" else None) or "default"
    if weights == "paper":
        if paper is not None:
            return paper
        if library == "timm" and base in PAPER_TWIN:
            raise FeatstoreError(
                f"the paper's model is torchvision's {PAPER_TWIN[base]} IMAGENET1K_V1; use ",
                Name("model", PAPER_TWIN[base]), ", or ", Name("weights", TIMM_IN1K[base]),
                f" for timm's ImageNet-1k checkpoint of {base}", field="weights", value=weights)
        models = ", ".join(arch for _, arch in PAPER_WEIGHTS)
        raise FeatstoreError(f"the paper studies torchvision's {models} ({library}/{arch} is not one of them); use ",
                             Name("weights", "default"), ", a weights name, a PATH or none", field="weights",
                             value=weights)
    return weights


def published_top1(weights_id: str) -> float | None:
    """The published ImageNet-1k top-1 (%) of a store's `weights_id`, when its library publishes one."""
    kind, _, ident = weights_id.partition(":")
    if kind == "torchvision":
        import torchvision.models as tvm

        try:
            metrics = tvm.get_weight(ident).meta.get("_metrics", {})
        except (ValueError, KeyError, AttributeError):
            return None
        top1 = metrics.get("ImageNet-1K", {}).get("acc@1")
        return float(top1) if top1 is not None else None
    if kind == "timm":
        return TIMM_PUBLISHED_TOP1.get(ident.removeprefix("timm/"))
    return None


def load_model(name: str, weights: str = WEIGHTS, seed: int = 0, image_size: int | None = None,
               num_classes: int | None = None) -> LoadedModel:
    """Build `name` with the chosen weights, in eval mode, with its own eval preprocessing.
    `num_classes` sets the head's width for `weights="none"` (cost measurement of a fine-tuned model); an
    `image_size` no crop can take is refused before the network is built."""
    if image_size is not None:
        check_field("image_size", image_size)
    library, arch = library_of(name, weights)
    weights = resolve_weights(library, arch, weights)
    path = _weights_path(weights)
    if num_classes is not None and weights != "none":
        raise FeatstoreError("num_classes applies to random-init models only; checkpoints bring their own head")
    if library == "torchvision":
        loaded = _torchvision(arch, weights, path, seed, image_size, num_classes)
    else:
        loaded = _timm(arch, weights, path, seed, image_size, num_classes)
    loaded.name, loaded.arch = name, arch
    loaded.preprocessing = loaded.preprocessing.with_image_size(image_size)
    loaded.module.eval().requires_grad_(False)
    return loaded


def _weights_path(weights: str) -> Path | None:
    if weights in ("default", "none"):
        return None
    p = Path(weights).expanduser()
    if p.suffix in (".pth", ".pt", ".bin", ".ckpt") or os.sep in weights or p.exists():
        if not p.is_file():
            raise FeatstoreError("no such file; pass a state-dict path, default or none",
                                 field="weights", value=weights)
        return p
    return None


def _torchvision(arch: str, weights: str, path: Path | None, seed: int, image_size: int | None = None,
                 num_classes: int | None = None) -> LoadedModel:
    import torchvision.models as tvm

    try:
        enum = tvm.get_model_weights(arch)
    except (ValueError, KeyError):
        enum = None
    chosen = None
    if path is None and weights != "none":
        if enum is None:
            raise FeatstoreError(f"torchvision has no pretrained weights for {arch}; use ", Name("weights", "none"),
                                 " or PATH")
        try:
            chosen = enum.DEFAULT if weights == "default" else enum[weights]
        except KeyError as e:
            names = ", ".join(w.name for w in enum)
            twin = {tv: tm for tm, tv in PAPER_TWIN.items()}.get(arch)
            hint = (f" (timm's {twin} checkpoints: ", Name("model", f"timm/{twin}"), " ", Name("weights", "TAG"),
                    ")") if twin else ()
            raise FeatstoreError(f"{arch} weights are {names}, default, none or a path", *hint, field="weights",
                                 value=weights) from e
    reference = chosen or (enum.DEFAULT if enum is not None else None)
    prep = _torchvision_preprocessing(reference)
    if chosen is not None:
        try:
            model = tvm.get_model(arch, weights=chosen)
        except Exception as e:  # URLError, HTTPError, hash mismatch: all mean "no usable file"
            target = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(chosen.url)
            raise FeatstoreError(
                f"could not get {arch} weights {chosen.name} ({type(e).__name__}); download {chosen.url} "
                f"and place it at {target}, or pass ", Name("weights", "PATH")
            ) from e
        return LoadedModel(arch, arch, "torchvision", model, f"torchvision:{chosen}", prep,
                           _num_classes(model))
    torch.manual_seed(seed)
    model = _create_torchvision(arch, image_size, **({"num_classes": num_classes} if num_classes else {}))
    if path is None:
        return LoadedModel(arch, arch, "torchvision", model, f"none:seed={seed}", prep, _num_classes(model))
    state = _read_state_dict(path)
    model = _fit_head(model, state, lambda n: _create_torchvision(arch, image_size, num_classes=n), seed)
    _load_state(model, state, path, arch)
    return LoadedModel(arch, arch, "torchvision", model, _file_id(path), prep, _num_classes(model))


def _create_torchvision(arch: str, image_size: int | None, **kwargs) -> nn.Module:
    """torchvision model with random weights; ViTs are built for `image_size` (their position embedding)."""
    import torchvision.models as tvm

    if image_size is not None:
        try:
            return tvm.get_model(arch, weights=None, image_size=image_size, **kwargs)
        except TypeError:  # convolutional models take any input size
            pass
    return tvm.get_model(arch, weights=None, **kwargs)


def _torchvision_preprocessing(weights) -> Preprocessing:
    if weights is None:
        return Preprocessing(256, 224, IMAGENET_MEAN, IMAGENET_STD, "bilinear")
    t = weights.transforms()
    return Preprocessing(int(t.resize_size[0]), int(t.crop_size[0]), tuple(t.mean), tuple(t.std),
                         t.interpolation.value)


def _timm(arch: str, weights: str, path: Path | None, seed: int, image_size: int | None,
          num_classes: int | None = None) -> LoadedModel:
    import timm
    from timm.data import resolve_data_config

    tag = None if path is not None or weights in ("default", "none") else weights
    if tag is not None:
        tags = [t.partition(".")[2] for t in timm.list_pretrained(f"{arch.partition('.')[0]}.*")]
        if tag not in tags:
            raise FeatstoreError(f"{arch} has no timm pretrained tag {tag!r}; use one of "
                                 f"{', '.join(tags) or 'none'}, default, none or a state-dict path",
                                 field="weights", value=weights)
        arch = f"{arch.partition('.')[0]}.{tag}"
    torch.manual_seed(seed)
    if path is None and weights != "none":
        try:
            model = _create_timm(arch, image_size, pretrained=True)
        except Exception as e:  # offline hub, missing file, bad cache
            cfg = _create_timm(arch, image_size, pretrained=False).pretrained_cfg
            where = cfg.get("hf_hub_id") or cfg.get("url") or "the timm hub"
            raise FeatstoreError(
                f"could not get timm weights for {arch} from {where} ({type(e).__name__}); fetch them once "
                f"online into the Hugging Face cache, or save the state dict and pass ", Name("weights", "PATH")
            ) from e
        weights_id = f"timm:{model.pretrained_cfg.get('hf_hub_id') or arch}"
    else:
        head = {"num_classes": num_classes} if num_classes else {}
        model = _create_timm(arch, image_size, pretrained=False, **head)
        weights_id = f"none:seed={seed}"
        if path is not None:
            state = _read_state_dict(path)
            model = _fit_head(model, state, lambda n: _create_timm(arch, image_size, num_classes=n), seed)
            _load_state(model, state, path, arch)
            weights_id = _file_id(path)
    cfg = resolve_data_config({}, model=model)
    crop = int(cfg["input_size"][-1])
    resize = int(crop / cfg.get("crop_pct", 0.875))
    prep = Preprocessing(resize, crop, tuple(cfg["mean"]), tuple(cfg["std"]), cfg.get("interpolation", "bicubic"))
    return LoadedModel(arch, arch, "timm", model, weights_id, prep, _num_classes(model))


def _create_timm(arch: str, image_size: int | None, **kwargs) -> nn.Module:
    """timm model; ViT-style models are built for `image_size` (their position embedding depends on it)."""
    import timm

    if image_size is not None:
        try:
            return timm.create_model(arch, img_size=image_size, **kwargs)
        except TypeError:  # convolutional models take any input size
            pass
    return timm.create_model(arch, **kwargs)


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise FeatstoreError(f"cannot read weights file {path} ({type(e).__name__}: {str(e)[:120]}); "
                             f"pass a torch.save'd state dict") from e
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise FeatstoreError(f"weights file {path} holds no state dict of tensors; save model.state_dict()")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def _fit_head(model: nn.Module, state: dict, rebuild, seed: int) -> nn.Module:
    """Rebuild with the checkpoint's class count when only the classifier's width differs."""
    head = head_name(model)
    w = state.get(f"{head}.weight") if head else None
    if w is not None and w.shape[0] != _num_classes(model):
        torch.manual_seed(seed)
        return rebuild(int(w.shape[0]))
    return model


def _load_state(model: nn.Module, state: dict, path: Path, arch: str) -> None:
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches
        first = str(e).split("size mismatch for ", 1)[-1].split(":")[0]
        raise FeatstoreError(f"weights file {path} does not fit {arch}: size mismatch for {first}; "
                             f"pass a checkpoint saved from {arch}") from e
    bad = list(result.missing_keys) + list(result.unexpected_keys)
    if bad:
        raise FeatstoreError(f"weights file {path} does not fit {arch}: {len(result.missing_keys)} missing, "
                             f"{len(result.unexpected_keys)} unexpected keys (e.g. {bad[0]}); "
                             f"pass a checkpoint saved from {arch}")


def _file_id(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return f"file:{path.name}:sha256={digest}"


def _num_classes(model: nn.Module) -> int:
    head = head_name(model)
    if head is None:
        return 0
    return int(dict(model.named_modules())[head].out_features)
