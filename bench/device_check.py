"""Every GPU measurement of featstore in one run (< 8 minutes on one H200), written to --out DIR as
device_check.json and device_check.md.

Sections, each timed and recorded even when another fails (`--sections` picks some):
  images     ~20k ImageNet-sized JPEGs (500x375, 375x500, 500x333; 10 classes) generated with every CPU core
  stages     ResNet-50's input path stage by stage, no store: the files' bytes read (16 threads, and the loader's
             worker processes), nvJPEG's batched decode alone, the input path alone (read -> decode -> crop ->
             views on the device) at 1 and 7 views, the bare forward (no taps) on device tensors, and the ceiling
             decode + forward sharing the GPU: 1 / (1/decode + 1/forward)
  resnet50   `build` end to end (read -> decode -> crop -> forward -> pool -> write) with --decode gpu (against that
             ceiling; the main thread's CPU us per image; wall against the chunk loop; the fixed cost to the first
             chunk beyond loading the model) and --decode cpu (against cores x one core's PIL decode + resize rate)
  views7     clean + gaussian_noise/gaussian_blur/brightness severities 1-2, end to end, vs bare / 7
  vit        ViT-B/16 clean end to end (--decode gpu) vs its own bare forward
  compile    ResNet-50 with --compile: img/s, its features against the eager store's, and a resume of two chunks
             (a new compile in this process) bit-identical to the uninterrupted compiled store
  baseline   with --baseline-site DIR (another featstore installed there): its 1-view and 7-view builds on the same
             files, side by side with this one's
  precision  fp16 autocast vs fp32 stores of ResNet-50: per-anchor relative error, probe accuracy per anchor
  resume     one build SIGKILLed after its first chunk, resumed, compared byte for byte with an uninterrupted one
  probe      `featstore probe` (linear) on 50k x 12 synthetic anchors of ResNet-50 widths, 1000 classes
  circuits   `featstore circuits` (EAP-IG) on ViT-B/16 for 64 images: seconds and peak GPU memory, end to
             end and for the scoring alone (bench/circuits.py's device_measurement)
Random weights (`--weights none`) throughout: weights do not change speed, and the machine has no network.

`--smoke` runs the same sections at toy sizes on the CPU (small models, 32 px crops, bf16 in place of fp16; the
compile section only checks that it is refused on a resume without --compile: inductor takes ~40 s on a CPU):
the test suite runs it, so the script cannot rot between GPU sessions.

On the GPU machine (torch 2.11 / torchvision 0.26 / timm / numpy / pillow / click / matplotlib / pyarrow / tqdm
there; zarr, numcodecs, donfig, google-crc32c and duckdb are not; obstore and polars are not needed: a local store
imports no obstore), bring those as wheels. Once, here, in the repository root (34 MB, under the 64 MiB that
travels):

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \\
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \\
        zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0 duckdb==2.0.1

then run it with the device tool: command `bash bench/device_check.sh`, carry [".whl"], timeout_s 600.
The wrapper installs the wheels and this package into /tmp/site and writes into $OUT; a folder `.baseline/`
(another featstore's source, carried too) is installed into /tmp/site-base and measured as the baseline.
Locally: `python bench/device_check.py --smoke --out /tmp/check`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
from featstore.images.datasets import discover
from featstore.images.views import parse_views
from featstore.runtime import resolve_device, tune_allocator
from featstore.workflows.build import BuildConfig, build

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the generated test data
from synthetic import class_image  # noqa: E402

RESNET50_DIMS = [64, 256, 256, 512, 512, 1024, 1024, 1024, 1024, 2048, 2048, 2048]
SEVEN_VIEWS = "clean,gaussian_noise-1,gaussian_noise-2,gaussian_blur-1,gaussian_blur-2,brightness-1,brightness-2"
IMAGE_SIZES = [(500, 375), (375, 500), (500, 333), (333, 500)]


@dataclass
class Sizes:
    """How big each section is: the full GPU run, or the smoke run on CPU."""

    images: int = 20_000
    classes: int = 10
    image_sizes: tuple = tuple(IMAGE_SIZES)
    cnn: str = "resnet50"
    vit: str = "vit_base_patch16_224"
    crop: int | None = None  # None: the models' own 224
    batch: int = 256
    chunk_rows: int = 1024
    cpu_decode_images: int = 10_000
    views_images: int = 4096
    vit_images: int = 10_000
    agreement_images: int = 2048
    agreement_chunk: int = 256
    bare_batches: int = 20
    probe_rows: int = 50_000
    probe_classes: int = 1000
    probe_dims: tuple = tuple(RESNET50_DIMS)
    circuit_model: str = "vit_base_patch16_224"
    circuit_images: int = 64
    circuit_batch: int = 32
    circuit_ig_steps: int = 5
    warmup_batches: int = 4
    read_threads: int = 16
    decode_batch: int = 256
    stage_images: int = 8192  # the input path alone, 1 view (7 views: views_images)
    compile_images: int = 10_240
    core_rate_images: int = 400  # one core's PIL decode + resize rate


SMOKE = Sizes(images=24, classes=3, image_sizes=((48, 40), (40, 48)), cnn="resnet18", vit="vit_tiny_patch16_224",
              crop=32, batch=4, chunk_rows=8, cpu_decode_images=8, views_images=4, vit_images=4,
              agreement_images=8, agreement_chunk=4, bare_batches=2, probe_rows=200, probe_classes=5,
              probe_dims=tuple(max(2, d // 64) for d in RESNET50_DIMS), circuit_model="vit_tiny_patch16_224",
              circuit_images=2, circuit_batch=2, circuit_ig_steps=1, warmup_batches=1, read_threads=2, decode_batch=4,
              stage_images=8, compile_images=8, core_rate_images=4)


def _write_images(job: tuple[Path, list[tuple[int, int]], int, tuple]) -> None:
    root, items, n_classes, sizes = job
    for index, label in items:
        rng = np.random.default_rng(index)
        folder = root / f"class_{label:02d}"
        class_image(label, n_classes, rng, sizes[index % len(sizes)]).save(folder / f"img_{index:06d}.jpg",
                                                                          "JPEG", quality=90)


def generate_images(root: Path, s: Sizes) -> dict:
    """ImageNet-sized JPEGs in an ImageFolder tree, written by a process per core."""
    start = time.perf_counter()
    for c in range(s.classes):
        (root / f"class_{c:02d}").mkdir(parents=True, exist_ok=True)
    items = [(i, i % s.classes) for i in range(s.images)]
    cores = os.cpu_count() or 1
    jobs = [(root, items[k::cores * 4], s.classes, s.image_sizes) for k in range(cores * 4)]
    with ProcessPoolExecutor(cores) as pool:
        list(pool.map(_write_images, jobs))
    megabytes = sum(p.stat().st_size for p in root.rglob("*.jpg")) / 1e6
    return {"images": s.images, "megabytes": round(megabytes, 1), "seconds": round(time.perf_counter() - start, 1),
            "cores": cores}


def run_build(data: Path, store: Path, model: str, s: Sizes, device: str, limit: int | None = None,
              workers: int | None = None, **overrides) -> dict:
    """One in-process `featstore build`; img/s over the chunk loop (decode -> forward -> pool -> write)."""
    # on a CPU the forward's float sums differ in the last bits across thread counts (docs/build.md), and the
    # policy picks the count from the load: pinned, a resumed build can be compared bit for bit with another
    run = RunOptions(device=device, batch_size=s.batch, progress=False, threads=1 if device == "cpu" else None,
                     workers=workers)
    cfg = BuildConfig(model=ModelSpec(model, "none", s.crop), images=ImageSource(data, limit=limit), store=store,
                      chunk_rows=s.chunk_rows, run=run, **overrides)
    start = time.perf_counter()
    result = build(cfg)
    wall = time.perf_counter() - start
    n = max(result.images_processed, 1)
    return {"images": result.images_processed, "loop_seconds": round(result.seconds, 2),
            "wall_seconds": round(wall, 2), "img_per_s": round(result.images_processed / result.seconds, 1),
            "bad": len(result.bad_images), "model_seconds": round(result.model_seconds, 2),
            "first_chunk_seconds": round(result.first_chunk_seconds, 2),
            "first_chunk_beyond_model_seconds": round(result.first_chunk_seconds - result.model_seconds, 2),
            "main_cpu_us_per_image": round(1e6 * result.main_cpu_seconds / n, 1),
            "wall_over_loop": round(wall / result.seconds, 3) if result.seconds else None}


def bare_forward(data: Path, model_name: str, s: Sizes, device: torch.device, precision: str) -> dict:
    """The model alone (no taps, no writes) on normalised channels_last tensors decoded beforehand, on the
    device: the ceiling the build's rate is compared with."""
    from featstore.images.tensor_input import TensorBatches
    from featstore.nets.models import load_model
    from featstore.workflows.build import preferred_memory_format

    loaded = load_model(model_name, "none", 0, s.crop)
    fmt = preferred_memory_format(loaded.module)
    model = loaded.module.to(device, memory_format=fmt)
    images = discover(data)
    plan = [list(range(i * s.batch, (i + 1) * s.batch)) for i in range(min(s.bare_batches, len(images) // s.batch))]
    crops = [b.views[0] for b in TensorBatches(images, loaded.preprocessing, parse_views("clean"), plan, device)]
    batches = [loaded.preprocessing.normalize(x).contiguous(memory_format=fmt) for x in crops]
    autocast = torch.autocast(device.type, dtype=torch.float16 if precision == "fp16" else torch.bfloat16,
                              enabled=precision in ("fp16", "bf16"))
    best = float("inf")
    with torch.inference_mode(), autocast:
        for x in batches[:2]:
            model(x)  # warm-up
        for _ in range(3):
            _sync(device)
            start = time.perf_counter()
            for x in batches:
                model(x)
            _sync(device)
            best = min(best, time.perf_counter() - start)
    n = len(batches) * s.batch
    return {"images": n, "seconds": round(best, 3), "img_per_s": round(n / best, 1), "precision": precision}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class GpuBusy:
    """Samples the GPU's utilisation (nvidia-smi's %, via NVML) every 50 ms on a thread while the block runs:
    how much of the time the device had work, where the rates alone cannot say why a build falls short."""

    def __init__(self, device: torch.device):
        self.device, self.samples, self.stop = device, [], None

    def __enter__(self) -> GpuBusy:
        import threading

        if self.device.type != "cuda":
            return self
        self.stop = threading.Event()

        def sample() -> None:
            while not self.stop.wait(0.05):
                try:
                    self.samples.append(torch.cuda.utilization(self.device))
                except Exception:  # no NVML: nothing to report
                    return

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.stop is not None:
            self.stop.set()
            self.thread.join()

    @property
    def percent(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 1) if self.samples else None


def profile_build(data: Path, work: Path, s: Sizes, device: torch.device, out: Path) -> dict:
    """A 1-view build with the main thread under cProfile: its top functions by own time, written to
    out/profile_main.txt (the profiler slows the main thread: for where the time goes, not for rates)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile(time.thread_time)
    import featstore.workflows.build as build_module

    inner = build_module._run_chunks

    def run_chunks(*args, **kwargs):
        profiler.enable()
        try:
            return inner(*args, **kwargs)
        finally:
            profiler.disable()

    build_module._run_chunks = run_chunks
    try:
        result = run_build(data, work / "profiled.zarr", s.cnn, s, str(device), limit=s.stage_images, decode="gpu")
    finally:
        build_module._run_chunks = inner
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    (out / "profile_main.txt").write_text(text.getvalue())
    return {"images": result["images"], "img_per_s_under_profiler": result["img_per_s"],
            "main_cpu_us_per_image_under_profiler": result["main_cpu_us_per_image"]}


def read_bytes(data: Path, s: Sizes, device: torch.device) -> dict:
    """The files' bytes alone: by `read_threads` threads of this process, and by the build's loader (its worker
    processes read and checksum, nothing decoded: the PIL fallback is off for JPEGs)."""
    from concurrent.futures import ThreadPoolExecutor

    from featstore.images.files import read_file
    from featstore.images.loading import default_workers
    from featstore.images.tensor_input import EncodedDataset

    images = discover(data)
    paths = [str(images.root / p) for p in images.paths]
    start = time.perf_counter()
    with ThreadPoolExecutor(s.read_threads) as pool:
        total = sum(len(b) for b in pool.map(read_file, paths, chunksize=64))
    threads = time.perf_counter() - start
    workers = default_workers(device, "gpu")
    dataset = EncodedDataset(images, _prep(s))
    plan = [list(range(i, min(len(images), i + s.batch))) for i in range(0, len(images), s.batch)]
    start = time.perf_counter()
    n = 0
    for batch in torch.utils.data.DataLoader(dataset, batch_sampler=plan, collate_fn=dataset.collate,
                                             num_workers=workers, prefetch_factor=4 if workers else None):
        n += len(batch.rows)
    loader = time.perf_counter() - start
    return {"images": len(paths), "bytes": total, "megabytes": round(total / 1e6, 1), "threads": s.read_threads,
            "threads_img_per_s": round(len(paths) / threads, 1), "threads_mb_per_s": round(total / 1e6 / threads, 1),
            "loader_workers": workers, "loader_img_per_s": round(n / loader, 1)}


def _prep(s: Sizes):
    from featstore.nets.models import load_model

    return load_model(s.cnn, "none", 0, s.crop).preprocessing


def decode_alone(data: Path, s: Sizes, device: torch.device) -> dict:
    """nvJPEG's batched decode of bytes already in memory (`decode_batch` a call), nothing else."""
    from torchvision.io import ImageReadMode, decode_jpeg

    images = discover(data)
    blobs = [torch.frombuffer(bytearray((images.root / p).read_bytes()), dtype=torch.uint8)
             for p in images.paths[: s.stage_images]]
    decode_jpeg(blobs[: s.decode_batch], mode=ImageReadMode.RGB, device=device)  # warm-up
    _sync(device)
    start = time.perf_counter()
    for i in range(0, len(blobs), s.decode_batch):
        decode_jpeg(blobs[i : i + s.decode_batch], mode=ImageReadMode.RGB, device=device)
    _sync(device)
    seconds = time.perf_counter() - start
    return {"images": len(blobs), "img_per_s": round(len(blobs) / seconds, 1), "batch": s.decode_batch}


def input_alone(data: Path, s: Sizes, device: torch.device, views: str, images_n: int) -> dict:
    """The build's input path without the forward: read, decode, resize, crop and every view, on the device."""
    from featstore.images.tensor_input import TensorBatches

    images = discover(data)
    n = min(images_n, len(images))
    plan = [list(range(i, min(n, i + s.batch))) for i in range(0, n, s.batch)]
    batches = TensorBatches(images, _prep(s), parse_views(views), plan, device)
    start = time.perf_counter()
    for _ in batches:
        pass
    _sync(device)
    seconds = time.perf_counter() - start
    return {"images": n, "views": views.count(",") + 1, "img_per_s": round(n / seconds, 1),
            "bytes_to_device_per_image": round(batches.transferred / n), "counts": batches.counts}


def one_core_pil_rate(data: Path, s: Sizes) -> float:
    """Images per second one core decodes, resizes and crops with PIL (the --decode cpu workers' work)."""
    from featstore.images.tensor_input import pil_crop

    images = discover(data)
    blobs = [(images.root / p).read_bytes() for p in images.paths[: s.core_rate_images]]
    prep = _prep(s)
    start = time.process_time()
    for b in blobs:
        pil_crop(b, prep)
    return len(blobs) / (time.process_time() - start)


def stages(data: Path, s: Sizes, device: torch.device) -> dict:
    read = read_bytes(data, s, device)
    decode = decode_alone(data, s, device)
    one = input_alone(data, s, device, "clean", s.stage_images)
    seven = input_alone(data, s, device, SEVEN_VIEWS, s.views_images)
    bare = bare_forward(data, s.cnn, s, device, "fp16" if device.type == "cuda" else "fp32")
    ceiling = 1 / (1 / decode["img_per_s"] + 1 / bare["img_per_s"])
    return {"read": read, "decode": decode, "input_1_view": one, "input_7_views": seven, "bare_forward": bare,
            "decode_plus_forward_ceiling": round(ceiling, 1)}


def anchor_agreement(a: Path, b: Path, key: str) -> list[dict]:
    """Per anchor: relative error ||x_a - x_b|| / ||x_b|| over the whole anchor, and the worst row's."""
    from featstore.store.reader import FeatureStore

    fa, fb = FeatureStore(a), FeatureStore(b)
    out = []
    for anchor in fb.anchors(key):
        x = fa.read(key, "clean", anchor.name).astype(np.float64)
        y = fb.read(key, "clean", anchor.name).astype(np.float64)
        rows = np.linalg.norm(x - y, axis=1) / np.maximum(np.linalg.norm(y, axis=1), 1e-12)
        out.append({"anchor": anchor.name, "rel_error": float(np.linalg.norm(x - y) / np.linalg.norm(y)),
                    "worst_row_rel_error": float(rows.max())})
    return out


def probe_accuracies(store: Path, key: str, db: Path, device: str) -> tuple[list[float], float]:
    from featstore.analytics import db as fsdb
    from featstore.compute.specs import RunOptions
    from featstore.workflows.probe import ProbeConfig, probe

    start = time.perf_counter()
    probe(ProbeConfig(store=store, model=key, db=db, run=RunOptions(device=device, progress=False)))
    seconds = time.perf_counter() - start
    con = fsdb.connect(db, read_only=True)
    accs = [a for (a,) in con.execute("SELECT accuracy FROM probe_accuracy() ORDER BY anchor").fetchall()]
    con.close()
    return accs, seconds


def kill_and_resume(data: Path, reference: Path, work: Path, args: list[str],
                    resume: Callable[[Path], str] | None = None) -> dict:
    """SIGKILL a CLI build as soon as its first chunk is done, resume it (in a new process, or with `resume`
    in this one), compare every array of the build with `reference` (the probes written there are not)."""
    import zarr

    store = work / "killed.zarr"
    cmd = [sys.executable, "-m", "featstore.cli.main", "build", "--data", str(data), "--store", str(store), *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done_dir = store / reference_key(reference) / "clean" / "done" / "c"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        if done_dir.is_dir() and any(done_dir.iterdir()):
            break
        time.sleep(0.002)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_at_kill = len(list(done_dir.glob("*"))) if done_dir.is_dir() else 0
    if resume is not None:
        resume_output = resume(store)
    else:
        resumed = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if resumed.returncode != 0:
            raise RuntimeError(f"resume failed: {resumed.stderr[-2000:]}")
        resume_output = resumed.stdout.strip()

    def arrays(path: Path) -> dict:
        root = zarr.open_group(str(path), mode="r")
        return {n: a[:] for n, a in root.members(max_depth=None) if isinstance(a, zarr.Array) and "/probes/" not in n}

    x, y = arrays(store), arrays(reference)
    differ = sorted(n for n in set(x) | set(y) if n not in x or n not in y or x[n].tobytes() != y[n].tobytes())
    return {"killed": killed, "chunks_done_at_kill": done_at_kill, "resume_output": resume_output,
            "bit_identical": not differ, "differing_arrays": differ[:10]}


def reference_key(store: Path) -> str:
    from featstore.store.reader import FeatureStore

    return FeatureStore(store).models()[0]


def synthetic_probe(work: Path, s: Sizes, device: str) -> dict:
    from synthetic import class_clusters, write_feature_store

    from featstore.compute.specs import RunOptions
    from featstore.workflows.probe import ProbeConfig, probe

    start = time.perf_counter()
    feats, labels = class_clusters(s.probe_rows, s.probe_classes, list(s.probe_dims))
    write_feature_store(work / "probe.zarr", feats, labels, s.probe_classes)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    probe(ProbeConfig(store=work / "probe.zarr", model="synthetic", db=work / "probe.duckdb",
                      run=RunOptions(device=device, progress=False)))
    return {"rows": s.probe_rows, "anchors": len(s.probe_dims), "classes": s.probe_classes,
            "dims": list(s.probe_dims), "store_setup_seconds": round(setup, 1),
            "probe_seconds": round(time.perf_counter() - start, 1)}


def circuits(data: Path, s: Sizes, device: torch.device) -> dict:
    from featstore.compute.attribution import CircuitConfig, compute_circuit

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cfg = CircuitConfig(model=ModelSpec(s.circuit_model, "none", s.crop),
                        images=ImageSource(data, limit=s.circuit_images), ig_steps=s.circuit_ig_steps,
                        run=RunOptions(device=str(device), batch_size=s.circuit_batch, progress=False))
    start = time.perf_counter()
    result = compute_circuit(cfg)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    out = {"model": s.circuit_model, "images": s.circuit_images, "edges": len(result.edges),
           "seconds": round(seconds, 1), "peak_gpu_gib": None if peak is None else round(peak, 2)}
    if device.type == "cuda":  # the scoring alone, as bench/circuits.py measures it (ViT-B/16, 64 images)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from circuits import device_measurement

        out["eap_ig_scoring"] = device_measurement(device=str(device))
    return out


SECTIONS = ("images", "warm-up", "stages", "resnet50", "views7", "vit", "baseline", "precision", "resume", "compile",
            "probe", "circuits")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--smoke", action="store_true", help="toy sizes on the CPU (the test suite runs this)")
    parser.add_argument("--images", type=int, help="override the number of generated JPEGs")
    parser.add_argument("--work", type=Path, help="scratch folder [default: a temporary one, removed after]")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="which sections, comma-separated")
    parser.add_argument("--baseline-site", type=Path, help="a folder where another featstore is installed")
    args = parser.parse_args(argv)
    s = SMOKE if args.smoke else Sizes()
    if args.images:
        s.images = args.images
    chosen = [n.strip() for n in args.sections.split(",") if n.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}: choose from {', '.join(SECTIONS)}")
    device = resolve_device("cpu" if args.smoke else "auto")
    fast = "fp16" if device.type == "cuda" else "bf16"
    tune_allocator()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="featstore-check-"))
    data = work / "images"
    report: dict = {"environment": _environment(device), "smoke": args.smoke, "sections": {}}
    started = time.perf_counter()

    def section(name: str, fn: Callable[[], dict]) -> dict | None:
        if name not in chosen:
            return None
        print(f"[{time.perf_counter() - started:6.1f}s] {name} ...", flush=True)
        start = time.perf_counter()
        try:
            out = fn()
        except Exception as e:
            traceback.print_exc()
            out = {"error": f"{type(e).__name__}: {e}"}
        out["section_seconds"] = round(time.perf_counter() - start, 1)
        report["sections"][name] = out
        _write(args.out, report)
        return out

    cnn = s.cnn
    section("images", lambda: generate_images(data, s))
    section("warm-up", lambda: run_build(data, work / "warm.zarr", cnn, s, str(device),
                                         limit=s.warmup_batches * s.batch, decode="gpu"))
    st = section("stages", lambda: stages(data, s, device)) or {}

    def resnet() -> dict:
        with GpuBusy(device) as busy:
            gpu = run_build(data, work / "gpu.zarr", cnn, s, str(device), decode="gpu")
        gpu["gpu_busy_percent"] = busy.percent
        profiled = profile_build(data, work, s, device, args.out)
        cpu = run_build(data, work / "cpu.zarr", cnn, s, str(device), limit=s.cpu_decode_images, decode="cpu",
                        workers=None if device.type == "cuda" else 2)
        core = one_core_pil_rate(data, s)
        cores = os.cpu_count() or 1
        out = {"model": cnn, "decode_gpu": gpu, "profiled": profiled, "decode_cpu": cpu,
               "one_core_pil_img_per_s": round(core, 1),
               "cpu_over_cores_x_one_core": round(cpu["img_per_s"] / (cores * core), 3)}
        if "decode_plus_forward_ceiling" in st:
            out["gpu_over_ceiling"] = round(gpu["img_per_s"] / st["decode_plus_forward_ceiling"], 3)
            out["gpu_over_bare"] = round(gpu["img_per_s"] / st["bare_forward"]["img_per_s"], 3)
        return out

    section("resnet50", resnet)

    def views() -> dict:
        with GpuBusy(device) as busy:
            out = run_build(data, work / "views.zarr", cnn, s, str(device), limit=s.views_images, views=SEVEN_VIEWS,
                            decode="gpu")
        out["gpu_busy_percent"] = busy.percent
        bare = st.get("bare_forward", {}).get("img_per_s")
        out["views"] = SEVEN_VIEWS
        out["over_bare_div_7"] = round(out["img_per_s"] / (bare / 7), 3) if bare else None
        return out

    section("views7", views)

    def vit() -> dict:
        out = {"model": s.vit, **run_build(data, work / "vit.zarr", s.vit, s, str(device), limit=s.vit_images,
                                           decode="gpu")}
        bare = bare_forward(data, s.vit, s, device, "fp16" if device.type == "cuda" else "fp32")
        return {**out, "bare_forward": bare, "over_bare": round(out["img_per_s"] / bare["img_per_s"], 3)}

    section("vit", vit)
    section("baseline", lambda: baseline(data, work, s, device, args.baseline_site))

    agree_args = ["--model", cnn, "--weights", "none", "--limit", str(s.agreement_images), "--chunk-rows",
                  str(s.agreement_chunk), "--batch-size", str(s.batch), "--decode", "gpu", "--device", str(device),
                  "--no-progress"] + (["--image-size", str(s.crop)] if s.crop else []) + \
        (["--threads", "1"] if str(device) == "cpu" else [])  # as run_build pins it
    sizes_agree = Sizes(**{**s.__dict__, "chunk_rows": s.agreement_chunk})
    low = work / f"{fast}.zarr"

    def build_low() -> None:
        run_build(data, low, cnn, sizes_agree, str(device), limit=s.agreement_images, decode="gpu", precision=fast)

    def precision() -> dict:
        full = work / "fp32.zarr"
        build_low()
        run_build(data, full, cnn, sizes_agree, str(device), limit=s.agreement_images, decode="gpu",
                  precision="fp32")
        key = reference_key(full)
        errors = anchor_agreement(low, full, key)
        acc_low, _ = probe_accuracies(low, key, work / "low.duckdb", str(device))
        acc_full, _ = probe_accuracies(full, key, work / "full.duckdb", str(device))
        for e, a, b in zip(errors, acc_low, acc_full, strict=True):
            e[f"probe_acc_{fast}"], e["probe_acc_fp32"], e["acc_diff_pp"] = a, b, round(100 * (a - b), 2)
        return {"compared": f"{fast} autocast vs fp32", "images": s.agreement_images, "anchors": errors}

    section("precision", precision)

    def resume_here(store: Path) -> str:  # smoke: spare a second interpreter start-up
        out = run_build(data, store, cnn, sizes_agree, str(device), limit=s.agreement_images, decode="gpu",
                        precision=fast)
        return f"{out['images']} images rebuilt in this process"

    def resume() -> dict:
        if not low.exists():  # the precision section made it, unless it was not chosen
            build_low()
        return kill_and_resume(data, low, work, agree_args + ["--precision", fast],
                               resume_here if args.smoke else None)

    section("resume", resume)
    section("compile", lambda: compiled(data, work, s, device, args.smoke))
    section("probe", lambda: synthetic_probe(work, s, str(device)))
    section("circuits", lambda: circuits(data, s, device))
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    _write(args.out, report)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print((args.out / "device_check.md").read_text())
    return report


def compiled(data: Path, work: Path, s: Sizes, device: torch.device, smoke: bool) -> dict:
    """`--compile`: its rate, its features against the eager store's (same images), and two of its chunks made
    again by a second compile in this process, bit-identical. On the CPU (smoke) only the refusal of a resume
    that does not match the store's setting is run: inductor's compile takes ~40 s there."""
    import zarr

    from featstore.errors import FeatstoreError
    from featstore.store.reader import FeatureStore

    store = work / "compiled.zarr"
    if smoke:
        run_build(data, store, s.cnn, s, str(device), limit=s.compile_images)
        try:
            run_build(data, store, s.cnn, s, str(device), limit=s.compile_images, compile=True)
        except FeatstoreError as e:
            return {"refused": "different compiled" in str(e)}
        return {"refused": False}
    out = run_build(data, store, s.cnn, s, str(device), limit=s.compile_images, decode="gpu", compile=True)
    eager = work / "compiled-eager.zarr"
    run_build(data, eager, s.cnn, s, str(device), limit=s.compile_images, decode="gpu")
    key = reference_key(store)
    out["rel_error_vs_eager"] = max(a["rel_error"] for a in anchor_agreement(store, eager, key))
    copy = work / "compiled-resumed.zarr"
    shutil.copytree(store, copy)
    group = zarr.open_group(str(copy), mode="a")[key]["clean"]
    for chunk in (1, 3):
        group["done"][chunk] = False
        rows = slice(chunk * s.chunk_rows, (chunk + 1) * s.chunk_rows)
        for _, array in list(group["anchors"].members()) + [("logits", group["logits"])]:
            array[rows] = 0
    torch._dynamo.reset()  # a second compile, as a resumed process makes
    run_build(data, copy, s.cnn, s, str(device), limit=s.compile_images, decode="gpu", compile=True)
    a, b = FeatureStore(copy), FeatureStore(store)
    same = all(a.read(key, "clean", x.name).tobytes() == b.read(key, "clean", x.name).tobytes()
               for x in b.anchors(key)) and a.read_logits(key, "clean").tobytes() == b.read_logits(key,
                                                                                               "clean").tobytes()
    return {**out, "resumed_bit_identical": same}


BASELINE_BUILD = """
import json, sys, time
from pathlib import Path
from featstore.compute.specs import ImageSource, ModelSpec, RunOptions
from featstore.workflows.build import BuildConfig, build
data, store, model, views, limit, batch, chunk, device, crop = sys.argv[1:10]
cfg = BuildConfig(model=ModelSpec(model, "none", int(crop) or None), images=ImageSource(Path(data), limit=int(limit)),
                  store=Path(store), views=views, chunk_rows=int(chunk), decode="gpu",
                  run=RunOptions(device=device, batch_size=int(batch), progress=False))
start = time.perf_counter()
result = build(cfg)
print(json.dumps({"images": result.images_processed, "img_per_s": round(result.images_processed / result.seconds, 1),
                  "wall_seconds": round(time.perf_counter() - start, 2)}))
"""


def baseline(data: Path, work: Path, s: Sizes, device: torch.device, site: Path | None) -> dict:
    """Another featstore (installed in `site`) building the same files, 1 view and 7 views, in a process of its
    own; beside this one's rates (the resnet50 and views7 sections)."""
    if site is None:
        return {"skipped": "no --baseline-site"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    out = {}
    for name, views, limit in (("one_view", "clean", s.images), ("seven_views", SEVEN_VIEWS, s.views_images)):
        argv = [str(data), str(work / f"base-{name}.zarr"), s.cnn, views, str(limit), str(s.batch),
                str(s.chunk_rows), str(device), str(s.crop or 0)]
        proc = subprocess.run([sys.executable, "-c", BASELINE_BUILD, *argv], env=env, capture_output=True, text=True,
                              cwd=tempfile.gettempdir())
        if proc.returncode:
            raise RuntimeError(f"baseline {name}: {proc.stderr[-2000:]}")
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _environment(device: torch.device) -> dict:
    import torchvision

    env = {"device": str(device), "torch": torch.__version__, "torchvision": torchvision.__version__,
           "python": platform.python_version(), "cpu_cores": os.cpu_count()}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def _write(out: Path, report: dict) -> None:
    (out / "device_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "device_check.md").write_text(markdown(report))


def markdown(report: dict) -> str:
    """The Markdown tables: the stage table, then one line per measurement with its target beside it."""
    env, sec = report["environment"], report["sections"]
    lines = [f"device check on {env.get('gpu', env['device'])}, torch {env['torch']}, torchvision "
             f"{env['torchvision']}, {env['cpu_cores']} CPU cores{' (SMOKE sizes)' if report['smoke'] else ''}", ""]

    def ok(name: str) -> dict:
        out = sec.get(name, {})
        return out if out and "error" not in out else {}

    st = ok("stages")
    if st:
        r, one, seven = st["read"], st["input_1_view"], st["input_7_views"]
        lines += ["| stage (ResNet-50 input, no store) | img/s | note |", "| --- | --- | --- |",
                  f"| files' bytes read, {r['threads']} threads | {r['threads_img_per_s']} | {r['threads_mb_per_s']} "
                  f"MB/s, {r['megabytes']} MB |",
                  f"| files' bytes read + checksummed, {r['loader_workers']} loader processes | "
                  f"{r['loader_img_per_s']} | |",
                  f"| decode alone (batched, {st['decode']['batch']} a call) | {st['decode']['img_per_s']} | |",
                  f"| input path alone, 1 view | {one['img_per_s']} | {one['bytes_to_device_per_image']} bytes to the "
                  f"device per image |",
                  f"| input path alone, 7 views | {seven['img_per_s']} | {seven['bytes_to_device_per_image']} bytes to "
                  f"the device per image |",
                  f"| bare forward ({st['bare_forward']['precision']}) | {st['bare_forward']['img_per_s']} | |",
                  f"| decode + forward ceiling | {st['decode_plus_forward_ceiling']} | 1/(1/decode + 1/forward) |", ""]
    lines += ["| measurement | value | target |", "| --- | --- | --- |"]

    def row(what: str, value, target: str = "") -> None:
        lines.append(f"| {what} | {value} | {target} |")

    for name, out in sec.items():
        if "error" in out:
            row(f"{name}: FAILED", out["error"][:200])
    if ok("images"):
        im = sec["images"]
        row("generated JPEGs", f"{im['images']} ({im['megabytes']} MB) in {im['seconds']} s")
    rn = ok("resnet50")
    if rn:
        gpu, cpu = rn["decode_gpu"], rn["decode_cpu"]
        row(f"{rn['model']} end to end, --decode gpu", f"{gpu['img_per_s']} img/s (GPU busy "
            f"{gpu.get('gpu_busy_percent')}% of the build)", "~7,000 (10,000 compiled)")
        if "gpu_over_ceiling" in rn:
            row("--decode gpu / decode+forward ceiling", rn["gpu_over_ceiling"], ">= 0.85")
            row("--decode gpu / bare forward", rn["gpu_over_bare"])
        row("main thread CPU per image, --decode gpu", f"{gpu['main_cpu_us_per_image']} µs", "<= 50 µs")
        row("build wall / chunk loop", gpu["wall_over_loop"], "<= 1.15 (50k images)")
        row("first chunk, beyond loading the model", f"{gpu['first_chunk_beyond_model_seconds']} s "
            f"(model {gpu['model_seconds']} s)", "<= 1.5 s")
        row(f"{rn['model']} end to end, --decode cpu", f"{cpu['img_per_s']} img/s "
            f"(one core's PIL decode+resize: {rn['one_core_pil_img_per_s']} img/s)")
        row("--decode cpu / (cores x one core)", rn["cpu_over_cores_x_one_core"], ">= 0.8")
    v = ok("views7")
    if v:
        row("7 views end to end", f"{v['img_per_s']} img/s ({7 * v['img_per_s']:.0f} forwards/s; GPU busy "
            f"{v.get('gpu_busy_percent')}%)")
        row("7 views / (bare forward / 7)", v["over_bare_div_7"], ">= 0.85")
    vit = ok("vit")
    if vit:
        row(f"{vit['model']} end to end, --decode gpu", f"{vit['img_per_s']} img/s")
        row(f"{vit['model']} / its bare forward", vit["over_bare"], ">= 0.9")
    c = ok("compile")
    if c and "img_per_s" in c:
        row(f"--compile end to end ({c['images']} images; compile in set-up)", f"{c['img_per_s']} img/s, wall "
            f"{c['wall_seconds']} s", "10,000 (moonshot)")
        row("--compile vs eager: worst anchor relative error", f"{c['rel_error_vs_eager']:.2e}")
        row("--compile: two chunks resumed by a new compile, bit-identical", c["resumed_bit_identical"], "True")
    elif c:
        row("--compile: a resume without it refused", c["refused"], "True")
    b = ok("baseline")
    if b and "one_view" in b:
        row("baseline featstore, 1 view", f"{b['one_view']['img_per_s']} img/s")
        row("baseline featstore, 7 views", f"{b['seven_views']['img_per_s']} img/s")
    p = ok("precision")
    if p:
        worst = max(p["anchors"], key=lambda a: a["rel_error"])
        diff = max(p["anchors"], key=lambda a: abs(a["acc_diff_pp"]))
        row(f"{p['compared']}: worst anchor relative error", f"{worst['rel_error']:.2e} ({worst['anchor']})")
        row(f"{p['compared']}: largest probe accuracy difference", f"{diff['acc_diff_pp']:+.2f} pp ({diff['anchor']})")
    r = ok("resume")
    if r:
        row("SIGKILL + resume bit-identical", f"{r['bit_identical']} (killed: {r['killed']}, "
            f"{r['chunks_done_at_kill']} chunk(s) done at kill)", "True")
    pr = ok("probe")
    if pr:
        row(f"probe, {pr['rows']} x {pr['anchors']} anchors, {pr['classes']} classes", f"{pr['probe_seconds']} s")
    c = ok("circuits")
    if c:
        row(f"circuits {c['model']}, {c['images']} images", f"{c['seconds']} s, peak GPU {c['peak_gpu_gib']} GiB")
        if "eap_ig_scoring" in c:
            e = c["eap_ig_scoring"]
            row("EAP-IG scoring (bench/circuits.py), per 64 images",
                f"{e['seconds_per_64_images']:.1f} s, peak GPU {e['peak_gpu_gib']:.2f} GiB")
    if "total_seconds" in report:
        row("whole check", f"{report['total_seconds']} s", "< 480")
    if p and "anchors" in p:
        lines += ["", f"| anchor | rel. error {p['compared']} | worst row | probe acc diff (pp) |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| {a['anchor']} | {a['rel_error']:.2e} | {a['worst_row_rel_error']:.2e} | {a['acc_diff_pp']:+.2f} |"
                  for a in p["anchors"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
