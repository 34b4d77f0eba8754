"""`featstore build`: run a frozen model over an image set and stream pooled anchors into the store. The job (set-up,
store preparation, the chunk loop, the background writer); what a batch computes is `featstore.compute.forward`.

Work is cut into the store's chunks. Each chunk is processed in a fixed partition of batches (so its numbers
never depend on what else runs), written by a background thread through `StoreWriter.commit_chunk`, and
only then marked done. A rerun skips done chunks; torchrun ranks split the remaining chunks round-robin.
"""

from __future__ import annotations

import math
import platform
import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from featstore.compute.forward import (
    chunk_batches,
    forward_to_host,
    preferred_memory_format,
    resolve_precision,
)
from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
from featstore.errors import FeatstoreError, Name
from featstore.images.datasets import ImageSet, labels_for_head
from featstore.images.tensor_input import decoder_name, input_batches, resolve_decode
from featstore.images.views import View, parse_views, with_generator
from featstore.nets.anchors import check_anchor_choice, tap_anchor_names
from featstore.nets.depth import anchor_names_for
from featstore.nets.extraction import Tapper, default_token_pool, describe_anchors, head_arrays
from featstore.nets.head_norm import head_reading
from featstore.nets.models import LoadedModel, load_model
from featstore.runtime import (
    Ranks,
    barrier,
    init_distributed,
    make_cuda_deterministic,
    ranks_from_env,
    resolve_device,
    tune_allocator,
)
from featstore.schema import CHUNK_ROWS, VIEW, check_fields, default
from featstore.store.config import StoreConfig
from featstore.store.integrity import image_stats
from featstore.store.location import StoreLocation
from featstore.store.reader import model_key
from featstore.store.repair import check_image_files, repair_images, repair_view
from featstore.store.writer import StoreWriter
from featstore.threads import ThreadPolicy
from featstore.version import __version__
from featstore.workflows.chunk_pipeline import ChunkPipeline, LaunchedBatch
from featstore.workflows.label_check import HeadAgreement, checks_labels, head_agreement, warn_if_near_chance

BATCH_SIZE = 64  # images per forward when RunOptions.batch_size is not given


@dataclass(frozen=True)
class BuildConfig:
    """Everything `featstore build` takes; the CLI only fills this in. `run.seed` seeds random init and the --limit
    subset (a noise view's draw depends on the view and the image id alone)."""

    model: ModelSpec
    images: ImageSource
    store: str | Path | StoreLocation  # a folder, or an object-store URL (featstore.store.location)
    views: str = VIEW
    anchors: str | None = None
    taps: str | None = None
    pool: str | None = None
    chunk_rows: int = CHUNK_ROWS
    precision: str = default("precision")
    store_dtype: str = default("store_dtype")  # featstore.nets.stored_types: float16, float32 where float16 cannot hold
    decode: str = default("decode")
    skip_bad: bool = False
    rebuild_changed: bool = False  # images changed since the store was built: recompute their chunks, not refuse
    name: str | None = None
    compile: bool = False  # the tapped forward under torch.compile (recorded: a resume must match it)
    run: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self) -> None:
        check_fields(self, ("views", "chunk_rows", "precision", "store_dtype", "decode", "pool"))

    @property
    def batch_size(self) -> int:
        return self.run.batch(BATCH_SIZE)


@dataclass
class BuildResult:
    key: str
    images: int
    chunks_written: int = 0
    chunks_skipped: int = 0
    bad_images: list[str] = field(default_factory=list)
    seconds: float = 0.0
    images_processed: int = 0
    damaged: list[str] = field(default_factory=list)  # done chunks found untrustworthy and made again
    repaired: list[str] = field(default_factory=list)  # damaged image table or view arrays, made again
    changed_images: list[str] = field(default_factory=list)  # files changed since the build (--rebuild-changed)
    # where the time went (bench/device_check.py): loading the model, from the call to the first chunk committed,
    # and the CPU time of the thread that fed the forward over the chunk loop
    model_seconds: float = 0.0
    first_chunk_seconds: float = 0.0
    main_cpu_seconds: float = 0.0
    # a pretrained 1,000-way head's top-1 agreement with the labels on the first chunk computed (label_check.py)
    head_agreement: HeadAgreement | None = None


@dataclass
class BuildJob:
    """One resolved build, as every step after the set-up needs it: the config, where this process sits among the
    ranks, the images, the loaded model and its tapper, how it runs (device, layout, precision, decoder) and the
    store config it writes."""

    cfg: BuildConfig
    ranks: Ranks
    key: str
    images: ImageSet
    views: list[View]
    loaded: LoadedModel
    tapper: Tapper
    device: torch.device
    memory_format: torch.memory_format
    precision: str
    decode: str
    config: StoreConfig
    threads: ThreadPolicy  # CPU threads, re-decided per chunk
    started: float  # perf_counter() when `build` was called
    model_seconds: float  # loading the model


