"""Edge-level circuits of timm Vision Transformers by EAP-IG (docs/design.md §8).

The model is rewritten as a graph: nodes are the input embedding, every attention head (its contribution after
the output projection and LayerScale, with the projection bias shared equally among heads), every MLP and the
logits; every node reads the sum of the outputs of the nodes upstream of it, and each head reads that sum
three times, once each for its q, k and v. An edge u -> v is one term of such a sum, so patching an edge
replaces u's output by its mean (over the image set, per position) in v's input only.

EAP-IG scores an edge by (z'_u - z_u) . (1/m) sum_j dL/d in_v, with the gradient taken at the input embedding
interpolated from its mean to the clean one (left Riemann sum, m steps) and L = KL(clean || patched) averaged
over classes. No labels are used anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from featstore.errors import FeatstoreError

KINDS = ("q", "k", "v")


@dataclass(frozen=True)
class Node:
    name: str  # input | a<block>.h<head> | m<block> | logits
    layer: int  # block index; -1 for the input embedding, L for the logits


@dataclass(frozen=True)
class Edge:
    src: int  # index into ViTGraph.nodes
    dst: int
    kind: str  # q | k | v | mlp | logits


class ViTGraph:
    """The node/edge structure of a timm VisionTransformer and a forward pass over it."""

    def __init__(self, model: nn.Module):
        blocks = getattr(model, "blocks", None)
        if blocks is None or not all(hasattr(b, "attn") and hasattr(b.attn, "qkv") for b in blocks):
            raise FeatstoreError("circuits need a timm VisionTransformer (blocks with attn.qkv, mlp)")
        if getattr(model, "global_pool", "token") not in ("token", "avg"):
            raise FeatstoreError(f"circuits support global_pool token or avg, not {model.global_pool!r}")
        self.model = model.eval()
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

    def _upstream_of_block(self, layer: int) -> list[int]:
        return list(range(0, self.head_index[layer, 0]))

    # one "input slot" per (destination node, kind): the sums that gradients are taken with respect to
    def slots(self) -> list[tuple[int, str]]:
        out = []
        for layer in range(self.layers):
            out += [(self.head_index[layer, h], kind) for h in range(self.heads) for kind in KINDS]
            out.append((self.mlp_index[layer], "mlp"))
        out.append((self.logits_index, "logits"))
        return out

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        m = self.model
        return m.norm_pre(m.patch_drop(m._pos_embed(m.patch_embed(images))))

    def forward(self, x0: torch.Tensor, means: torch.Tensor | None = None, patched: torch.Tensor | None = None,
                deltas: dict[tuple[int, str], torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, C] and every node's output [nodes-1, B, N, D] (the logits node excluded).

        `patched` [E] bool marks edges whose source sends its mean (`means` [nodes-1, N, D]) instead of its
        output; `deltas` adds a tensor to a slot's input, so that d(loss)/d(delta) = d(loss)/d(input)."""
        outputs: list[torch.Tensor] = [x0]
        offsets = self._patch_offsets(means, patched, x0) if patched is not None else {}

        def slot_input(dst: int, kind: str) -> torch.Tensor:
            x = torch.stack(outputs).sum(dim=0) if len(outputs) > 1 else outputs[0]
            extra = offsets.get((dst, kind))
            if extra is not None:
                x = x + extra(outputs)
            if deltas is not None and (dst, kind) in deltas:
                x = x + deltas[dst, kind]
            return x

        for layer, blk in enumerate(self.model.blocks):
            attn = blk.attn
            hd = attn.head_dim
            w_q, w_k, w_v = attn.qkv.weight.chunk(3, dim=0)
            b_q, b_k, b_v = (attn.qkv.bias.chunk(3) if attn.qkv.bias is not None else (None, None, None))
            head_outputs = []
            for h in range(self.heads):
                node = self.head_index[layer, h]
                sl = slice(h * hd, (h + 1) * hd)
                q = _linear(blk.norm1(slot_input(node, "q")), w_q[sl], None if b_q is None else b_q[sl])
                k = _linear(blk.norm1(slot_input(node, "k")), w_k[sl], None if b_k is None else b_k[sl])
                v = _linear(blk.norm1(slot_input(node, "v")), w_v[sl], None if b_v is None else b_v[sl])
                q, k = attn.q_norm(q), attn.k_norm(k)
                mixed = torch.softmax((q * attn.scale) @ k.transpose(-2, -1), dim=-1) @ v
                out = mixed @ attn.proj.weight[:, sl].T
                if attn.proj.bias is not None:
                    out = out + attn.proj.bias / self.heads
                head_outputs.append(blk.ls1(out))
            outputs.extend(head_outputs)
            outputs.append(blk.ls2(blk.mlp(blk.norm2(slot_input(self.mlp_index[layer], "mlp")))))
        final = slot_input(self.logits_index, "logits")
        m = self.model
        logits = m.forward_head(m.norm(final))
        return logits, torch.stack(outputs)

    def _patch_offsets(self, means, patched, x0):
        """Per slot, a function adding sum over patched edges of (mean_u - current z_u)."""
        if means is None:
            raise ValueError("patching needs the node means")
        by_slot: dict[tuple[int, str], list[int]] = {}
        for e, edge in enumerate(self.edges):
            if bool(patched[e]):
                by_slot.setdefault((edge.dst, edge.kind), []).append(edge.src)

        def offset(sources):
            return lambda outputs: sum(means[u].unsqueeze(0) - outputs[u] for u in sources)

        return {slot: offset(src) for slot, src in by_slot.items()}


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


