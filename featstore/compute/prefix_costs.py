"""`featstore cost`: what exiting at each anchor costs on this device, measured once per model and device.

The prefix up to an anchor is timed by running the model and stopping with an exception raised in that
anchor's forward hook, so it is exactly the computation that precedes the anchor's output. Each anchor's
probe (global average pooling of a map of the anchor's real shape, then a linear layer and its softmax) is
timed apart. Times are medians of repeated runs after warm-up; FLOPs come from torch.utils.flop_counter.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from featstore.nets.anchors import Anchor
from featstore.nets.extraction import hook_anchor, output_shapes, readout
from featstore.records import AnchorCost, ModelCost
from featstore.schema import REPEATS


class _Stop(Exception):
    pass


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _flops(fn: Callable[[], object]) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return int(counter.get_total_flops())


def measure_costs(model: nn.Module, anchors: Sequence[Anchor], crop: int, num_classes: int, device: torch.device,
                  batch_size: int, token_pool: str = "cls", repeats: int = REPEATS, warmup: int = 3) -> ModelCost:
    """Prefix and probe cost of every anchor, and the full model's, at one batch size."""
    model = model.to(device).eval()
    x = torch.randn(batch_size, 3, crop, crop, device=device)
    shapes = output_shapes(model, anchors, x)

    def prefix(anchor: Anchor) -> Callable[[], None]:
        def run() -> None:
            def stop(_):
                _sync(device)
                raise _Stop

            handle = hook_anchor(model, anchor, stop)
            try:
                with torch.inference_mode():
                    model(x)
            except _Stop:
                pass
            finally:
                handle.remove()
        return run

    costs = []
    for index, anchor in enumerate(anchors):
        run = prefix(anchor)
        feature_map = torch.randn(shapes[anchor.name], device=device)
        dim = readout(feature_map, anchor, token_pool).shape[1]
        weight = torch.randn(num_classes, dim, device=device)
        bias = torch.randn(num_classes, device=device)

        def probe(feature_map=feature_map, weight=weight, bias=bias, anchor=anchor):
            with torch.inference_mode():
                pooled = readout(feature_map, anchor, token_pool)
                return torch.softmax(pooled @ weight.T + bias, dim=-1).max(dim=-1)

        costs.append(AnchorCost(index, median_ms(run, device, repeats, warmup), _flops(run),
                                median_ms(probe, device, repeats, warmup), _flops(probe)))

    def full() -> None:
        with torch.inference_mode():
            model(x)

    return ModelCost(device_name(device), batch_size, median_ms(full, device, repeats, warmup), _flops(full), costs)
