"""Edge-level circuits of timm Vision Transformers by EAP-IG (docs/design.md §8).

The model is rewritten as a graph: nodes are the input embedding, every attention head (its contribution after
the output projection and LayerScale, with the projection bias shared equally among heads), every MLP and the
logits; every node reads the sum of the outputs of the nodes upstream of it, and each head reads that sum
three times, once each for its q, k and v. An edge u -> v is one term of such a sum, so patching an edge
replaces u's output by its mean (over the image set, per position) in v's input only.

EAP-IG scores an edge by (z'_u - z_u) . (1/m) sum_j dL/d in_v, with the gradient taken at the input embedding
interpolated from its mean to the clean one (left Riemann sum, m steps) and L = KL(clean || patched) averaged
over classes. No labels are used anywhere.

How it is computed. The sum every input reads is the residual stream, kept as a running sum (block input +
heads + MLP); a patched edge adds (mean_u - z_u) to the one input it feeds. One backward of the plain forward
per IG step gives every input's gradient: a head's q (k, v) input feeds only that head's q (k, v) projection,
so its gradient is the norm's vector-Jacobian product of the projection's gradient restricted to that head
(all 3H of a block in one batched product); an MLP input's gradient is the norm2 product of the gradient at
norm2's output; the logits input's is the gradient at the final residual. Because all of this is exact only
for the block structure it mirrors, every run first checks that the rewrite reproduces `model(x)`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
from featstore.errors import FeatstoreError
from featstore.records import CircuitRun, RunIdentity
from featstore.schema import DEVICE, IG_STEPS, VIEW, check_fields

try:  # timm's LayerNorm subclass only changes how it is called, not what it computes
    from timm.layers import LayerNorm as _TimmLayerNorm
except ImportError:  # pragma: no cover
    _TimmLayerNorm = nn.LayerNorm

KINDS = ("q", "k", "v")
# the self-check's bound: max |rewritten logits - model(x)| <= SELF_CHECK_TOLERANCE * max(1, max |model(x)|)
SELF_CHECK_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Node:
    name: str  # input | a<block>.h<head> | m<block> | logits
    layer: int  # block index; -1 for the input embedding, L for the logits


@dataclass(frozen=True)
class Edge:
    src: int  # index into ViTGraph.nodes
    dst: int
    kind: str  # q | k | v | mlp | logits


@dataclass(frozen=True)
class SlotGradient:
    """Gradients of consecutive slots (`first`, `first + len(grad)`) that read the first `upstream` nodes."""

    first: int
    upstream: int
    grad: torch.Tensor  # [slots, B, N, D]


def _check_structure(model: nn.Module, name: str) -> None:
    """Refuse models whose blocks the rewrite does not mirror, before anything runs."""
    from timm.layers import Attention
    from timm.models.vision_transformer import Block

    blocks = getattr(model, "blocks", None)
    if blocks is None or len(blocks) == 0 or not all(hasattr(b, "attn") for b in blocks):
        raise FeatstoreError(f"circuits need a timm VisionTransformer (blocks with attn.qkv, mlp); {name} is a "
                             f"{type(model).__name__}")
    for i, blk in enumerate(blocks):
        if type(blk).forward is not Block.forward:
            raise FeatstoreError(f"circuits cannot rewrite {name}: unsupported block type {type(blk).__name__} "
                                 f"(blocks.{i}); only timm's pre-norm Block is mirrored")
        if type(blk.attn).forward is not Attention.forward:
            raise FeatstoreError(f"circuits cannot rewrite {name}: unsupported attention type "
                                 f"{type(blk.attn).__name__} (blocks.{i}.attn); only timm's Attention is mirrored")


# submodules of a Block the rewrite applies; any other non-trivial one is a part it would silently skip
_MIRRORED = {"norm1", "attn", "attn.qkv", "attn.q_norm", "attn.k_norm", "attn.attn_drop", "attn.proj",
             "attn.proj_drop", "ls1", "drop_path1", "norm2", "mlp", "ls2", "drop_path2"}


def _skipped_parts(block: nn.Module) -> list[str]:
    names = []
    for path, module in block.named_modules():
        if not path or path in _MIRRORED or path.split(".")[0] == "mlp":
            continue
        if not isinstance(module, nn.Identity | nn.Dropout):
            names.append(f"{path} ({type(module).__name__})")
    return names


class ViTGraph:
    """The node/edge structure of a timm VisionTransformer and a forward pass over it."""

    def __init__(self, model: nn.Module, name: str = "model"):
        _check_structure(model, name)
        self.name = name
        self.model = model.eval()
        blocks = model.blocks
        self.layers = len(blocks)
        self.heads = blocks[0].attn.num_heads
        nodes = [Node("input", -1)]
        self.head_index: dict[tuple[int, int], int] = {}
        self.mlp_index: dict[int, int] = {}
        for layer in range(self.layers):
            for h in range(self.heads):
                self.head_index[layer, h] = len(nodes)
                nodes.append(Node(f"a{layer}.h{h}", layer))
            self.mlp_index[layer] = len(nodes)
            nodes.append(Node(f"m{layer}", layer))
        self.logits_index = len(nodes)
        nodes.append(Node("logits", self.layers))
        self.nodes = nodes
        edges: list[Edge] = []
        for layer in range(self.layers):
            upstream = self._upstream_of_block(layer)
            for h in range(self.heads):
                for kind in KINDS:
                    edges += [Edge(u, self.head_index[layer, h], kind) for u in upstream]
            edges += [Edge(u, self.mlp_index[layer], "mlp")
                      for u in upstream + [self.head_index[layer, h] for h in range(self.heads)]]
        edges += [Edge(u, self.logits_index, "logits") for u in range(self.logits_index)]
        self.edges = edges
        slot_of = {s: i for i, s in enumerate(self.slots())}
        self.edge_src = torch.tensor([e.src for e in edges])
        self.edge_slot = torch.tensor([slot_of[e.dst, e.kind] for e in edges])

    def _upstream_of_block(self, layer: int) -> list[int]:
        return list(range(0, self.head_index[layer, 0]))

    def slots(self) -> list[tuple[int, str]]:
        """One input ("slot") per (destination node, kind), per block the 3H head inputs kind-major (all q, then
        all k, then all v), then the MLP input; the logits input last."""
        out = []
        for layer in range(self.layers):
            out += [(self.head_index[layer, h], kind) for kind in KINDS for h in range(self.heads)]
            out.append((self.mlp_index[layer], "mlp"))
        out.append((self.logits_index, "logits"))
        return out

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        m = self.model
        return m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(images))))

    def forward(self, x0: torch.Tensor, means: torch.Tensor | None = None, patched: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, C] and every node's output [nodes-1, B, N, D] (the logits node excluded).

        `patched` [E] bool marks edges whose source sends its mean (`means` [nodes-1, N, D]) instead of its
        output: each slot with a patched edge reads the running sum plus sum over its patched sources of
        (mean_u - z_u); slots without one read the running sum as it is."""
        rows = self._patch_rows(means, patched) if patched is not None else None
        outputs = x0.new_empty((self.logits_index, *x0.shape))
        outputs[0] = x0
        resid = x0
        per_block = 3 * self.heads + 1
        for layer, blk in enumerate(self.model.blocks):
            first, base = self.head_index[layer, 0], layer * per_block
            head_rows = None if rows is None else rows[base : base + 3 * self.heads, :first]
            if head_rows is None or not head_rows.any():
                q, k, v = self._qkv(blk, blk.norm1(resid))
            else:
                shifted = resid + torch.einsum("su,ubnd->sbnd", head_rows, means[:first, None] - outputs[:first])
                q, k, v = self._qkv_per_slot(blk, blk.norm1(shifted))
            heads = self._head_outputs(blk, q, k, v)
            outputs[first : first + self.heads] = heads
            resid = resid + heads.sum(dim=0)
            mlp = self.mlp_index[layer]
            x = resid if rows is None else resid + self._offset(rows[base + 3 * self.heads, :mlp], means, outputs)
            outputs[mlp] = blk.ls2(blk.mlp(blk.norm2(x)))
            resid = resid + outputs[mlp]
        final = resid if rows is None else resid + self._offset(rows[-1], means, outputs)
        return self.model.forward_head(self.model.norm(final)), outputs

    def _patch_rows(self, means: torch.Tensor | None, patched: torch.Tensor) -> torch.Tensor:
        """[slots, nodes-1]: 1 where the edge from node u into a slot is patched."""
        if means is None:
            raise ValueError("patching needs the node means")
        rows = torch.zeros(len(self.slots()), self.logits_index, device=means.device, dtype=means.dtype)
        on = patched.to(torch.bool).cpu()
        rows[self.edge_slot[on].to(means.device), self.edge_src[on].to(means.device)] = 1
        return rows

    @staticmethod
    def _offset(row: torch.Tensor, means: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor | float:
        sources = row.nonzero().flatten()
        if len(sources) == 0:
            return 0.0
        return (means[sources].unsqueeze(1) - outputs[sources]).sum(dim=0)

    def _qkv(self, blk: nn.Module, normed: torch.Tensor) -> torch.Tensor:
        """q, k, v [B, H, N, hd] from one normed input [B, N, D] (every slot reads the same sum)."""
        b, n, _ = normed.shape
        qkv = torch.nn.functional.linear(normed, blk.attn.qkv.weight, blk.attn.qkv.bias)
        return qkv.view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)

    def _qkv_per_slot(self, blk: nn.Module, normed: torch.Tensor) -> torch.Tensor:
        """q, k, v [B, H, N, hd] when each of the 3H slots reads its own normed input [3H, B, N, D]."""
        attn = blk.attn
        slots, b, n, d = normed.shape
        weight = attn.qkv.weight.view(slots, -1, d)
        out = torch.einsum("sbnd,sed->sbne", normed, weight)
        if attn.qkv.bias is not None:
            out = out + attn.qkv.bias.view(slots, 1, 1, -1)
        return out.view(3, self.heads, b, n, -1).transpose(1, 2)

    def _mix(self, attn: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """All heads' attention-weighted values [B, H, N, hd] in one batched computation."""
        q, k = attn.q_norm(q), attn.k_norm(k)
        return torch.softmax((q * attn.scale) @ k.transpose(-2, -1), dim=-1) @ v

    def _head_outputs(self, blk: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Every head's contribution to the residual stream [H, B, N, D] (projection bias split evenly)."""
        attn = blk.attn
        proj = attn.proj.weight.view(attn.proj.weight.shape[0], self.heads, -1)
        out = torch.einsum("bhne,dhe->hbnd", self._mix(attn, q, k, v), proj)
        if attn.proj.bias is not None:
            out = out + attn.proj.bias / self.heads
        return blk.ls1(out)

    def slot_gradients(self, x0: torch.Tensor, clean_logits: torch.Tensor) -> Iterator[SlotGradient]:
        """d KL(clean || model(x0)) / d input of every slot, from one backward through the plain forward."""
        model, heads = self.model, self.heads
        taps = []
        with torch.enable_grad():
            resid = x0.detach().requires_grad_()
            for blk in model.blocks:
                attn = blk.attn
                qkv = torch.nn.functional.linear(blk.norm1(resid), attn.qkv.weight, attn.qkv.bias)
                b, n, _ = qkv.shape
                q, k, v = qkv.view(b, n, 3, heads, -1).permute(2, 0, 3, 1, 4)
                mid = resid + blk.ls1(attn.proj(self._mix(attn, q, k, v).transpose(1, 2).reshape(b, n, -1)))
                normed2 = blk.norm2(mid)
                taps.append((resid, qkv, mid, normed2))
                resid = mid + blk.ls2(blk.mlp(normed2))
            loss = kl_clean_patched(clean_logits, model.forward_head(model.norm(resid))).sum()
            grads = torch.autograd.grad(loss, [t[1] for t in taps] + [t[3] for t in taps] + [resid])
        per_block = 3 * heads + 1
        for layer, (blk, (block_in, _, mid, _)) in enumerate(zip(model.blocks, taps, strict=True)):
            b, n, width = block_in.shape
            g = grads[layer].view(b, n, 3, heads, -1)
            weight = blk.attn.qkv.weight.view(3, heads, -1, width)
            first = self.head_index[layer, 0]
            pullback = _norm_pullback(blk.norm1, block_in.detach())
            for kind in range(3):  # the H heads' q (then k, v) slots: one projection, one batched norm product
                at_norm = torch.einsum("bnhe,hed->hbnd", g[:, :, kind], weight[kind])
                yield SlotGradient(layer * per_block + kind * heads, first, pullback(at_norm))
                del at_norm
            mlp_grad = _norm_pullback(blk.norm2, mid.detach())(grads[self.layers + layer].unsqueeze(0))
            yield SlotGradient(layer * per_block + 3 * heads, first + heads, mlp_grad)
        yield SlotGradient(self.layers * per_block, self.logits_index, grads[-1].unsqueeze(0))

    def self_check(self, images: torch.Tensor, tolerance: float = SELF_CHECK_TOLERANCE) -> float:
        """Run the rewrite with nothing patched beside `model(images)`; refuse the model, naming the part that
        the rewrite does not reproduce, when the logits differ by more than the stated tolerance.
        Returns the largest logit difference."""
        block_out: list[torch.Tensor] = []
        hooks = [blk.register_forward_hook(lambda _m, _i, out: block_out.append(out)) for blk in self.model.blocks]
        try:
            with torch.no_grad():
                expected = self.model(images)
                logits, outputs = self.forward(self.embed(images))
        finally:
            for hook in hooks:
                hook.remove()
        gap = float((logits - expected).abs().max())
        bound = tolerance * max(1.0, float(expected.abs().max()))
        if gap <= bound:
            return gap
        part = "the embedding or the head (norm, pooling, classifier)"
        for layer, blk in enumerate(self.model.blocks):
            rewritten = outputs[: self.mlp_index[layer] + 1].sum(dim=0)
            if (rewritten - block_out[layer]).abs().max() > tolerance * max(1.0, float(block_out[layer].abs().max())):
                skipped = _skipped_parts(blk)
                part = (f"blocks.{layer}." + f", blocks.{layer}.".join(skipped) if skipped
                        else f"blocks.{layer} (its forward differs from the head-by-head rewrite)")
                break
        raise FeatstoreError(f"circuits cannot rewrite {self.name}: unsupported part {part}; with nothing patched "
                             f"the rewritten forward differs from model(x) by {gap:.3g} in the logits (tolerance "
                             f"{bound:.2g}), so no scores were computed")


def _norm_pullback(norm: nn.Module, x: torch.Tensor):
    """A function taking grads [S, *x.shape] to their vector-Jacobian products through `norm` at x, S at once.
    LayerNorm uses its closed form, in place (the grads are consumed); other norms go through torch.func."""
    if type(norm) in (nn.LayerNorm, _TimmLayerNorm) and len(norm.normalized_shape) == 1:
        xhat, _, rstd = torch.native_layer_norm(x, norm.normalized_shape, None, None, norm.eps)

        def layer_norm_vjp(grads: torch.Tensor) -> torch.Tensor:
            g = grads.mul_(norm.weight) if norm.weight is not None else grads
            along_xhat = (g * xhat).mean(dim=-1, keepdim=True)
            g.sub_(g.mean(dim=-1, keepdim=True)).sub_(xhat * along_xhat)
            return g.mul_(rstd)

        return layer_norm_vjp
    _, vjp = torch.func.vjp(norm, x)
    return lambda grads: torch.vmap(vjp)(grads)[0]


def kl_clean_patched(clean_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(clean || patched) per image, averaged over classes (docs/design.md §8)."""
    p = torch.log_softmax(clean_logits, dim=-1)
    q = torch.log_softmax(logits, dim=-1)
    return (p.exp() * (p - q)).mean(dim=-1)


def node_means(graph: ViTGraph, batches: Iterator[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position mean of every node's output (the mean-ablation values) and the clean logits [images, C].
    The first batch runs the graph's self-check, so a model the rewrite does not reproduce stops here."""
    total, count, logits = None, 0, []
    with torch.no_grad():
        for images in batches:
            if count == 0:
                graph.self_check(images)
            clean, outputs = graph.forward(graph.embed(images))
            total = outputs.sum(dim=1) if total is None else total + outputs.sum(dim=1)
            count += images.shape[0]
            logits.append(clean)
    if count == 0:
        raise FeatstoreError("no images to compute circuit means over")
    return total / count, torch.cat(logits)


def eap_ig_scores(graph: ViTGraph, batches: Iterator[torch.Tensor], means: torch.Tensor, steps: int = 5,
                  steps_per_pass: int | None = None) -> torch.Tensor:
    """EAP-IG score of every edge (in `graph.edges` order), averaged over images and token positions.

    The IG steps of a batch run stacked along the batch, `steps_per_pass` of them (default: all m) per forward
    and backward; each slot's gradients are summed over the steps before the product with z'_u - z_u."""
    pair = torch.zeros(graph.logits_index, len(graph.slots()), dtype=torch.float64, device=means.device)
    per_pass = steps if steps_per_pass is None else max(1, min(steps, steps_per_pass))
    positions = 0
    for images in batches:
        with torch.no_grad():
            clean_x0 = graph.embed(images)
            clean_logits, clean_out = graph.forward(clean_x0)
            diff = clean_out.neg_().add_(means.unsqueeze(1)).flatten(1)  # z'_u - z_u in place [nodes-1, B*N*D]
            base = means[0].unsqueeze(0)
            for start in range(0, steps, per_pass):
                alphas = [j / steps for j in range(start, min(steps, start + per_pass))]
                x0 = torch.cat([base + alpha * (clean_x0 - base) for alpha in alphas])
                for part in graph.slot_gradients(x0, clean_logits.repeat(len(alphas), 1)):
                    summed = part.grad.view(len(part.grad), len(alphas), -1).sum(dim=1)  # over the steps
                    # per (source, slot): sum over images, positions and width of diff[source] * grad[slot]
                    block = diff[: part.upstream] @ summed.T
                    pair[: part.upstream, part.first : part.first + len(part.grad)] += block.double()
        positions += clean_x0.shape[0] * clean_x0.shape[1]
    src, slot = graph.edge_src.to(pair.device), graph.edge_slot.to(pair.device)
    return pair[src, slot] / (steps * positions)


CIRCUIT_LIMIT = 500  # images per circuit run when ImageSource.limit is not given: EAP-IG is costly
BATCH_SIZE = 32  # images per EAP-IG batch when RunOptions.batch_size is not given (memory grows with it)


@dataclass(frozen=True)
class CircuitConfig:
    """Everything `featstore circuits` takes; the CLI only fills this in. `name` keys the model in the run id
    (default: the model name; a zoo gives each checkpoint its own), `dataset` names the image set in it
    (default: the view's name). `run.seed` seeds the --limit subset and random init."""

    model: ModelSpec
    images: ImageSource
    view: str = VIEW
    ig_steps: int = IG_STEPS
    name: str | None = None
    dataset: str | None = None
    run: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self) -> None:
        check_fields(self, ("view", "ig_steps"))

    @property
    def source(self) -> ImageSource:
        """The image source with the circuits' default subset size."""
        return self.images if self.images.limit is not None else replace(self.images, limit=CIRCUIT_LIMIT)


@dataclass
class CircuitResult:
    """One circuit run as data: its `circuit_runs` row, the edges (src, dst, src_layer, dst_layer) in the
    graph's fixed order, their scores, and the model's own top-1 accuracy on the images (from its head, with
    the image set's labels). `featstore.workflows.circuits` persists it."""

    run: CircuitRun
    edges: list[tuple[str, str, int, int]]
    scores: np.ndarray
    accuracy: float


def load_graph(spec: ModelSpec, seed: int = 0, device: str = DEVICE, name: str | None = None):
    """The model, its preprocessing and its graph on the chosen device (structure checked, not yet run)."""
    from featstore.nets.models import load_model
    from featstore.runtime import resolve_device

    loaded = load_model(spec.model, spec.weights, seed, spec.image_size)
    graph = ViTGraph(loaded.module.to(resolve_device(device)), name or spec.model)
    return loaded, graph


def compute_circuit(cfg: CircuitConfig) -> CircuitResult:
    """Mean activations over the image set (the first batch checks the rewrite against the model), then
    EAP-IG edge scores; nothing is written."""
    from featstore.images.datasets import ViewDataset, labels_for_head
    from featstore.images.loading import iterate_batches
    from featstore.images.views import parse_view
    from featstore.runtime import tune_allocator
    from featstore.threads import ThreadPolicy

    tune_allocator()
    view = parse_view(cfg.view)
    key = (cfg.name or cfg.model.model).replace("/", "_")
    identity = RunIdentity.circuit(key, cfg.dataset or view.name, cfg.ig_steps)  # a name it cannot hold: refused now
    images = cfg.source.discover(cfg.run.seed)
    loaded, graph = load_graph(cfg.model, cfg.run.seed, cfg.run.device, cfg.name)
    images = labels_for_head(images, loaded.num_classes)  # the labels a build of this model would store
    device = next(graph.model.parameters()).device
    dataset = ViewDataset(images, loaded.preprocessing, [view])
    batch = cfg.run.batch(BATCH_SIZE)
    plan = [list(range(i, min(len(images), i + batch))) for i in range(0, len(images), batch)]

    def batches(label: str):
        stream = iterate_batches(dataset, plan, device, cfg.run.workers)
        if cfg.run.progress:
            from tqdm import tqdm

            stream = tqdm(stream, total=len(plan), desc=label, unit="batch", leave=False)
        for rows, (x,), errors in stream:
            bad = [images.paths[rows[i]] for i, e in enumerate(errors) if e is not None]
            if bad:
                raise FeatstoreError(f"cannot decode image {images.root / bad[0]}; remove or replace it")
            policy.update()  # a batch of images is the unit: the thread count is looked at again before each
            yield loaded.preprocessing.normalize(x.to(device))

    with ThreadPolicy(cfg.run.threads, device) as policy:
        means, logits = node_means(graph, batches("means"))
        accuracy = float((logits.argmax(dim=1).cpu().numpy() == images.labels).mean())
        scores = eap_ig_scores(graph, batches(f"EAP-IG m={cfg.ig_steps}"), means, cfg.ig_steps)
    names = [(graph.nodes[e.src].name, graph.nodes[e.dst].name + ("" if e.kind in ("mlp", "logits")
                                                                  else f".{e.kind}"),
              graph.nodes[e.src].layer, graph.nodes[e.dst].layer) for e in graph.edges]
    params = {"weights_id": loaded.weights_id, "arch": cfg.model.model, "source": images.source, "view": view.name,
              "limit": cfg.source.limit, "preprocessing": loaded.preprocessing.to_dict(), "seed": cfg.run.seed,
              "accuracy": accuracy, "threads": policy.recorded}
    run = CircuitRun(identity.run_id, key, identity.view, graph.layers, graph.heads, cfg.ig_steps, len(images),
                     len(names), params)
    return CircuitResult(run, names, scores.cpu().numpy(), accuracy)