def build(cfg: BuildConfig) -> BuildResult:
    """Build (or resume) one model's views in a store; see the module docstring for the guarantees."""
    started = time.perf_counter()
    tune_allocator()
    StoreLocation.parse(cfg.store).check_usable()
    ranks = ranks_from_env()
    device = resolve_device(cfg.run.device, ranks.local_rank)
    precision = resolve_precision(cfg.precision, device)
    decode = resolve_decode(cfg.decode, device)
    if device.type == "cuda":
        make_cuda_deterministic(precision)
    views = parse_views(cfg.views)
    images = cfg.images.discover(cfg.run.seed)
    with ThreadPolicy(cfg.run.threads, device) as threads:  # every forward, the set-up's included
        return _build(cfg, ranks, device, precision, decode, views, images, threads, started)


def _build(cfg: BuildConfig, ranks: Ranks, device: torch.device, precision: str, decode: str, views: list[View],
           images: ImageSet, threads: ThreadPolicy, started: float) -> BuildResult:
    loading = time.perf_counter()
    loaded = load_model(cfg.model.model, cfg.model.weights, cfg.run.seed, cfg.model.image_size)
    model_seconds = time.perf_counter() - loading
    memory_format = preferred_memory_format(loaded.module)
    model = loaded.module.to(device, memory_format=memory_format)
    check_anchor_choice(cfg.anchors, cfg.taps)
    sample = loaded.preprocessing.normalize(torch.zeros(1, 3, loaded.preprocessing.crop, loaded.preprocessing.crop))
    sample = sample.to(device).contiguous(memory_format=memory_format)
    # module taps pool over all tokens (docs/design.md §3); other token anchors read the CLS token where there is one
    pool_kind = cfg.pool or ("mean" if cfg.taps else default_token_pool(model, sample))
    names = tap_anchor_names(model, cfg.taps) if cfg.taps else anchor_names_for(loaded.arch, loaded.library, model,
                                                                                 cfg.anchors, sample, pool_kind)
    anchors, num_classes, logits_dtype = describe_anchors(model, names, sample, pool_kind, cfg.store_dtype)
    images = labels_for_head(images, num_classes)
    config = StoreConfig(
        model=cfg.model.model, library=loaded.library, weights_id=loaded.weights_id,
        preprocessing=loaded.preprocessing, token_pool=pool_kind, num_classes=num_classes,
        chunk_rows=cfg.chunk_rows, batch_size=cfg.batch_size, precision=precision, anchors=tuple(anchors),
        images_fingerprint=images.fingerprint(), memory_format=str(memory_format).removeprefix("torch."),
        decoder=decoder_name(decode, device), logits_dtype=logits_dtype, compiled=cfg.compile)
    job = BuildJob(cfg, ranks, model_key(cfg.name or cfg.model.model), images, views, loaded,
                   Tapper(model, anchors, pool_kind), device, memory_format, precision, decode, config, threads,
                   started, model_seconds)
    init_distributed(ranks, device)
    with ExitStack() as held:
        store, found = _prepare_store(job, held)
        return _build_chunks(job, store, found)


def compiled_forward(job: BuildJob) -> torch.nn.Module:
    """The job's model under torch.compile, compiled here for a full batch: with static shapes only (a partial last
    batch gets a graph of its own), so the same chunk always meets the same kernels, and a resume is bit-identical.
    The taps' hooks are traced into the graph. A failure to compile is one line."""
    forward = torch.compile(job.tapper.model, dynamic=False)
    crop = job.loaded.preprocessing.crop
    batch = job.loaded.preprocessing.normalize(torch.zeros(job.cfg.batch_size, 3, crop, crop, device=job.device))
    try:
        with torch.inference_mode(), _autocast(job):
            forward(batch.contiguous(memory_format=job.memory_format))
    except Exception as e:
        raise FeatstoreError(Name("compile"), f": torch.compile failed on this model ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''}); build without ",
                             Name("compile")) from e
    return forward


def _build_chunks(job: BuildJob, store: StoreWriter, found: Repairs) -> BuildResult:
    key, ranks = job.key, job.ranks
    done = {v.name: store.done(key, v.name) for v in job.views}
    barrier(ranks)  # every rank has read the same bitmap before any rank commits a chunk
    todo_views = [v for v in job.views if not done[v.name].all()]
    n_chunks = math.ceil(len(job.images) / job.cfg.chunk_rows)
    todo = [c for c in range(n_chunks) if any(not done[v.name][c] for v in todo_views)]
    mine = todo[ranks.rank :: ranks.world]
    result = BuildResult(key, len(job.images), chunks_skipped=n_chunks - len(todo), damaged=found.chunks,
                         repaired=found.parts, changed_images=found.images, model_seconds=job.model_seconds)
    start = time.perf_counter()
    if mine and job.cfg.compile:
        job.tapper.model = compiled_forward(job)
    if mine:
        _run_chunks(job, store, todo_views, done, mine, result)
    job.tapper.close()
    result.seconds = time.perf_counter() - start
    barrier(ranks)
    return result


