"""Rows of several Zarr arrays read at once: what the integrity check, the probes' feature source and the
similarity measures read a chunk's arrays with."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import zarr

from featstore.store.zarr_loop import together


def read_rows(arrays: Sequence[zarr.Array], start: int, stop: int, errors: bool = False) -> list:
    """Rows [start, stop) of every array, all read at once: one request each, all in flight together (object
    storage answers each after a round trip; local disk decodes them in parallel). `errors=True` returns a
    failed read's exception in its place instead of raising it."""

    blocks = together([a.async_array.getitem((slice(start, stop),)) for a in arrays], errors=errors)
    return [b if isinstance(b, BaseException) else np.asarray(b) for b in blocks]

def decodes(array: zarr.Array, index: int) -> bool:
    """Whether entry `index` of a 1-d array can be read (a damaged chunk file cannot)."""
    try:
        return bool(array[index])
    except Exception:
        return False