def kl_clean_patched(clean_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(clean || patched) per image, averaged over classes (docs/design.md §8)."""
    p = torch.log_softmax(clean_logits, dim=-1)
    q = torch.log_softmax(logits, dim=-1)
    return (p.exp() * (p - q)).mean(dim=-1)


def node_means(graph: ViTGraph, batches: Iterator[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position mean of every node's output (the mean-ablation values) and of the input embedding."""
    total, count = None, 0
    with torch.no_grad():
        for images in batches:
            _, outputs = graph.forward(graph.embed(images))
            total = outputs.sum(dim=1) if total is None else total + outputs.sum(dim=1)
            count += images.shape[0]
    means = total / count
    return means, means[0]


def eap_ig_scores(graph: ViTGraph, batches: Iterator[torch.Tensor], means: torch.Tensor, steps: int = 5
                  ) -> torch.Tensor:
    """EAP-IG score of every edge (in `graph.edges` order), averaged over images and positions."""
    slots = graph.slots()
    slot_of = {s: i for i, s in enumerate(slots)}
    scores = torch.zeros(len(graph.edges), dtype=torch.float64, device=means.device)
    positions = 0
    src = torch.tensor([e.src for e in graph.edges], device=means.device)
    dst_slot = torch.tensor([slot_of[e.dst, e.kind] for e in graph.edges], device=means.device)
    for images in batches:
        with torch.no_grad():
            clean_x0 = graph.embed(images)
            clean_logits, clean_out = graph.forward(clean_x0)
        grads = torch.zeros((len(slots), *clean_x0.shape), device=clean_x0.device)
        for j in range(steps):
            alpha = j / steps
            x0 = means[0].unsqueeze(0) + alpha * (clean_x0 - means[0].unsqueeze(0))
            deltas = {s: torch.zeros_like(clean_x0, requires_grad=True) for s in slots}
            logits, _ = graph.forward(x0, deltas=deltas)
            loss = kl_clean_patched(clean_logits, logits).sum()
            step_grads = torch.autograd.grad(loss, [deltas[s] for s in slots])
            for i, g in enumerate(step_grads):  # in place: no stacked copy of every slot's gradient
                grads[i] += g
            del step_grads, deltas
        grads /= steps
        diff = (means.unsqueeze(1) - clean_out).flatten(1)  # z'_u - z_u  [nodes-1, B*N*D]
        # per edge: sum over images, positions and width of diff[src] * grad[dst slot]; float32 products,
        # slot by slot, so no float64 copy of the gradients is made
        per_pair = torch.stack([(diff @ grads[i].flatten()).double() for i in range(len(slots))], dim=1)
        scores += per_pair[src, dst_slot]
        positions += clean_x0.shape[0] * clean_x0.shape[1]
    return scores / positions


def patched_kl(graph: ViTGraph, images: torch.Tensor, means: torch.Tensor, patched: torch.Tensor) -> torch.Tensor:
    """Mean KL(clean || patched) when the edges marked in `patched` carry their source's mean."""
    with torch.no_grad():
        x0 = graph.embed(images)
        clean, _ = graph.forward(x0)
        logits, _ = graph.forward(x0, means, patched)
        return kl_clean_patched(clean, logits).mean()


def edge_count(layers: int, heads: int) -> int:
    """The graph of docs/design.md §8: per block 3H head inputs and one MLP input read every upstream node;
    logits read all."""
    upstream = [1 + layer * (heads + 1) for layer in range(layers)]
    return sum(3 * heads * u + u + heads for u in upstream) + 1 + layers * (heads + 1)


@dataclass
class CircuitConfig:
    """Everything `featstore circuits` takes; the CLI only fills this in."""

    model: str
    data: str
    db: str
    view: str = "clean"
    labels: str | None = None
    weights: str = "default"
    image_size: int | None = None
    ig_steps: int = 5
    limit: int | None = 500
    batch_size: int = 32
    device: str = "auto"
    workers: int | None = None
    seed: int = 0
    progress: bool = True


@dataclass
class CircuitResult:
    """One circuit run as data: its `circuit_runs` row, the edges (src, dst, src_layer, dst_layer) in the
    graph's fixed order, and their scores. `featstore.analytics.circuits` persists it."""

    run: dict
    edges: list[tuple[str, str, int, int]]
    scores: np.ndarray


def compute_circuit(cfg: CircuitConfig) -> CircuitResult:
    """Mean activations over the image set, then EAP-IG edge scores; nothing is written."""
    from featstore.datasets import ViewDataset, discover
    from featstore.loading import iterate_batches
    from featstore.models import load_model
    from featstore.runtime import resolve_device, tune_allocator
    from featstore.views import parse_view

    tune_allocator()
    if cfg.ig_steps < 1:
        raise FeatstoreError("--ig-steps must be at least 1")
    device = resolve_device(cfg.device)
    view = parse_view(cfg.view)
    images = discover(cfg.data, cfg.labels, cfg.limit, cfg.seed)
    loaded = load_model(cfg.model, cfg.weights, cfg.seed, cfg.image_size)
    graph = ViTGraph(loaded.module.to(device))
    dataset = ViewDataset(images, loaded.preprocessing, [view])
    plan = [list(range(i, min(len(images), i + cfg.batch_size))) for i in range(0, len(images), cfg.batch_size)]

    def batches(label: str):
        stream = iterate_batches(dataset, plan, device, cfg.workers)
        if cfg.progress:
            from tqdm import tqdm

            stream = tqdm(stream, total=len(plan), desc=label, unit="batch", leave=False)
        for rows, (x,), errors in stream:
            bad = [images.paths[rows[i]] for i, e in enumerate(errors) if e is not None]
            if bad:
                raise FeatstoreError(f"cannot decode image {images.root / bad[0]}; remove or replace it")
            yield loaded.preprocessing.normalize(x.to(device))

    means, _ = node_means(graph, batches("means"))
    scores = eap_ig_scores(graph, batches(f"EAP-IG m={cfg.ig_steps}"), means, cfg.ig_steps)
    key = cfg.model.replace("/", "_")
    names = [(graph.nodes[e.src].name, graph.nodes[e.dst].name + ("" if e.kind in ("mlp", "logits")
                                                                  else f".{e.kind}"),
              graph.nodes[e.src].layer, graph.nodes[e.dst].layer) for e in graph.edges]
    run = {"run_id": f"{key}/{view.name}/eap-ig{cfg.ig_steps}", "model": key, "view": view.name,
           "layers": graph.layers, "heads": graph.heads, "ig_steps": cfg.ig_steps, "n_images": len(images),
           "params": {"weights_id": loaded.weights_id, "source": images.source, "limit": cfg.limit,
                      "preprocessing": loaded.preprocessing.to_dict(), "seed": cfg.seed}}
    return CircuitResult(run, names, scores.cpu().numpy())
