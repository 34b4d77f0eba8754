"""Every GPU measurement of featstore in one run (< 8 minutes on one H200), written to --out DIR as
device_check.json and device_check.md.

Sections, each timed and recorded even when another fails:
  images     ~20k ImageNet-sized JPEGs (500x375, 375x500, 500x333; 10 classes) generated with every CPU core
  resnet50   `build` end to end (read -> decode -> crop -> forward -> pool -> write) with --decode gpu and
             --decode cpu, and the bare forward (no taps) on pre-decoded device tensors in the same process
  views7     clean + gaussian_noise/gaussian_blur/brightness severities 1-2 on the tensor path, vs bare / 7
  vit        ViT-B/16 clean end to end (--decode gpu)
  precision  fp16 autocast vs fp32 stores of ResNet-50: per-anchor relative error, probe accuracy per anchor
  resume     one build SIGKILLed after its first chunk, resumed, compared byte for byte with an uninterrupted one
  probe      `featstore probe` (linear) on 50k x 12 synthetic anchors of ResNet-50 widths, 1000 classes
  circuits   `featstore circuits` (EAP-IG) on ViT-B/16 for 64 images: seconds and peak GPU memory, end to
             end and for the scoring alone (bench/circuits.py's device_measurement)
Random weights (`--weights none`) throughout: weights do not change speed, and the machine has no network.

`--smoke` runs the same sections at toy sizes on the CPU (small models, 32 px crops, bf16 in place of fp16):
the test suite runs it, so the script cannot rot between GPU sessions.

On the GPU machine (torch 2.11 / torchvision 0.26 / timm there; zarr, numcodecs and duckdb are not), bring
those as wheels. Once, here, in the repository root (34 MB, under the 64 MiB that travels):

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \\
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \\
        zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0 duckdb==2.0.1

then run it with the device tool: command `bash bench/device_check.sh`, carry [".whl"], timeout_s 600.
The wrapper installs the wheels and this package into /tmp/site and writes into $OUT.
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


SMOKE = Sizes(images=24, classes=3, image_sizes=((48, 40), (40, 48)), cnn="resnet18", vit="vit_tiny_patch16_224",
              crop=32, batch=4, chunk_rows=8, cpu_decode_images=8, views_images=4, vit_images=4,
              agreement_images=8, agreement_chunk=4, bare_batches=2, probe_rows=200, probe_classes=5,
              probe_dims=tuple(max(2, d // 64) for d in RESNET50_DIMS), circuit_model="vit_tiny_patch16_224",
              circuit_images=2, circuit_batch=2, circuit_ig_steps=1, warmup_batches=1)


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
              **overrides) -> dict:
    """One in-process `featstore build`; img/s over the chunk loop (decode -> forward -> pool -> write)."""
    # on a CPU the forward's float sums differ in the last bits across thread counts (docs/build.md), and the
    # policy picks the count from the load: pinned, a resumed build can be compared bit for bit with another
    run = RunOptions(device=device, batch_size=s.batch, progress=False, threads=1 if device == "cpu" else None)
    cfg = BuildConfig(model=ModelSpec(model, "none", s.crop), images=ImageSource(data, limit=limit), store=store,
                      chunk_rows=s.chunk_rows, run=run, **overrides)
    start = time.perf_counter()
    result = build(cfg)
    wall = time.perf_counter() - start
    return {"images": result.images_processed, "loop_seconds": round(result.seconds, 2),
            "wall_seconds": round(wall, 2), "img_per_s": round(result.images_processed / result.seconds, 1),
            "bad": len(result.bad_images)}


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
    crops = [b[1][0] for b in TensorBatches(images, loaded.preprocessing, parse_views("clean"), plan, device)]
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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--smoke", action="store_true", help="toy sizes on the CPU (the test suite runs this)")
    parser.add_argument("--images", type=int, help="override the number of generated JPEGs")
    parser.add_argument("--work", type=Path, help="scratch folder [default: a temporary one, removed after]")
    args = parser.parse_args(argv)
    s = SMOKE if args.smoke else Sizes()
    if args.images:
        s.images = args.images
    device = resolve_device("cpu" if args.smoke else "auto")
    fast = "fp16" if device.type == "cuda" else "bf16"
    tune_allocator()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="featstore-check-"))
    data = work / "images"
    report: dict = {"environment": _environment(device), "smoke": args.smoke, "sections": {}}
    started = time.perf_counter()

    def section(name: str, fn: Callable[[], dict]) -> dict | None:
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

    def resnet() -> dict:
        gpu = run_build(data, work / "gpu.zarr", cnn, s, str(device), decode="gpu")
        cpu = run_build(data, work / "cpu.zarr", cnn, s, str(device), limit=s.cpu_decode_images, decode="cpu")
        bare = bare_forward(data, cnn, s, device, "fp16" if device.type == "cuda" else "fp32")
        return {"model": cnn, "decode_gpu": gpu, "decode_cpu": cpu, "bare_forward": bare,
                "gpu_over_bare": round(gpu["img_per_s"] / bare["img_per_s"], 3),
                "cpu_over_bare": round(cpu["img_per_s"] / bare["img_per_s"], 3)}

    rn = section("resnet50", resnet)

    def views() -> dict:
        out = run_build(data, work / "views.zarr", cnn, s, str(device), limit=s.views_images, views=SEVEN_VIEWS,
                        decode="gpu")
        bare = (rn or {}).get("bare_forward", {}).get("img_per_s")
        out["views"] = SEVEN_VIEWS
        out["over_bare_div_7"] = round(out["img_per_s"] / (bare / 7), 3) if bare else None
        return out

    section("views7", views)
    section("vit", lambda: {"model": s.vit, **run_build(data, work / "vit.zarr", s.vit, s, str(device),
                                                          limit=s.vit_images, decode="gpu")})

    agree_args = ["--model", cnn, "--weights", "none", "--limit", str(s.agreement_images), "--chunk-rows",
                  str(s.agreement_chunk), "--batch-size", str(s.batch), "--decode", "gpu", "--device", str(device),
                  "--no-progress"] + (["--image-size", str(s.crop)] if s.crop else []) + \
        (["--threads", "1"] if str(device) == "cpu" else [])  # as run_build pins it
    sizes_agree = Sizes(**{**s.__dict__, "chunk_rows": s.agreement_chunk})

    def precision() -> dict:
        low, full = work / f"{fast}.zarr", work / "fp32.zarr"
        run_build(data, low, cnn, sizes_agree, str(device), limit=s.agreement_images, decode="gpu", precision=fast)
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

    section("resume", lambda: kill_and_resume(data, work / f"{fast}.zarr", work, agree_args + ["--precision", fast],
                                              resume_here if args.smoke else None))
    section("probe", lambda: synthetic_probe(work, s, str(device)))
    section("circuits", lambda: circuits(data, s, device))
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    _write(args.out, report)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print((args.out / "device_check.md").read_text())
    return report


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
    """The Markdown table: one line per measurement, with its target beside it."""
    env, sec = report["environment"], report["sections"]
    lines = [f"device check on {env.get('gpu', env['device'])}, torch {env['torch']}, torchvision "
             f"{env['torchvision']}, {env['cpu_cores']} CPU cores{' (SMOKE sizes)' if report['smoke'] else ''}", "",
             "| measurement | value | target |", "| --- | --- | --- |"]

    def row(what: str, value, target: str = "") -> None:
        lines.append(f"| {what} | {value} | {target} |")

    for name, out in sec.items():
        if "error" in out:
            row(f"{name}: FAILED", out["error"][:200])
    if "error" not in sec.get("images", {"error": 1}):
        im = sec["images"]
        row("generated JPEGs", f"{im['images']} ({im['megabytes']} MB) in {im['seconds']} s")
    rn = sec.get("resnet50", {})
    if "error" not in rn and rn:
        row(f"{rn['model']} end to end, --decode gpu", f"{rn['decode_gpu']['img_per_s']} img/s", ">= 4000 (6000)")
        row(f"{rn['model']} end to end, --decode cpu", f"{rn['decode_cpu']['img_per_s']} img/s")
        row(f"{rn['model']} bare forward ({rn['bare_forward']['precision']})",
            f"{rn['bare_forward']['img_per_s']} img/s")
        row("decode gpu / bare forward", rn["gpu_over_bare"], ">= 0.90")
        row("decode cpu / bare forward", rn["cpu_over_bare"])
    v = sec.get("views7", {})
    if "error" not in v and v:
        row("7 views end to end", f"{v['img_per_s']} img/s ({7 * v['img_per_s']:.0f} forwards/s)")
        row("7 views / (bare forward / 7)", v["over_bare_div_7"], ">= 0.85")
    vit = sec.get("vit", {})
    if "error" not in vit and vit:
        row(f"{vit['model']} end to end, --decode gpu", f"{vit['img_per_s']} img/s", ">= 2000")
    p = sec.get("precision", {})
    if "error" not in p and p:
        worst = max(p["anchors"], key=lambda a: a["rel_error"])
        diff = max(p["anchors"], key=lambda a: abs(a["acc_diff_pp"]))
        row(f"{p['compared']}: worst anchor relative error", f"{worst['rel_error']:.2e} ({worst['anchor']})")
        row(f"{p['compared']}: largest probe accuracy difference", f"{diff['acc_diff_pp']:+.2f} pp ({diff['anchor']})")
    r = sec.get("resume", {})
    if "error" not in r and r:
        row("SIGKILL + resume bit-identical", f"{r['bit_identical']} (killed: {r['killed']}, "
            f"{r['chunks_done_at_kill']} chunk(s) done at kill)", "True")
    pr = sec.get("probe", {})
    if "error" not in pr and pr:
        row(f"probe, {pr['rows']} x {pr['anchors']} anchors, {pr['classes']} classes", f"{pr['probe_seconds']} s")
    c = sec.get("circuits", {})
    if "error" not in c and c:
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
