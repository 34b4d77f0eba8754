"""Default anchors for a model without a preset: the places where a network's depth can be read, found by
tracing one forward.

A module's output is a place "in depth" only when the whole forward passes through it: every path from the
image to the logits runs through that output (it dominates the input in the autograd graph rooted at the
logits). The block outputs of a residual net, an inception module's concatenation and every layer of a plain
net are such cut points; a branch, or a layer inside a residual block, is not (the skip goes around it). The
defaults are `DEFAULT_COUNT - 1` cut points evenly spaced in depth, counted in weight layers (convolutions and
linear layers run so far), then what the classifier reads (`<head>.input`: the pooled pre-logits, which timm
calls `forward_head(pre_logits=True)` and torchvision's `fc`/`classifier` reads). Works for any classifier
built from modules, numbered blocks or not (torchvision's inception_v3, timm's regnety_002).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, replace

import torch
from torch import nn

from featstore.errors import FeatstoreError, Name, Step
from featstore.nets.anchors import DEFAULT_ANCHORS, INPUT_SUFFIX, check_anchor_names, preset_for
from featstore.nets.extraction import is_channels_last, noisy_pair
from featstore.schema import comma_list

DEFAULT_COUNT = 12


@dataclass(frozen=True)
class Place:
    """A module output met while tracing: its name, its autograd node, the weight layers finished when it
    was produced, and its pooled readouts (to spot a copy of what the head reads)."""

    name: str
    node: object
    depth: int
    shape: tuple[int, ...]
    readouts: tuple[torch.Tensor, ...]  # of the first image
    constant: bool  # its readout is the same for two different images
    readable: bool  # a map, tokens or a vector per image (not a window partition or a flattened batch)


def anchor_names_for(arch: str, library: str, model: nn.Module, anchors: str | None, sample: torch.Tensor,
                     token_pool: str = "cls") -> list[str]:
    """The user's --anchors, else the preset for this model, else the traced defaults (one forward on `sample`).
    `default` in the user's list stands for those defaults (`input,default`: the input image, then the defaults)."""
    def defaults() -> list[str]:
        return preset_for(library, arch) or default_anchor_names(model, sample, token_pool)

    if not anchors:
        return check_anchor_names(defaults())
    names: list[str] = []
    for name in comma_list(anchors):
        names += defaults() if name == DEFAULT_ANCHORS else [name]
    return check_anchor_names(names)


def default_anchor_names(model: nn.Module, sample: torch.Tensor, token_pool: str = "cls",
                         count: int = DEFAULT_COUNT) -> list[str]:
    """`count - 1` cut points evenly spaced in weight-layer depth, then `<head>.input`. Left out: places whose
    pooled value (under `token_pool`) does not depend on the image or repeats what the head reads."""
    places, head, head_input = trace_places(model, sample, token_pool)
    places = [p for p in places if p.depth > 0 and not p.constant and not _same_readout(p, head_input)]
    if token_pool == "cls":  # the CLS token exists only where the head's token count is (not in CaiT's early
        tokens = [p.shape[1] for p in places if len(p.shape) == 3]  # blocks, nor before a ViT prepends it)
        places = [p for p in places if len(p.shape) != 3 or p.shape[1] == tokens[-1]]
    by_depth: dict[int, list[Place]] = defaultdict(list)
    for p in places:
        by_depth[p.depth].append(p)
    # several places after one weight layer (conv, norm, activation, pooling, a reshape): the last one of the
    # layer's own shape is that layer's output
    layers = [[p for p in group if p.shape == group[0].shape][-1] for group in by_depth.values()]
    chosen = _spread(layers, count - 1)
    if not chosen:
        raise FeatstoreError("found no module output that the whole forward passes through before the head; "
                             "pass ", Name("anchors", "a,b,c"), " (", Step("fs.anchors(model, every=True)", "anchors"),
                             " lists the names)")
    return [p.name for p in chosen] + [head + INPUT_SUFFIX]


def _spread(places: list[Place], n: int) -> list[Place]:
    """`n` places nearest to evenly spaced depths from the first to the last, in order, none twice."""
    if len(places) <= n:
        return places
    depths = [p.depth for p in places]
    lo, hi = depths[0], depths[-1]
    picked, start = [], 0
    for i in range(n):
        target = lo + (hi - lo) * i / (n - 1)
        last_allowed = len(places) - (n - i)
        j = min(range(start, last_allowed + 1), key=lambda k: (abs(depths[k] - target), k))
        picked.append(places[j])
        start = j + 1
    return picked


