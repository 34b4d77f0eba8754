"""Seeded train/val/test split and cross-fit folds over the images of a store.

The split depends only on the image ids and the seed, so every model, view and variant of a dataset shares it.
"""

from __future__ import annotations

import numpy as np

from featstore.errors import FeatstoreError
from featstore.schema import FIELDS, VAL_FRAC


def checked(**fields: object) -> None:
    """Library-side range checks of split settings (`split_seed`, `val_frac`), by the rule the CLI's flags follow
    (schema.FIELDS), in a message that names the Python field: `val_frac=2.0: must be a number > 0 and < 1`. A
    val fraction outside (0, 1) would mark every image val, or none."""
    for name, value in fields.items():
        try:
            FIELDS[name].check(value)
        except (ValueError, TypeError) as e:
            raise FeatstoreError(str(e), field=name, value=value) from None


def make_split(image_ids: np.ndarray, seed: int = 0, train_frac: float = 0.7, val_frac: float = VAL_FRAC) -> np.ndarray:
    """Per image 'train' | 'val' | 'test': a seeded 70/30 train/test split, val = 10% carved from the 70%."""
    n = len(image_ids)
    order = np.random.default_rng(seed).permutation(n)
    n_trainval = int(round(train_frac * n))
    n_val = int(round(val_frac * n_trainval))
    split = np.full(n, "test", dtype=object)
    split[order[:n_val]] = "val"
    split[order[n_val:n_trainval]] = "train"
    return split


def make_folds(n: int, k: int, seed: int = 0) -> np.ndarray:
    """Per row a fold 0..k-1, balanced, seeded."""
    fold = np.empty(n, dtype=np.int64)
    fold[np.random.default_rng(seed + 1).permutation(n)] = np.arange(n) % k
    return fold
