"""Which type each stored array gets, and the guard that nothing is written that its type cannot hold.

The store keeps anchors and logits as float16 (half the bytes of float32, and pooled activations of trained
networks are O(0.01-100)). float16 holds |x| <= 65504 and has full precision only above 2^-14; a network whose
activations leave that range (torchvision's inception_v3 with random weights reaches logits of 3e7; deep
random-init nets shrink to 1e-9) would be written as infinities or zeros without a word. So:

- `--store-dtype auto` (the default) stores an array as float32 when, on the blank image every build forwards
  first (and a noisy copy of it), its pooled values come within `HEADROOM` of float16's limits (peak above
  65504/64, or every value below 2^-14·64), or float16 rounding would blur more than `SIGNAL_LOSS` of the
  difference between the two images (timm's repvgg_a0 with random weights: its late blocks vary by 1e-7 of their
  size, below float16's resolution, so a float16 store holds the same vector for every image and its probes
  predict NaN); the type is recorded per anchor (`Anchor.dtype`) and for the logits (`StoreConfig.logits_dtype`).
  `float16` / `float32` force one type for every array.
- while building, a value that is not finite, or that a float16 array cannot hold, stops the build with one line
  naming the anchor and the image, before its chunk is committed: nothing downstream ever reads an infinity.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from featstore.errors import FeatstoreError, Name
from featstore.schema import STORE_DTYPES

FLOAT16_MAX = 65504.0
FLOAT16_TINY = 2.0**-14  # the smallest normal float16: below it, values lose precision, then flush to zero
HEADROOM = 64.0  # real images reach further than a blank one
SIGNAL_LOSS = 0.1  # float16 may blur at most this share of the difference an input change makes


def choose_dtype(policy: str, values: torch.Tensor) -> str:
    """The type an array gets under `policy`, from its pooled values [2, D] on the blank image and on a noisy
    copy of it (`featstore.nets.extraction.noisy_pair`)."""
    if policy not in STORE_DTYPES:
        raise FeatstoreError(f"use one of {', '.join(STORE_DTYPES)}", field="store_dtype", value=policy)
    if policy != STORE_DTYPES[0]:
        return policy
    values = values.double()
    peak = float(values.abs().max()) if values.numel() else 0.0
    if not math.isfinite(peak) or peak * HEADROOM > FLOAT16_MAX or 0 < peak < FLOAT16_TINY * HEADROOM:
        return "float32"
    change = values[1] - values[0]
    kept = values.half().double()
    lost = float(((kept[1] - kept[0]) - change).norm())
    return "float32" if lost > SIGNAL_LOSS * float(change.norm()) else "float16"


def row_peaks(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """[arrays, rows] float32: each row's largest |value| per array (NaN where the row holds one, inf for an
    infinity), computed where the values are: all the build needs to tell whether a row can be stored."""
    return torch.stack([v.float().abs().amax(dim=1) for v in values])


def unstorable(peaks: np.ndarray, dtypes: Sequence[str]) -> np.ndarray:
    """[arrays, rows] flags from `row_peaks`: a value that is not finite or, for a float16 array, beyond ±65504."""
    limit = np.asarray([FLOAT16_MAX if d == "float16" else np.inf for d in dtypes], dtype=np.float64)[:, None]
    peaks = np.asarray(peaks, dtype=np.float64)
    return ~np.isfinite(peaks) | (peaks > limit)


def unstorable_rows(values: Sequence[torch.Tensor], dtypes: Sequence[str]) -> np.ndarray:
    """`unstorable` of the values themselves."""
    return unstorable(row_peaks(values).cpu().numpy(), dtypes)


def refusal(what: str, dtype: str, value: float, where: str) -> FeatstoreError:
    """The one-line error for a value `what` (an anchor, the logits) cannot be stored as."""
    if math.isfinite(value):
        return FeatstoreError(f"{what} reaches {value:.4g} on {where}, beyond float16's ±65504; rebuild with ",
                              Name("store_dtype", "float32"), " (in a new ", Name("store"), ", or under ",
                              Name("name"), ")")
    return FeatstoreError(f"{what} is {value} on {where} ({dtype}): the network itself computes it (NaN or infinite ",
                          Name("weights"), ", or an fp16/bf16 overflow: then build with ", Name("precision", "fp32"),
                          "); nothing of it is "
                          "stored")


def check_peaks(peaks: np.ndarray, dtypes: Sequence[str], names: Sequence[str], skipped: np.ndarray,
                where: Callable[[int], str]) -> None:
    """Refuse in one line (`refusal`) the first value of a batch its array cannot hold, from the batch's `row_peaks`:
    `names` say what each array is, `where(row)` where a row comes from (asked only for the refusal); rows the build
    records as `skipped` are not checked."""
    flags = unstorable(peaks, dtypes)
    flags[:, np.asarray(skipped, dtype=bool)] = False
    if flags.any():
        array, row = (int(i) for i in np.argwhere(flags)[0])
        raise refusal(names[array], dtypes[array], float(peaks[array, row]), where(row))
