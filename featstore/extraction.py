"""Taps: forward hooks that global-average-pool each anchor on the device, as the forward runs.

Pooling inside the hook means a full feature map never leaves the device and in-place ops that run later
(ResNet's `relu(inplace=True)`) cannot change what was recorded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from featstore.anchors import Anchor, resolve_anchor
from featstore.errors import FeatstoreError

TOKEN_POOLS = ("cls", "mean")


def pool(x: torch.Tensor, token_pool: str = "cls") -> torch.Tensor:
    """[B,C,H,W] -> mean over H,W; [B,N,D] tokens -> CLS token or mean over tokens; [B,C] unchanged."""
    if isinstance(x, (tuple, list)):
        x = x[0]
    if x.ndim == 4:
        return x.mean(dim=(2, 3))
    if x.ndim == 3:
        return x[:, 0] if token_pool == "cls" else x.mean(dim=1)
    if x.ndim == 2:
        return x
    raise FeatstoreError(f"cannot pool a tap output of shape {tuple(x.shape)}; pick another anchor")


class Tapper:
    """Hooks a model's anchors; `forward` returns pooled float32 features per anchor plus the logits."""

    def __init__(self, model: nn.Module, anchor_names: Sequence[str], token_pool: str = "cls"):
        if token_pool not in TOKEN_POOLS:
            raise FeatstoreError(f"--pool {token_pool!r}: use one of {', '.join(TOKEN_POOLS)}")
        self.model = model
        self.names = list(anchor_names)
        self.token_pool = token_pool
        self._pooled: dict[str, torch.Tensor] = {}
        modules = dict(model.named_modules())
        self._handles = []
        for name in self.names:
            module_name, post = resolve_anchor(model, name)
            module = modules[module_name]
            if post == "input":
                self._handles.append(module.register_forward_pre_hook(self._pre_hook(name)))
            else:
                self._handles.append(module.register_forward_hook(self._hook(name, post)))

    @classmethod
    def for_anchors(cls, model: nn.Module, anchors: Sequence[Anchor], token_pool: str = "cls") -> Tapper:
        return cls(model, [a.name for a in anchors], token_pool)

    def _hook(self, name: str, post: str | None):
        def hook(_module: nn.Module, _inputs, output) -> None:
            x = output[0] if isinstance(output, (tuple, list)) else output
            if post == "relu":
                x = torch.relu(x)
            self._pooled[name] = pool(x, self.token_pool).float()

        return hook

    def _pre_hook(self, name: str):
        def hook(_module: nn.Module, inputs) -> None:
            self._pooled[name] = pool(inputs[0], self.token_pool).float()

        return hook

    def forward(self, batch: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        self._pooled.clear()
        logits = self.model(batch)
        if isinstance(logits, (tuple, list)):
            logits = logits[0]
        missing = [n for n in self.names if n not in self._pooled]
        if missing:
            raise FeatstoreError(f"anchors {', '.join(missing)} never ran in the forward pass; pick modules "
                                 f"that the model calls (`featstore anchors --model <name>`)")
        feats = [self._pooled[n] for n in self.names]
        self._pooled.clear()
        return feats, logits.float()

    def dims(self, sample: torch.Tensor) -> tuple[list[int], int]:
        """Feature width of every anchor and the number of classes, from one forward on `sample`."""
        with torch.inference_mode():
            feats, logits = self.forward(sample)
        return [int(f.shape[1]) for f in feats], int(logits.shape[1])

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> Tapper:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
