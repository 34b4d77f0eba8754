"""What `featstore anchors` prints: a model's default anchors with what they hook, or every name a build can
extract. Loads the model, so it sits above the tapper (`extraction`) and the depth choice (`depth`), which
import neither it nor each other's callers."""

from __future__ import annotations

import torch

from featstore.nets.anchors import resolve_anchors
from featstore.nets.depth import anchor_names_for
from featstore.nets.extraction import default_token_pool, runnable_anchor_names
from featstore.nets.models import load_model


def anchor_listing(model_name: str, every: bool = False) -> list[str]:
    """Lines for `featstore anchors`: the default anchors with what they hook, or every name a build can
    extract, one per line (each accepted verbatim by `--anchors`)."""
    loaded = load_model(model_name, weights="none")
    model = loaded.module.eval()
    crop = loaded.preprocessing.crop
    sample = loaded.preprocessing.normalize(torch.zeros(1, 3, crop, crop))
    if every:
        return runnable_anchor_names(model, sample)
    lines = []
    names = anchor_names_for(loaded.arch, loaded.library, model, None, sample, default_token_pool(model, sample))
    for a in resolve_anchors(model, names):
        how = "" if a.module == a.name else f"  (hooks {a.module} {a.side}{' + ' + a.post if a.post else ''})"
        lines.append(f"{a.index:3d}  {a.name}{how}")
    return lines
