"""Taps: forward hooks that global-average-pool each anchor on the device, as the forward runs.

Pooling inside the hook means a full feature map never leaves the device and in-place ops that run later
(ResNet's `relu(inplace=True)`) cannot change what was recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from featstore.errors import FeatstoreError, Name, Step
from featstore.nets.anchors import INPUT_GRID, Anchor, head_name, resolve_anchor, resolve_anchors, valid_anchor_names
from featstore.nets.stored_types import choose_dtype
from featstore.schema import FIELDS, STORE_DTYPES

TOKEN_POOLS = FIELDS["pool"].choices


def pool(x: torch.Tensor, token_pool: str = "cls", channels_last: bool = False) -> torch.Tensor:
    """[B,C,H,W] (or [B,H,W,C] when `channels_last`) -> mean over H,W; [B,N,D] tokens -> CLS token or mean over
    tokens; [B,C] unchanged."""
    x = _first(x)
    if x.ndim == 4:
        return x.mean(dim=(1, 2) if channels_last else (2, 3))
    if x.ndim == 3:
        return x[:, 0] if token_pool == "cls" else x.mean(dim=1)
    if x.ndim == 2:
        return x
    raise FeatstoreError(f"cannot pool a tap output of shape {tuple(x.shape)}; pick another anchor")


def readout(x: torch.Tensor, anchor: Anchor, token_pool: str = "cls") -> torch.Tensor:
    """What an anchor stores of the tensor its hook sees, [B, dim]: its post-op (`relu` for `.mid`; `grid` for the
    input: the mean of each cell of an INPUT_GRID x INPUT_GRID grid per channel, flattened channel-major), then
    `pool`."""
    if anchor.post == "relu":
        x = torch.relu(x)
    elif anchor.post == "grid":
        x = _first(x)
        if x.ndim != 4:
            raise FeatstoreError(f"anchor {anchor.name!r}: the model's input has shape {tuple(x.shape)}, not an image "
                                 f"batch [B, C, H, W]; leave {anchor.name} out of ", Name("anchors"))
        x = F.adaptive_avg_pool2d(x.float(), INPUT_GRID).flatten(1)
    return pool(x, token_pool, anchor.channels_last)


def hook_anchor(model: nn.Module, anchor: Anchor, fn: Callable[[torch.Tensor], None]) -> RemovableHandle:
    """Call `fn` with the tensor an anchor records (its module's output, or what enters it for input-side
    taps) each time the module runs; the one place where the hook side is turned into a hook."""
    module = model.get_submodule(anchor.module)
    if anchor.side == "input":
        return module.register_forward_pre_hook(lambda _m, inputs: fn(_first(inputs)))
    return module.register_forward_hook(lambda _m, _inputs, output: fn(_first(output)))


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


class Tapper:
    """Hooks a model's anchors; `forward` returns pooled float32 features per anchor plus the logits."""

    def __init__(self, model: nn.Module, anchors: Sequence[Anchor], token_pool: str = "cls"):
        if token_pool not in TOKEN_POOLS:
            raise FeatstoreError(f"use one of {', '.join(TOKEN_POOLS)}", field="pool", value=token_pool)
        self.model = model
        self.anchors = list(anchors)
        self.token_pool = token_pool
        self._pooled: dict[str, torch.Tensor] = {}
        self._handles = [hook_anchor(model, a, self._recorder(a)) for a in self.anchors]

    def _recorder(self, anchor: Anchor) -> Callable[[torch.Tensor], None]:
        def record(x: torch.Tensor) -> None:
            self._pooled[anchor.name] = readout(x, anchor, self.token_pool).float()

        return record

    def forward(self, batch: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        self._pooled.clear()
        logits = _first(self.model(batch))
        missing = [a.name for a in self.anchors if a.name not in self._pooled]
        if missing:
            raise FeatstoreError(f"anchors {', '.join(missing)} never ran in the forward pass; pick modules "
                                 "that the model calls (", Step("fs.anchors(model, every=True)", "anchors"),
                                 " lists them)")
        feats = [self._pooled[a.name] for a in self.anchors]
        self._pooled.clear()
        return feats, logits.float()

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> Tapper:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def default_token_pool(model: nn.Module, sample: torch.Tensor) -> str:
    """How token anchors are read by default: the CLS token where the model has one (the token its head reads),
    else the mean over tokens (MLP-Mixer, LeViT: no token stands for the image). A model whose forward on
    `sample` has no token outputs at all ([B, N, D]) records `cls`, the value stores have always recorded."""
    names = (name.rpartition(".")[2] for name, _ in model.named_parameters())
    if any(n.startswith(("cls_token", "class_token")) for n in names):
        return "cls"
    if _convolutional_only(model):  # no module of it can output tokens: no forward needed (a GPU's first costs ~3 s)
        return "cls"
    tokens: list[bool] = []

    def seen(_m, _i, output) -> None:
        out = _first(output)
        tokens.append(isinstance(out, torch.Tensor) and out.ndim == 3 and out.is_floating_point())

    _run_hooked(model, sample, [m.register_forward_hook(seen) for name, m in model.named_modules() if name])
    return "mean" if any(tokens) else "cls"


# Modules whose outputs keep their input's layout ([B,C,H,W] maps, or [B,D] vectors for Linear): a model built of
# nothing else (ResNets, VGG, DenseNet, MobileNet, EfficientNet, RegNet) never outputs tokens.
_MAP_MODULES = (nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.ReLU6, nn.SiLU, nn.GELU, nn.Hardswish, nn.Hardsigmoid,
                nn.Sigmoid, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.Dropout, nn.Flatten, nn.Identity,
                nn.Linear)


def _convolutional_only(model: nn.Module) -> bool:
    """True when every leaf module is one of `_MAP_MODULES` (a model's own forward code could still reshape maps
    into tokens: only torchvision's plain CNN classes are trusted, which do not)."""
    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    return type(model).__module__.startswith("torchvision.models.") and all(
        isinstance(m, _MAP_MODULES) for m in leaves)


def is_channels_last(shape: Sequence[int]) -> bool:
    """A 4-D output [B,H,W,C]: featstore's crops are square, so its two spatial sides are equal; an output whose
    sides 1 and 2 are equal and differ from side 3 has its channels last (torchvision's and timm's Swin)."""
    return len(shape) == 4 and shape[1] == shape[2] != shape[3]


def output_shapes(model: nn.Module, anchors: Sequence[Anchor], sample: torch.Tensor) -> dict[str, torch.Size]:
    """The raw (unpooled) shape each anchor records, from one forward on `sample`."""
    shapes: dict[str, torch.Size] = {}
    _run_hooked(model, sample, [hook_anchor(model, a, lambda t, name=a.name: shapes.__setitem__(name, t.shape))
                                for a in anchors])
    return shapes


def _run_hooked(model: nn.Module, sample: torch.Tensor, handles: Sequence[RemovableHandle]) -> None:
    """One inference forward on `sample` with `handles` installed, removed afterwards whatever happens."""
    try:
        with torch.inference_mode():
            model(sample)
    finally:
        for h in handles:
            h.remove()


def noisy_pair(sample: torch.Tensor) -> torch.Tensor:
    """`sample`'s first image and a copy with seeded unit noise added: two inputs that differ, to tell how
    much an output depends on its input."""
    noise = torch.randn(sample.shape[1:], generator=torch.Generator().manual_seed(0)).to(sample)
    return torch.cat([sample[:1], sample[:1] + noise])


class AnchorSet(NamedTuple):
    """A model's resolved anchors, its head's class count and the type its logits are stored in."""

    anchors: list[Anchor]
    num_classes: int
    logits_dtype: str


def describe_anchors(model: nn.Module, names: Sequence[str], sample: torch.Tensor, token_pool: str = "cls",
                     store_dtype: str = STORE_DTYPES[0]) -> AnchorSet:
    """Resolve anchor names, find each one's layout, measure its pooled width (and the head's class count) and
    choose its stored type (`featstore.nets.stored_types`) with forwards on `sample`: the complete anchor description,
    before any image is extracted."""
    anchors = resolve_anchors(model, list(names))
    shapes = output_shapes(model, anchors, sample)
    anchors = [replace(a, channels_last=is_channels_last(shapes.get(a.name, ()))) for a in anchors]
    with Tapper(model, anchors, token_pool) as tapper, torch.inference_mode():
        feats, logits = tapper.forward(noisy_pair(sample))
    described = [replace(a, dim=int(f.shape[1]), dtype=choose_dtype(store_dtype, f))
                 for a, f in zip(anchors, feats, strict=True)]
    return AnchorSet(described, int(logits.shape[1]), choose_dtype(store_dtype, logits))


def head_arrays(model: nn.Module, num_classes: int) -> tuple[np.ndarray, np.ndarray, str] | None:
    """The classifier's weight [C, D] and bias [C] (float32) and its module name, for the store: the model's last
    Linear when its width is the logits' (else None: no head a readout could go through)."""
    name = head_name(model)
    if name is None:
        return None
    head = dict(model.named_modules())[name]
    if head.out_features != num_classes:
        return None
    weight = head.weight.detach().float().cpu().numpy()
    bias = (head.bias.detach().float().cpu().numpy() if head.bias is not None
            else np.zeros(head.out_features, dtype=np.float32))
    return weight, bias, name


def runnable_anchor_names(model: nn.Module, sample: torch.Tensor) -> list[str]:
    """`valid_anchor_names` less the modules that one forward on `sample` never calls (e.g. an attention
    dropout skipped by fused attention): exactly the names a build can extract."""
    ran: set[str] = {""}  # the model itself (the input anchor)
    _run_hooked(model, sample, [m.register_forward_hook(lambda *_, name=name: ran.add(name))
                                for name, m in model.named_modules() if name])
    return [n for n in valid_anchor_names(model) if resolve_anchor(model, n)[0] in ran]