def trace_places(model: nn.Module, sample: torch.Tensor, token_pool: str = "cls") -> tuple[list[Place], str, Place]:
    """The cut points of one forward, in data-flow order, before the head; the head (the last module with
    parameters to run) and what enters it. The forward runs `sample` and a noisy copy of it, so that a place
    whose readout is the same for both can be told apart."""
    calls: Counter[str] = Counter()
    outputs: list[Place] = []
    weight_layers = 0
    last_start: list[tuple[str, Place]] = []

    def on_start(name: str, module: nn.Module):
        def hook(_m, inputs):
            if any(True for _ in module.parameters(recurse=False)):
                t = inputs[0] if isinstance(inputs, tuple) and inputs else inputs
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    last_start[:] = [(name, _place(name, t, weight_layers, token_pool))]
        return hook

    def on_end(name: str, weighted: bool):
        def hook(_m, _inputs, output):
            nonlocal weight_layers
            calls[name] += 1
            weight_layers += weighted
            t = output[0] if isinstance(output, (tuple, list)) and output else output
            if isinstance(t, torch.Tensor) and t.grad_fn is not None and t.is_floating_point():
                outputs.append(_place(name, t, weight_layers, token_pool))  # now: later in-place ops change t
        return hook

    handles = []
    for name, module in model.named_modules():
        if not name:
            continue
        weight = getattr(module, "weight", None)
        weighted = isinstance(weight, torch.Tensor) and weight.ndim >= 2  # convolutions, linear layers
        handles.append(module.register_forward_pre_hook(on_start(name, module)))
        handles.append(module.register_forward_hook(on_end(name, weighted)))
    leaf = torch.zeros_like(sample[:1], requires_grad=True)
    try:
        with torch.inference_mode(False), torch.enable_grad():
            image = noisy_pair(sample) + leaf  # the input's own node: every path from the logits ends here
            logits = model(image)
            logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    except RuntimeError as e:
        raise FeatstoreError(f"cannot trace this model to choose its default anchors ({str(e)[:120]}); pass ",
                             Name("anchors", "a,b,c")) from e
    finally:
        for h in handles:
            h.remove()
    if not last_start or not isinstance(logits, torch.Tensor) or logits.grad_fn is None:
        raise FeatstoreError("cannot find this model's head (its output does not come from a module with "
                             "parameters); pass ", Name("anchors", "a,b,c"))
    head, head_input = last_start[0]
    chain = dominator_chain(logits.grad_fn, image.grad_fn)
    position = {node: i for i, node in enumerate(chain)}
    end = position.get(head_input.node, len(chain))
    cuts = [p for p in outputs if position.get(p.node, end) < end and p.name != head
            and not p.name.startswith(head + ".")]
    depth_inside: dict[str, set[int]] = defaultdict(set)  # module -> depths of the cut points inside it
    for p in cuts:
        parts = p.name.split(".")
        for i in range(1, len(parts)):
            depth_inside[".".join(parts[:i])].add(p.depth)
    by_node: dict = {}
    for p in cuts:
        # one place per node, named by the outermost module that returns it and holds no other layer's places
        # (ResNet's `layer1.1`, not `layer1`; torchvision's `features.0`, not its conv, norm or activation)
        if calls[p.name] == 1 and depth_inside.get(p.name, {p.depth}) <= {p.depth}:
            best = by_node.get(p.node)
            if best is None or p.name.count(".") < best.name.count("."):
                by_node[p.node] = p
    places = sorted(by_node.values(), key=lambda p: position[p.node])
    return [p for p in places if p.readable], head, replace(head_input, name=head + INPUT_SUFFIX)


def _place(name: str, t: torch.Tensor, depth: int, token_pool: str) -> Place:
    """What a place is, read the moment it is produced (a later in-place op changes the tensor): its pooled
    readouts of the first image, and whether its readout under `token_pool` is the same for both images."""
    shape, node = tuple(t.shape), t.grad_fn
    channels_last = is_channels_last(shape)
    readable = shape[0] == 2 and (len(shape) in (2, 3) or (len(shape) == 4 and (shape[2] == shape[3]
                                                                               or channels_last)))
    if not readable:  # window partitions, flattened batches: not an image-level map, tokens or vector
        return Place(name, node, depth, shape, (), False, False)
    t = t.detach()
    if t.ndim == 4:
        pooled = [t.mean(dim=(1, 2) if channels_last else (2, 3))]
        used = pooled[0]
    elif t.ndim == 3:
        pooled = [t[:, 0], t.mean(dim=1)]
        used = pooled[0] if token_pool == "cls" else pooled[1]
    else:
        pooled = [t]
        used = t
    # relative: random-init nets shrink activations to 1e-9 and less at depth
    constant = float((used[0] - used[1]).abs().max()) <= 1e-5 * float(used.abs().max())
    return Place(name, node, depth, shape, tuple(r[:1].clone() for r in pooled), constant, True)


def dominator_chain(root, target) -> list:
    """The autograd nodes that every path from `root` (the logits) to `target` (the input) passes through,
    nearest the input first: the dominators of `target` (Cooper, Harvey and Kennedy's iterative algorithm)."""
    post: list = []
    preds: dict = defaultdict(list)
    seen = {root}
    stack = [(root, iter(_next(root)))]
    while stack:
        node, children = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            post.append(node)
            continue
        preds[child].append(node)
        if child not in seen:
            seen.add(child)
            stack.append((child, iter(_next(child))))
    if target not in seen:
        return []
    number = {node: i for i, node in enumerate(post)}
    idom = {root: root}

    def meet(a, b):
        while a is not b:
            while number[a] < number[b]:
                a = idom[a]
            while number[b] < number[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for node in reversed(post[:-1]):  # reverse postorder, root excluded
            done = [p for p in preds[node] if p in idom]
            new = done[0]
            for p in done[1:]:
                new = meet(p, new)
            if idom.get(node) is not new:
                idom[node] = new
                changed = True
    chain, node = [], target
    while node is not root:
        node = idom[node]
        chain.append(node)
    return chain


def _next(node) -> list:
    return [n for n, _ in node.next_functions if n is not None]


def _same_readout(p: Place, head_input: Place) -> bool:
    """`p` pooled is what the head reads (ResNet's last block under average pooling, a ViT's final norm under
    its CLS token): an anchor there would duplicate `<head>.input`."""
    target = head_input.readouts[0]
    tol = 1e-6 * float(target.abs().max()) + 1e-12
    return any(r.shape == target.shape and float((r - target).abs().max()) <= tol for r in p.readouts)
