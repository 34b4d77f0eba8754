"""The build's back half, off the main thread: from a batch's forward, as the main thread launched it, to its chunk
committed in the store.

The main thread only feeds the device: per batch it launches the forward of each view (their host copies queued
behind it, `featstore.compute.forward.forward_to_host`) and hands the batch here. A collector thread waits for each
batch's copies to land (the wait releases the GIL), refuses a value its array cannot hold (naming the anchor and the
image, before anything of that chunk is written), and gathers each chunk; a pool of writer threads checksums,
compresses and writes the finished chunks (`StoreWriter.commit_chunk`, each chunk's own commit point). Both queues
are bounded, so memory is too; the main thread waits only when the writers fall that far behind. A chunk whose
batches have all arrived is committed even when the build stops on an error or an interrupt, as before; a killed
build loses the chunks in flight and nothing else (resume makes them again, bit for bit).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from featstore.compute.forward import HostOutputs, assemble_chunk
from featstore.nets.stored_types import check_peaks
from featstore.store.writer import StoreWriter

WRITERS = 2  # commits at once: compression and checksums release the GIL, object-store PUTs overlap
BATCHES_IN_FLIGHT = 8  # batches launched but not yet collected: bounds pinned memory, keeps the device busy


@dataclass
class FirstChunk:
    """The logits of the first chunk the pipeline gathered, in one view (clean where it was computed): what the
    build's label check reads (`workflows/label_check.py`)."""

    view: str
    rows: np.ndarray  # int64 [rows]: image rows of the set
    logits: np.ndarray  # [rows, classes], NaN on skipped rows


@dataclass
class LaunchedBatch:
    """One batch of the chunk loop as the main thread hands it over: its forward outputs per view still to write
    (views already done for this chunk are not computed), which rows were skipped, and where it sits."""

    chunk: int
    rows: list[int]
    skipped: np.ndarray  # bool [rows]: unreadable images, recorded and set to NaN
    outputs: dict[str, HostOutputs]
    content: list[int]  # each file's content checksum as the loader read it
    last: bool  # the chunk's last batch
    threads: int  # CPU threads its forward ran with (0: not on the CPU)


class ChunkPipeline:
    """Collects launched batches into chunks and commits them on writer threads; see the module docstring.
    `names`/`dtypes` describe the stored arrays (anchors, then logits) for the storable check; `where(row, view)`
    names an image in a refusal."""

    def __init__(self, store: StoreWriter, key: str, names: list[str], dtypes: list[str],
                 where: Callable[[int, str], str], writers: int = WRITERS, depth: int = BATCHES_IN_FLIGHT,
                 keep_first: bool = False):
        self.store, self.key, self.names, self.dtypes, self.where = store, key, names, dtypes, where
        self.keep_first = keep_first  # keep the first chunk's logits (`first`), set once by the collector
        self.first: FirstChunk | None = None
        self.error: BaseException | None = None
        self.committed = 0
        self.first_commit: float | None = None  # perf_counter() when the first chunk was committed
        self._batches: queue.Queue = queue.Queue(maxsize=depth)
        self._pool = ThreadPoolExecutor(writers, thread_name_prefix="featstore-writer")
        self._slots = threading.BoundedSemaphore(2 * writers)  # chunks handed to the writers, not yet written
        self._lock = threading.Lock()
        self._collector = threading.Thread(target=self._collect, name="featstore-collector", daemon=True)
        self._collector.start()

    def put(self, batch: LaunchedBatch) -> None:
        """Hand over one batch (in plan order); raises the first error the pipeline met."""
        self._raise()
        self._batches.put(batch)

    def close(self) -> None:
        """Commit every chunk whose batches have all arrived, then raise the first error met, if any."""
        self._batches.put(None)
        self._collector.join()
        self._pool.shutdown(wait=True)
        self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error

    def _collect(self) -> None:
        pieces: dict[str, list] = {}
        content: list[int] = []
        rows: list[int] = []
        while (batch := self._batches.get()) is not None:
            if self.error is not None:
                continue  # drained, never committed: the build stops
            try:
                if not content and not pieces:
                    pieces = {view: [] for view in batch.outputs}
                for view, outputs in batch.outputs.items():
                    feats, logits, peaks = outputs.arrays()
                    check_peaks(peaks, self.dtypes, self.names, batch.skipped,
                                lambda i, rows=batch.rows, view=view: self.where(rows[i], view))
                    if batch.skipped.any():
                        for values in [*feats, logits]:
                            values[batch.skipped] = np.nan
                    pieces[view].append((feats, logits, batch.skipped))
                content += batch.content
                rows += batch.rows
                if batch.last:
                    sums = np.asarray(content, dtype=np.int64)
                    if self.keep_first and self.first is None and pieces:
                        view = "clean" if "clean" in pieces else next(iter(pieces))
                        self.first = FirstChunk(view, np.asarray(rows, dtype=np.int64),
                                                np.concatenate([logits for _, logits, _ in pieces[view]]))
                    for view, parts in pieces.items():
                        self._submit(view, parts, batch, sums)
                    pieces, content, rows = {}, [], []
            except BaseException as e:
                self._fail(e)

    def _submit(self, view: str, parts: list, batch: LaunchedBatch, content: np.ndarray) -> None:
        self._slots.acquire()

        def commit() -> None:
            try:
                if self.error is None:
                    self.store.commit_chunk(self.key, view, assemble_chunk(batch.chunk, parts, batch.threads,
                                                                           content))
                    with self._lock:
                        self.committed += 1
                        if self.first_commit is None:
                            self.first_commit = time.perf_counter()
            finally:
                self._slots.release()

        future: Future = self._pool.submit(commit)
        future.add_done_callback(lambda f: f.exception() is not None and self._fail(f.exception()))
