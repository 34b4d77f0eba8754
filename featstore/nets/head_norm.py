"""The model's final norm and what each anchor is to the head, found once at build time so that a lens read through
the head (`tuned-lens`) applies what the network applies between its last layer and its classifier, never running
the network again.

Belrose et al.'s tuned lens reads a layer through the model's `Unembed`: its final norm, then the unembedding; and
the final layer, which the model itself reads that way, gets no translator. A ViT's head reads the CLS token after
`norm` (timm) or `encoder.ln` (torchvision); an average-pooled one after `fc_norm`; ConvNeXt after `head.norm`.
The store keeps the classifier's Linear (`head_arrays`); this adds:

- the final norm: the last normalisation module of the forward whose output, taken as the head takes it (the
  vector itself, the first token, or the 1 x 1 map flattened), is the head's input; kept as its kind (LayerNorm
  or RMSNorm over the feature axis), eps and affine parameters, and only where that formula applied to its input,
  taken the same way, gives its output (so it commutes with what reduces it to the head's input). Another norm
  (BatchNorm, a norm before a mean over tokens) is recorded as unreadable, with why.
- each anchor's role: `head input` (its pooled features are what the head reads: the lens applies the head
  alone), `final` (the final norm then the head on its pooled features give the model's logits: the last layer,
  which the reference reads with no translator), else `translated`. Both are told by the head's input, not its
  logits (a head initialised at zero gives the same logits for every input).

Measured on a forward of the build's sample (two images: the normalised black crop and a copy with noise), with
float tolerances: the values are computed again on other kernels (a row of tokens, not all of them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from featstore.nets.anchors import Anchor, head_name
from featstore.nets.extraction import Tapper, noisy_pair

ROLES = ("head input", "final", "translated")


def _reductions(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The ways a norm's output can become a head's input [B, D]: as it is, its first token, a 1 x 1 map
    flattened, or a mean over tokens or positions (which no norm of a vector commutes with: found, then refused)."""
    if x.ndim == 2:
        return {"vector": x}
    if x.ndim == 3:
        return {"first token": x[:, 0], "mean of the tokens": x.mean(dim=1),
                "mean of the tokens after the first": x[:, 1:].mean(dim=1)}
    if x.ndim == 4 and x.shape[2] == x.shape[3] == 1:
        return {"1x1 map": x.flatten(1)}
    if x.ndim == 4 and x.shape[1] == x.shape[2] == 1:
        return {"1x1 map": x.flatten(1)}
    if x.ndim == 4:
        return {"mean of the map": x.mean(dim=(2, 3)), "mean of the channels-last map": x.mean(dim=(1, 2))}
    return {}


def _close(a: torch.Tensor, b: torch.Tensor, scale: float | None = None) -> bool:
    """Equal to float error: within 1e-4 of the larger magnitude (values recomputed on other kernels)."""
    if a.shape != b.shape:
        return False
    scale = float(b.abs().max()) if scale is None else scale
    return bool((a.double() - b.double()).abs().max() <= 1e-4 * max(scale, 1e-3))


def norm_formula(kind: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """A final norm over the last axis of x: LayerNorm ((x - mean) / sqrt(var + eps)) or RMSNorm (x / sqrt(mean
    x^2 + eps)), then x * weight + bias."""
    if kind == "layer_norm":
        centred = x - x.mean(dim=-1, keepdim=True)
        scaled = centred * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps)
    else:
        scaled = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return scaled * weight + bias


def _kind(module: nn.Module, width: int) -> tuple[str, float, torch.Tensor, torch.Tensor] | str:
    """(kind, eps, weight, bias) of a norm over `width` features, or why it cannot be applied to a vector."""
    name = type(module).__name__
    shape = tuple(getattr(module, "normalized_shape", ()) or ())
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    if isinstance(module, nn.LayerNorm) or name in ("LayerNorm", "LayerNorm2d"):
        kind = "layer_norm"
    elif name.lower() in ("rmsnorm", "rmsnorm2d"):
        kind = "rms_norm"
    else:
        return f"{name} is no LayerNorm or RMSNorm over the features"
    if shape and tuple(shape) != (width,):
        return f"{name} normalises shape {tuple(shape)}, not the {width} features"
    eps = getattr(module, "eps", None)
    eps = 1e-5 if eps is None else float(eps)
    ones, zeros = torch.ones(width), torch.zeros(width)
    weight = ones if weight is None else weight.detach().float().cpu().reshape(-1)
    bias = zeros if bias is None else bias.detach().float().cpu().reshape(-1)
    return kind, eps, weight, bias


