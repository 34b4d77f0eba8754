"""Zarr's async calls run from featstore's synchronous code, on Zarr's own event loop: several reads or writes in
flight at once (a chunk's arrays, every view array's metadata), and the store calls that Zarr's synchronous API
does not offer (whether a key exists, a listing of one level, removing a prefix without reading its metadata,
writing a raw key).

Zarr 3 has no public function for this: its own synchronous API (`zarr.api.synchronous`) wraps the private
`zarr.core.sync.sync`, and a store or array made by Zarr is bound to that loop (a coroutine of it cannot run under
`asyncio.run`). This module is the one place featstore imports it, so a Zarr release that moves it is one line here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

from zarr.core.sync import sync

__all__ = ["settle", "sync", "together"]


def together(calls: Sequence[Coroutine[Any, Any, Any]], errors: bool = False) -> list:
    """Run `calls` at once on Zarr's loop and wait for every one to end; then raise the first failure (with
    `errors`, return each failure in its place). None is left running when this returns or raises, so a refusal
    never leaves a request in flight (a native call of the object store's client) at interpreter shutdown."""

    async def gathered() -> list:
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = sync(gathered())
    failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failed is not None and not errors:
        raise failed
    return outcomes


def settle(timeout_s: float = 60.0) -> None:
    """Wait until nothing else runs on Zarr's loop (at most `timeout_s`): a Ctrl-C ends `sync`'s wait in the
    calling thread but not the coroutine it waited on, whose writes would land in a folder being removed after it
    (a removal failing on a file renamed under it, or a removed version back with the late files)."""

    async def others() -> None:
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)

    sync(others())