@dataclass
class Repairs:
    """What `_prepare_store` found untrustworthy and will make again: chunks, whole parts, changed image files."""

    chunks: list[str] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)


def _prepare_store(job: BuildJob, held: ExitStack) -> tuple[StoreWriter, Repairs]:
    """Rank 0 creates or checks the store's groups; the other ranks wait, then check.

    Against other processes: groups are created only under the store's lock (held briefly), and the model's
    lock (flock on local disk, a lease on object storage: `StoreLocation.writer_lock`), taken under it and held
    by `held` until the build ends, makes a second build of the same model refuse with one line instead of
    writing the same chunks; the store checks that lock before each chunk's commit. What the store holds is
    checked first (`featstore.store.repair`): a damaged image table or view is made again, image files changed since
    the store was built are refused (or, with --rebuild-changed, their chunks made again), and done chunks that
    fail `check_view` are marked not done, so that this build makes exactly those again."""
    cfg, ranks, images, key, config = job.cfg, job.ranks, job.images, job.key, job.config
    found = Repairs()
    location = StoreLocation.parse(cfg.store)
    if ranks.is_main:
        location.create()
        with location.writer_lock(None, wait=True, what=f"store {location}"):
            store = StoreWriter(location)
            found.parts += repair_images(store, images)
            if store.has_images():
                store.check_images(images)
                found.images += check_image_files(store, images, cfg.rebuild_changed)
            else:  # the files' stats with the table, before the attrs that finish it
                store.write_images(images, image_stats(images.root, images.paths, content=False))
            store.prepare_model(key, config, _versions(config.library))
            _keep_head(store, key, job)
            lock = held.enter_context(location.writer_lock(key, wait=False, what=f"model {key!r} of store {location}"))
            store.guard = lock.check
            for v in job.views:
                found.parts += repair_view(store, key, v.name)
                store.prepare_view(key, v.to_dict(), config.anchors, config.num_classes, cfg.chunk_rows,
                                   config.logits_dtype)
                store.upgrade_view(key, v.name)
                with store.one_reading():  # nothing else writes this view meanwhile: read its metadata once
                    problems = store.check_view(key, v.name)
                store.undo_chunks(key, v.name, sorted({p.chunk for p in problems}))
                found.chunks += [str(p) for p in problems]
    barrier(ranks)
    if not ranks.is_main:
        store = StoreWriter(location)
        store.check_images(images)
        store.prepare_model(key, config, _versions(config.library))
    # a noise view keeps the generator its store made it with (views made before generator 2: generator 1)
    job.views = [with_generator(v, dict(store.view_group(key, v.name).attrs)) for v in job.views]
    return store, found


def _keep_head(store: StoreWriter, key: str, job: BuildJob) -> None:
    """Write the classifier's weights, its final norm and each anchor's role to it beside the model's metadata
    unless a sound copy of all of them is there (a store built before they were kept gains them on its next
    build), so a readout through the head never reruns the network."""
    try:
        if store.read_head_reading(key) is not None:
            return
    except FeatstoreError:  # damaged: written again
        pass
    model = job.tapper.model
    head = head_arrays(model, job.config.num_classes)
    if head is not None:
        crop = job.loaded.preprocessing.crop
        sample = job.loaded.preprocessing.normalize(torch.zeros(1, 3, crop, crop, device=job.device))
        store.write_head(key, *head, head_reading(model, job.tapper.anchors,
                                                  sample.contiguous(memory_format=job.memory_format),
                                                  job.config.token_pool))


def _versions(library: str) -> dict:
    import torchvision
    import zarr

    out = {"featstore": __version__, "python": platform.python_version(), "torch": torch.__version__,
           "torchvision": torchvision.__version__, "zarr": zarr.__version__}
    if library == "timm":
        import timm

        out["timm"] = timm.__version__
    return out