def _is_norm(module: nn.Module) -> bool:
    return "Norm" in type(module).__name__ or isinstance(module, nn.LayerNorm)


def head_reading(model: nn.Module, anchors: Sequence[Anchor], sample: torch.Tensor,
                 token_pool: str) -> tuple[dict, dict[str, np.ndarray]] | None:
    """What the store keeps beside the head for a lens (module docstring): ({"norm": {...} or None, "anchors":
    {anchor name: role}}, {"norm_weight": [D], "norm_bias": [D]} or {}); None for a model without a Linear
    head."""
    name = head_name(model)
    if name is None:
        return None
    modules = dict(model.named_modules())
    head = modules[name]
    kept = lambda x: x.detach().float().clone()  # noqa: E731 (copied: a later in-place op, ResNet's `out +=
    # identity`, would change what a hook saw)
    head_in: list[torch.Tensor] = []
    norms: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # (module, input, output) in the order they ran
    handles = [head.register_forward_pre_hook(lambda _m, inputs: head_in.append(kept(inputs[0])))]
    for module_name, module in modules.items():
        if module_name and _is_norm(module):
            handles.append(module.register_forward_hook(
                lambda _m, inputs, output, n=module_name: norms.append((n, kept(inputs[0]), kept(output)))))
    try:
        with Tapper(model, anchors, token_pool) as tapper, torch.inference_mode():
            feats, _ = tapper.forward(noisy_pair(sample))
    finally:
        for h in handles:
            h.remove()
    x_head = head_in[-1].flatten(1)
    width = x_head.shape[1]
    norm, norm_arrays, apply = None, {}, None
    for module_name, x_in, x_out in reversed(norms):
        taken = [(how, out) for how, out in _reductions(x_out).items() if _close(out, x_head)]
        if not taken:
            continue
        how = taken[0][0]
        found = _kind(modules[module_name], width)
        if isinstance(found, str):
            norm = {"module": module_name, "unreadable": found}
            break
        kind, eps, weight, bias = found
        x_in = x_in.permute(0, 2, 3, 1) if x_in.ndim == 4 and x_in.shape[1] == width else x_in
        vector = _reductions(x_in).get(how) if x_in.ndim != 4 else x_in.reshape(x_in.shape[0], -1, width)[:, 0]
        if vector is None or vector.shape[1] != width or not _close(
                norm_formula(kind, vector.cpu(), weight, bias, eps), x_head.cpu()):
            norm = {"module": module_name, "unreadable": f"{type(modules[module_name]).__name__} applied to its "
                                                          f"input taken as the head takes it ({how}) does not "
                                                          f"give the head's input"}
            break
        norm = {"module": module_name, "kind": kind, "eps": eps, "taken": how}
        norm_arrays = {"norm_weight": weight.numpy(), "norm_bias": bias.numpy()}
        apply = lambda v, k=kind, w=weight, b=bias, e=eps: norm_formula(k, v, w, b, e)  # noqa: E731
        break
    roles, x_head = {}, x_head.cpu()
    for anchor, f in zip(anchors, feats, strict=True):
        f = f.cpu()
        if f.shape[1] != width:
            continue
        if _close(f, x_head):
            roles[anchor.name] = "head input"
        elif apply is not None and _close(apply(f), x_head):  # the head's input, so its logits whatever its weights
            roles[anchor.name] = "final"
        else:
            roles[anchor.name] = "translated"
    return {"norm": norm, "anchors": roles}, norm_arrays
