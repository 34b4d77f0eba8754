"""Benchmark EAP-IG: the batched implementation (featstore.compute.attribution) against the first one, slot by slot.

On the CPU: a small timm ViT at a small image size, random init (no download), one batch of random images
through `--ig-steps` IG steps with each implementation in its own subprocess, so that each one's peak memory
(resident set growth over the scoring, after the model and means are ready) is its own. Prints seconds,
images/s, peak memory, the speed ratio, and the largest score difference relative to the largest score.

    python bench/circuits.py [--model vit_small_patch16_224] [--image-size 64] [--batch-size 8] [--ig-steps 5]
                             [--threads 1]

One torch thread by default: on a shared, loaded CPU every op of a small model otherwise waits on its threads'
rendezvous, which swamps both implementations alike.

`device_measurement()` is the accelerator check: ViT-B/16 at batch 32, seconds per 64 images and peak GPU memory
of the batched implementation (a device-check script calls it where a GPU is lent).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import timm
import torch

from featstore.compute.attribution import ViTGraph, eap_ig_scores, node_means

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from eap_ig_reference import reference_eap_ig_scores  # noqa: E402  (the first implementation, as reference)


def _graph(model: str, image_size: int, device: str = "cpu") -> ViTGraph:
    torch.manual_seed(0)
    net = timm.create_model(model, pretrained=False, img_size=image_size).eval().requires_grad_(False)
    return ViTGraph(net.to(device), model)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def plain_forward_backward(graph: ViTGraph, images: torch.Tensor, means: torch.Tensor, steps: int) -> torch.Tensor:
    """The floor any EAP-IG pays: the model's clean forward, then one forward and a backward to its input over the
    m stacked IG inputs (no per-input gradients, no scores)."""
    model = graph.model
    with torch.no_grad():
        model(images)
        x = graph.embed(images).repeat(steps, 1, 1)
    x.requires_grad_()
    logits = model.forward_head(model.norm(model.blocks(x)))
    return torch.autograd.grad(logits.logsumexp(dim=-1).sum(), x)[0].sum().reshape(1)


def measure_one(impl: str, model: str, image_size: int, batch_size: int, steps: int, out: Path, threads: int
                ) -> dict:
    """Score one batch with `impl` (batched | reference | floor); scores saved to `out`, timing and memory
    returned."""
    torch.set_num_threads(threads)
    graph = _graph(model, image_size)
    images = torch.randn(batch_size, 3, image_size, image_size, generator=torch.Generator().manual_seed(1))
    means, _ = node_means(graph, iter([images]))
    score = {"batched": eap_ig_scores, "reference": reference_eap_ig_scores}.get(impl)
    if score is None:
        def score(graph, batches, means, steps):
            return plain_forward_backward(graph, next(batches), means, steps)
    before = _rss_mb()
    start = time.perf_counter()
    scores = score(graph, iter([images]), means, steps)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    np.save(out, scores.numpy())
    tokens = graph.embed(images[:1]).shape[1]
    return {"impl": impl, "seconds": seconds, "images_per_s": batch_size / seconds,
            "peak_growth_mb": max(0.0, peak - before), "nodes": graph.logits_index + 1, "edges": len(graph.edges),
            "tokens": tokens, "width": graph.model.embed_dim, "heads": graph.heads, "layers": graph.layers}


def device_measurement(batch_size: int = 32, n_images: int = 64, steps: int = 5, device: str = "cuda",
                       model: str = "vit_base_patch16_224") -> dict:
    """Batched EAP-IG of ViT-B/16 (random init) at 224 px on a GPU: seconds per 64 images (after one warm-up
    batch) and the peak GPU memory of the scoring, in GiB (None on the CPU, where this only dry-runs)."""
    cuda = device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    graph = _graph(model, 224, device)
    gen = torch.Generator(device=device).manual_seed(1)
    images = torch.randn(n_images, 3, 224, 224, generator=gen, device=device)
    batches = [images[i : i + batch_size] for i in range(0, n_images, batch_size)]
    means, _ = node_means(graph, iter(batches))
    eap_ig_scores(graph, iter(batches[:1]), means, 1)  # warm-up
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    scores = eap_ig_scores(graph, iter(batches), means, steps)
    sync()
    seconds = time.perf_counter() - start
    return {"model": model, "batch_size": batch_size, "ig_steps": steps, "images": n_images,
            "seconds_per_64_images": seconds * 64 / n_images,
            "peak_gpu_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
            "edges": len(graph.edges), "finite": bool(torch.isfinite(scores).all())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--ig-steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--one", choices=["batched", "reference", "floor"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one, args.model, args.image_size, args.batch_size, args.ig_steps,
                                     args.out, args.threads)))
        return
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for impl in ("batched", "reference", "floor"):
            out = Path(tmp) / f"{impl}.npy"
            done = subprocess.run([sys.executable, __file__, "--one", impl, "--out", str(out), "--model", args.model,
                                   "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
                                   "--ig-steps", str(args.ig_steps), "--threads", str(args.threads)],
                                  check=True, capture_output=True, text=True)
            rows[impl] = json.loads(done.stdout.strip().splitlines()[-1])
            rows[impl]["scores"] = np.load(out)
    new, old, floor = rows["batched"], rows["reference"], rows["floor"]
    gap = np.abs(new["scores"] - old["scores"]).max() / np.abs(old["scores"]).max()
    print(f"{args.model} at {args.image_size} px: {new['layers']} blocks x {new['heads']} heads, width "
          f"{new['width']}, {new['tokens']} tokens, {new['edges']} edges; batch {args.batch_size}, "
          f"m = {args.ig_steps} IG steps, CPU, {args.threads} thread(s)")
    for row in (old, new):
        print(f"  {row['impl']:9s} {row['seconds']:8.2f} s  {row['images_per_s']:7.2f} images/s  "
              f"peak memory +{row['peak_growth_mb']:.0f} MB")
    print(f"  speed-up {old['seconds'] / new['seconds']:.1f}x; max |score difference| / max |score| = {gap:.2e}")
    print(f"  floor (clean forward + one forward/backward of the {args.ig_steps} stacked IG inputs, no scores): "
          f"{floor['seconds']:.2f} s; batched = {new['seconds'] / floor['seconds']:.1f}x the floor, reference = "
          f"{old['seconds'] / floor['seconds']:.1f}x")


if __name__ == "__main__":
    main()
