"""The first EAP-IG implementation, kept only as the reference that the batched one must equal (tests) and beat
(bench/circuits.py): every slot input re-sums all upstream node outputs, heads run one at a time, and each
slot gets a zero "delta" input whose gradient is the slot's gradient."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from featstore.compute.attribution import KINDS, ViTGraph, kl_clean_patched


def _slots(graph: ViTGraph) -> list[tuple[int, str]]:
    out = []
    for layer in range(graph.layers):
        out += [(graph.head_index[layer, h], kind) for h in range(graph.heads) for kind in KINDS]
        out.append((graph.mlp_index[layer], "mlp"))
    out.append((graph.logits_index, "logits"))
    return out


def reference_forward(graph: ViTGraph, x0: torch.Tensor, deltas: dict | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    outputs: list[torch.Tensor] = [x0]

    def slot_input(dst: int, kind: str) -> torch.Tensor:
        x = torch.stack(outputs).sum(dim=0) if len(outputs) > 1 else outputs[0]
        if deltas is not None and (dst, kind) in deltas:
            x = x + deltas[dst, kind]
        return x

    for layer, blk in enumerate(graph.model.blocks):
        attn = blk.attn
        hd = attn.head_dim
        w_q, w_k, w_v = attn.qkv.weight.chunk(3, dim=0)
        b_q, b_k, b_v = (attn.qkv.bias.chunk(3) if attn.qkv.bias is not None else (None, None, None))
        head_outputs = []
        for h in range(graph.heads):
            node = graph.head_index[layer, h]
            sl = slice(h * hd, (h + 1) * hd)
            lin = torch.nn.functional.linear
            q = lin(blk.norm1(slot_input(node, "q")), w_q[sl], None if b_q is None else b_q[sl])
            k = lin(blk.norm1(slot_input(node, "k")), w_k[sl], None if b_k is None else b_k[sl])
            v = lin(blk.norm1(slot_input(node, "v")), w_v[sl], None if b_v is None else b_v[sl])
            q, k = attn.q_norm(q), attn.k_norm(k)
            mixed = torch.softmax((q * attn.scale) @ k.transpose(-2, -1), dim=-1) @ v
            out = mixed @ attn.proj.weight[:, sl].T
            if attn.proj.bias is not None:
                out = out + attn.proj.bias / graph.heads
            head_outputs.append(blk.ls1(out))
        outputs.extend(head_outputs)
        outputs.append(blk.ls2(blk.mlp(blk.norm2(slot_input(graph.mlp_index[layer], "mlp")))))
    final = slot_input(graph.logits_index, "logits")
    m = graph.model
    return m.forward_head(m.norm(final)), torch.stack(outputs)


def reference_eap_ig_scores(graph: ViTGraph, batches: Iterator[torch.Tensor], means: torch.Tensor,
                            steps: int = 5) -> torch.Tensor:
    slots = _slots(graph)
    slot_of = {s: i for i, s in enumerate(slots)}
    scores = torch.zeros(len(graph.edges), dtype=torch.float64, device=means.device)
    positions = 0
    src = torch.tensor([e.src for e in graph.edges], device=means.device)
    dst_slot = torch.tensor([slot_of[e.dst, e.kind] for e in graph.edges], device=means.device)
    for images in batches:
        with torch.no_grad():
            clean_x0 = graph.embed(images)
            clean_logits, clean_out = reference_forward(graph, clean_x0)
        grads = torch.zeros((len(slots), *clean_x0.shape), device=clean_x0.device, dtype=clean_x0.dtype)
        for j in range(steps):
            alpha = j / steps
            x0 = means[0].unsqueeze(0) + alpha * (clean_x0 - means[0].unsqueeze(0))
            deltas = {s: torch.zeros_like(clean_x0, requires_grad=True) for s in slots}
            logits, _ = reference_forward(graph, x0, deltas)
            loss = kl_clean_patched(clean_logits, logits).sum()
            step_grads = torch.autograd.grad(loss, [deltas[s] for s in slots])
            for i, g in enumerate(step_grads):
                grads[i] += g
            del step_grads, deltas
        grads /= steps
        diff = (means.unsqueeze(1) - clean_out).flatten(1)
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