def _run_chunks(job: BuildJob, store: StoreWriter, views: list[View], done: dict, mine: list[int],
                result: BuildResult) -> None:
    """The chunk loop: this (main) thread only reads input batches and launches their forwards; `ChunkPipeline`
    collects, checks and commits them on threads of its own."""
    cfg, images, device = job.cfg, job.images, job.device
    n = len(images)

    def rows_of_chunk(c: int) -> range:
        return range(c * cfg.chunk_rows, min(n, (c + 1) * cfg.chunk_rows))

    chunk_of_batch: list[int] = []
    batches: list[list[int]] = []
    for c in mine:
        for b in chunk_batches(rows_of_chunk(c), cfg.batch_size):
            batches.append(b)
            chunk_of_batch.append(c)
    batches_in = input_batches(job.decode, images, job.loaded.preprocessing, views, batches, device, cfg.run.workers)
    anchors = job.tapper.anchors
    dtypes = [a.dtype for a in anchors] + [job.config.logits_dtype]
    names = [f"anchor {a.name!r} of {job.key}" for a in anchors] + [f"the logits of {job.key}"]
    check = checks_labels(job.config.weights_id, job.config.num_classes)
    autocast = _autocast(job)
    bar = _progress(job, sum(len(b) for b in batches), views)
    # its collector thread starts here and is joined by `close` below, before anything is raised
    pipeline = ChunkPipeline(store, job.key, names, dtypes, lambda row, view: f"{images.paths[row]} (view {view})",
                             keep_first=check)
    current, threads = None, 0
    cpu = time.thread_time()
    try:
        for batch, chunk in zip(batches_in, chunk_of_batch, strict=True):
            if chunk != current:
                current = chunk
                threads = job.threads.update() if device.type == "cpu" else 0  # recorded with the chunk
            skipped = _skipped(job, batch.rows, batch.errors, result)
            stacked = batch.views or _blank(job, len(batch.rows), views)
            outputs = {}
            with torch.inference_mode(), autocast:
                for v, x in zip(views, stacked, strict=True):
                    if not done[v.name][chunk]:
                        outputs[v.name] = forward_to_host(job.tapper, job.loaded.preprocessing.normalize, x,
                                                          job.memory_format, dtypes)
            last = batch.rows[-1] + 1 == rows_of_chunk(chunk).stop
            pipeline.put(LaunchedBatch(chunk, batch.rows, skipped, outputs, batch.content, last, threads))
            check = check and not _labels_checked(job, pipeline, result)
            if bar is not None:
                bar.update(len(batch.rows))
            if last:
                result.chunks_written += 1
                result.images_processed += len(rows_of_chunk(chunk))
    finally:
        if bar is not None:
            bar.close()
        result.main_cpu_seconds = time.thread_time() - cpu
        try:
            pipeline.close()
        finally:
            if pipeline.first_commit is not None:
                result.first_chunk_seconds = pipeline.first_commit - job.started
    if check:
        _labels_checked(job, pipeline, result)


def _labels_checked(job: BuildJob, pipeline: ChunkPipeline, result: BuildResult) -> bool:
    """Once the first chunk's logits are in: a pretrained 1,000-way head's agreement with the labels, recorded in
    the result and one warning line when it is about chance (`workflows/label_check.py`); the build goes on."""
    first = pipeline.first
    if first is None:
        return False
    result.head_agreement = head_agreement(first.logits, job.images.labels[first.rows])
    if result.head_agreement is not None:
        warn_if_near_chance(result.head_agreement, job.key, job.images.source)
    return True


def _autocast(job: BuildJob):
    """The forward's autocast context for the job's precision (none for fp32)."""
    if job.precision not in ("fp16", "bf16"):
        return nullcontext()
    return torch.autocast(job.device.type, dtype=torch.float16 if job.precision == "fp16" else torch.bfloat16)


def _skipped(job: BuildJob, rows: list[int], errors: list[str | None], result: BuildResult) -> np.ndarray:
    """Which rows of a batch could not be read: a stop in one line, or with --skip-bad a record (their rows are
    written as NaN and flagged skipped)."""
    skipped = np.zeros(len(rows), dtype=bool)
    for i, error in enumerate(errors):
        if error is None:
            continue
        path = job.images.root / job.images.paths[rows[i]]
        if not job.cfg.skip_bad:
            raise FeatstoreError(f"cannot decode image {path} ({error}); remove or replace the file, or pass ",
                                 Name("skip_bad"), " to record it as skipped and go on")
        result.bad_images.append(str(path))
        skipped[i] = True
    return skipped


def _blank(job: BuildJob, rows: int, views: list[View]) -> list[torch.Tensor]:
    """What a batch of only unreadable images forwards (zeros, in each view's type): its rows become NaN."""
    crop = job.loaded.preprocessing.crop
    return [torch.zeros(rows, 3, crop, crop, device=job.device,
                        dtype=torch.uint8 if v.corruption is None else torch.float32) for v in views]


def _progress(job: BuildJob, total: int, views: list[View]):
    ranks = job.ranks
    if not job.cfg.run.progress or not ranks.is_main:
        return None
    from tqdm import tqdm

    label = f"{job.key} [{','.join(v.name for v in views)}]"
    if ranks.world > 1:
        label += f" rank 0/{ranks.world}"
    return tqdm(total=total, unit="img", desc=label, dynamic_ncols=True, smoothing=0.1)
