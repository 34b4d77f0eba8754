"""Taps: forward hooks that global-average-pool each anchor on the device, as the forward runs.

Pooling inside the hook means a full feature map never leaves the device and in-place ops that run later
(ResNet's `relu(inplace=True)`) cannot change what was recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from featstore.anchors import Anchor, anchor_names_for, resolve_anchor, resolve_anchors, valid_anchor_names
from featstore.errors import FeatstoreError

TOKEN_POOLS = ("cls", "mean")


def pool(x: torch.Tensor, token_pool: str = "cls") -> torch.Tensor:
    """[B,C,H,W] -> mean over H,W; [B,N,D] tokens -> CLS token or mean over tokens; [B,C] unchanged."""
    x = _first(x)
    if x.ndim == 4:
        return x.mean(dim=(2, 3))
    if x.ndim == 3:
        return x[:, 0] if token_pool == "cls" else x.mean(dim=1)
    if x.ndim == 2:
        return x
    raise FeatstoreError(f"cannot pool a tap output of shape {tuple(x.shape)}; pick another anchor")


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
            raise FeatstoreError(f"--pool {token_pool!r}: use one of {', '.join(TOKEN_POOLS)}")
        self.model = model
        self.anchors = list(anchors)
        self.token_pool = token_pool
        self._pooled: dict[str, torch.Tensor] = {}
        self._handles = [hook_anchor(model, a, self._recorder(a)) for a in self.anchors]

    def _recorder(self, anchor: Anchor) -> Callable[[torch.Tensor], None]:
        def record(x: torch.Tensor) -> None:
            if anchor.post == "relu":
                x = torch.relu(x)
            self._pooled[anchor.name] = pool(x, self.token_pool).float()

        return record

    def forward(self, batch: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        self._pooled.clear()
        logits = _first(self.model(batch))
        missing = [a.name for a in self.anchors if a.name not in self._pooled]
        if missing:
            raise FeatstoreError(f"anchors {', '.join(missing)} never ran in the forward pass; pick modules "
                                 f"that the model calls (`featstore anchors --model <name>`)")
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


def describe_anchors(model: nn.Module, names: Sequence[str], sample: torch.Tensor,
                     token_pool: str = "cls") -> tuple[list[Anchor], int]:
    """Resolve anchor names and measure their pooled widths (and the head's class count) with one forward
    on `sample`: the complete anchor description, before any image is extracted."""
    anchors = resolve_anchors(model, list(names))
    with Tapper(model, anchors, token_pool) as tapper, torch.inference_mode():
        feats, logits = tapper.forward(sample)
    dims = [replace(a, dim=int(f.shape[1])) for a, f in zip(anchors, feats, strict=True)]
    return dims, int(logits.shape[1])


def runnable_anchor_names(model: nn.Module, sample: torch.Tensor) -> list[str]:
    """`valid_anchor_names` less the modules that one forward on `sample` never calls (e.g. an attention
    dropout skipped by fused attention): exactly the names a build can extract."""
    ran: set[str] = set()
    handles = [m.register_forward_hook(lambda *_, name=name: ran.add(name))
               for name, m in model.named_modules() if name]
    try:
        with torch.inference_mode():
            model(sample)
    finally:
        for h in handles:
            h.remove()
    return [n for n in valid_anchor_names(model) if resolve_anchor(model, n)[0] in ran]


def anchor_listing(model_name: str, every: bool = False) -> list[str]:
    """Lines for `featstore anchors`: the default anchors with what they hook, or every name a build can
    extract, one per line (each accepted verbatim by `--anchors`)."""
    from featstore.models import load_model

    loaded = load_model(model_name, weights="none")
    model = loaded.module.eval()
    if every:
        crop = loaded.preprocessing.crop
        return runnable_anchor_names(model, loaded.preprocessing.normalize(torch.zeros(1, 3, crop, crop)))
    lines = []
    for a in resolve_anchors(model, anchor_names_for(loaded.arch, loaded.library, model, None)):
        how = "" if a.module == a.name else f"  (hooks {a.module} {a.side}{' + ' + a.post if a.post else ''})"
        lines.append(f"{a.index:3d}  {a.name}{how}")
    return lines
