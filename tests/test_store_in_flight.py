"""A write or read of several arrays at once that fails in one of them raises only once every other request of it
has ended: nothing of it is left running on Zarr's event loop (on object storage, a native call of the client) when
the refusal reaches the user and the interpreter shuts down. Checked by making one array's request fail at once
while the others are still under way, and counting the others that had ended when the call raised."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from synthetic import class_clusters, write_feature_store

from featstore.store.rows import read_rows
from featstore.store.writer import ChunkData, StoreWriter

N, CHUNK, DIMS = 24, 8, [3, 5, 4]


class Gone(OSError):
    """The failure of the one array whose request fails."""


@pytest.fixture
def store(tmp_path):
    feats, labels = class_clusters(N, 2, DIMS, seed=4)
    return write_feature_store(tmp_path / "s.zarr", feats, labels, 2, chunk_rows=CHUNK)


def _patch(monkeypatch, async_array_type: type, method: str, failing: str) -> list[str]:
    real = getattr(async_array_type, method)
    ended: list[str] = []

    async def slow_or_gone(self, *args, **kwargs):
        if self.path.endswith(failing):
            raise Gone(f"{self.path}: the store stopped answering")
        await asyncio.sleep(0.3)
        result = await real(self, *args, **kwargs)
        ended.append(self.path)
        return result

    monkeypatch.setattr(async_array_type, method, slow_or_gone)
    return ended


def test_a_commit_that_fails_in_one_array_raises_after_every_other_write_ended(store, monkeypatch):
    writer = StoreWriter(store)
    group = writer.view_group("synthetic", "clean")
    anchors = [f"anchors/{a.name}" for a in writer.anchors("synthetic")]
    ended = _patch(monkeypatch, type(group["logits"].async_array), "setitem", "logits")
    rng = np.random.default_rng(0)
    data = ChunkData(1, [rng.normal(size=(CHUNK, d)).astype(np.float16) for d in DIMS],
                     np.zeros((CHUNK, 2), dtype=np.float16), np.zeros(CHUNK, dtype=bool))
    writer.undo_chunks("synthetic", "clean", [1])
    with pytest.raises(Gone):
        writer.commit_chunk("synthetic", "clean", data)
    # the anchors' and the skipped flags' writes (all but the logits') had ended when the commit raised
    assert sorted(ended) == sorted(f"synthetic/clean/{a}" for a in [*anchors, "skipped"])
    assert not writer.done("synthetic", "clean")[1]  # and the chunk was not marked done


def test_a_read_of_rows_that_fails_in_one_array_raises_after_every_other_read_ended(store, monkeypatch):
    writer = StoreWriter(store)
    group = writer.view_group("synthetic", "clean")
    arrays = [group["anchors"][f"anchor{i:02d}"] for i in range(len(DIMS))] + [group["logits"]]
    ended = _patch(monkeypatch, type(group["logits"].async_array), "getitem", "logits")
    with pytest.raises(Gone):
        read_rows(arrays, 0, CHUNK)
    assert sorted(ended) == sorted(a.path for a in arrays[:-1])
    blocks = read_rows(arrays, 0, CHUNK, errors=True)  # each failure in its place, the rest as stored
    assert isinstance(blocks[-1], Gone) and [b.shape for b in blocks[:-1]] == [(CHUNK, d) for d in DIMS]


def test_a_discarded_probe_version_waits_for_the_writes_a_ctrl_c_left_running(store):
    """Ctrl-C while a probe's arrays are written ends the job's wait, not the writes on Zarr's loop: discarding
    the version waits for them, so none lands in (or brings back) the removed folder. A write is left running here
    as a Ctrl-C leaves it: on Zarr's loop, its caller (another thread) not the one that discards, landing 0.5 s
    after it started."""
    import threading

    from featstore.store.zarr_loop import sync

    writer = StoreWriter(store)
    writer.write_probe("synthetic", "linear", "anchor00", {"w": np.ones((2, 3))}, {}, "v1")
    version = store / "synthetic" / "probes" / "linear" / "v1"
    assert version.is_dir()
    started = threading.Event()

    async def late_write() -> None:
        started.set()
        await asyncio.sleep(0.5)
        late = version / "anchor00" / "w" / "c" / "0.partial"  # as a store's write lands: its folders made
        late.parent.mkdir(parents=True, exist_ok=True)
        late.write_bytes(b"written after the interrupt")

    left_running = threading.Thread(target=sync, args=(late_write(),))
    left_running.start()
    assert started.wait(60)
    writer.discard_probe_version("synthetic", "linear", "v1")
    left_running.join(60)  # the write has landed, or had landed before the removal
    assert not version.exists()
