"""Generated image sets with class structure, for tests, benchmarks and the offline demo.

Each class has its own hue, stripe frequency and orientation; each image adds random placement and noise.
Files are real JPEGs (or PNGs) in an ImageFolder tree, so they go through the same loading code as ImageNet.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def class_image(label: int, n_classes: int, rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    angle = np.pi * label / n_classes + rng.normal(0, 0.05)
    freq = 0.02 + 0.08 * ((label * 7) % n_classes) / max(1, n_classes - 1)
    phase = rng.uniform(0, 2 * np.pi)
    stripes = 0.5 + 0.5 * np.sin(freq * (xx * np.cos(angle) + yy * np.sin(angle)) + phase)
    hue = np.array([np.cos(2 * np.pi * label / n_classes), np.cos(2 * np.pi * label / n_classes + 2.1),
                    np.cos(2 * np.pi * label / n_classes + 4.2)], dtype=np.float32) * 0.35 + 0.5
    img = stripes[..., None] * hue[None, None, :] + rng.normal(0, 0.08, (h, w, 3)).astype(np.float32)
    cy, cx, r = rng.uniform(0.3, 0.7) * h, rng.uniform(0.3, 0.7) * w, rng.uniform(0.1, 0.25) * min(w, h)
    blob = ((yy - cy) ** 2 + (xx - cx) ** 2) < r**2
    img[blob] = 1.0 - hue
    return Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8))


def make_image_folder(root: str | Path, n_classes: int = 4, per_class: int = 8, size: tuple[int, int] = (64, 48),
                      seed: int = 0, fmt: str = "JPEG") -> Path:
    """Write root/class_XX/img_YYYY.jpg and return root; same arguments give the same files."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    ext = ".jpg" if fmt.upper() == "JPEG" else f".{fmt.lower()}"
    for label in range(n_classes):
        folder = root / f"class_{label:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for j in range(per_class):
            class_image(label, n_classes, rng, size).save(folder / f"img_{j:04d}{ext}", fmt, quality=90)
    return root


def class_clusters(n: int, n_classes: int, dims: list[int], seed: int = 0,
                   separation: tuple[float, float] = (0.6, 3.0)) -> tuple[list[np.ndarray], np.ndarray]:
    """Anchor features with known structure: per anchor, rectified Gaussian class clusters whose separation
    grows with depth, with very different per-feature scales (as pooled activations have).

    Anchor a has class-mean distance ~ separation interpolated over depth, independent of its width, so
    accuracy rises along the anchors instead of saturating at the wide ones.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, n)
    feats = []
    last = max(1, len(dims) - 1)
    for a, d in enumerate(dims):
        sep = (separation[0] + (separation[1] - separation[0]) * a / last) * 2.5 / np.sqrt(d)
        means = rng.normal(0, 1, (n_classes, d)).astype(np.float32)
        noise = rng.normal(0, 1, (n, d)).astype(np.float32)
        scale = np.exp(rng.normal(0, 1, d)).astype(np.float32)
        feats.append((np.maximum(means[labels] * sep + noise, 0) * scale).astype(np.float16))
    return feats, labels


def pooled_activations(n_classes: int, per_class: int, dims: list[int], seed: int = 0, dominant: int = 4,
                       separation: tuple[float, float] = (0.6, 3.0)) -> tuple[list[np.ndarray], np.ndarray]:
    """ImageNet-shaped anchor features: `per_class` rows of every class (balanced, shuffled), class clusters as
    in `class_clusters`, plus `dominant` shared directions of large variance before the ReLU, so that the
    covariance spectrum has a few eigenvalues far above the bulk (as globally pooled activations have)."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.arange(n_classes), per_class))
    n, last = len(labels), max(1, len(dims) - 1)
    feats = []
    for a, d in enumerate(dims):
        sep = (separation[0] + (separation[1] - separation[0]) * a / last) * 2.5 / np.sqrt(d)
        means = rng.normal(0, 1, (n_classes, d)).astype(np.float32) * sep
        shared = rng.normal(0, 1, (n, dominant)).astype(np.float32) @ rng.normal(0, 1, (dominant, d)).astype(
            np.float32)
        x = means[labels] + rng.normal(0, 1, (n, d)).astype(np.float32) + shared + 1.0
        scale = np.exp(rng.normal(0, 1, d)).astype(np.float32)
        feats.append((np.maximum(x, 0) * scale).astype(np.float16))
    return feats, labels


def write_feature_store(path: str | Path, features: list[np.ndarray], labels: np.ndarray, n_classes: int,
                        model: str = "synthetic", views: dict[str, list[np.ndarray]] | None = None,
                        chunk_rows: int = 1024, weights_id: str = "synthetic",
                        head: tuple[np.ndarray, np.ndarray] | None = None,
                        reading: tuple[dict, dict[str, np.ndarray]] | None = None) -> Path | str:
    """A store holding the given anchor features (no network involved), for probe tests and benchmarks;
    `weights_id` is what its model config says the features were computed with. The stored logits are 1 at the
    label and 0 elsewhere, or with `head` = (weight [C, D], bias [C]) that classifier kept as the model's head and
    its logits on the last anchor's features (each view's own), as a build keeps them, with `reading` (the final
    norm and the anchors' roles, `featstore.nets.head_norm`) or by default no norm, the last anchor the head's
    input and the others translated."""
    from featstore.images.datasets import ImageSet
    from featstore.nets.anchors import Anchor
    from featstore.store.config import StoreConfig
    from featstore.store.writer import ChunkData, StoreWriter

    n = len(labels)
    remote = "://" in str(path)  # an object-store URL: the (unused) image root is then this folder
    images = ImageSet(Path("." if remote else path), np.arange(n, dtype=np.int64),
                      [f"img_{i:07d}.png" for i in range(n)],
                      np.asarray(labels, dtype=np.int64), [f"class_{c}" for c in range(n_classes)],
                      f"synthetic features ({n} rows)")
    store = StoreWriter(path)
    store.write_images(images)
    last = max(1, len(features) - 1)
    anchors = [Anchor(i, f"anchor{i:02d}", f"anchor{i:02d}", int(f.shape[1]), i / last)
               for i, f in enumerate(features)]
    config = StoreConfig(model=model, library="synthetic", weights_id=weights_id, preprocessing=None,
                         token_pool=None, num_classes=n_classes, chunk_rows=chunk_rows, batch_size=chunk_rows,
                         precision="fp32", anchors=tuple(anchors), images_fingerprint=images.fingerprint())
    store.prepare_model(model, config, {})
    if head is not None:
        roles = {a.name: "translated" for a in anchors} | {anchors[-1].name: "head input"}
        store.write_head(model, head[0], head[1], "fc", reading or ({"norm": None, "anchors": roles}, {}))
    for view, feats in {"clean": features, **(views or {})}.items():
        store.prepare_view(model, {"name": view}, anchors, n_classes, chunk_rows)
        logits = np.zeros((n, n_classes), dtype=np.float16)
        logits[np.arange(n), labels] = 1.0
        if head is not None:
            logits = (feats[-1].astype(np.float32) @ head[0].T.astype(np.float32) + head[1]).astype(np.float16)
        for c in range(0, -(-n // chunk_rows)):
            rows = slice(c * chunk_rows, min(n, (c + 1) * chunk_rows))
            store.commit_chunk(model, view, ChunkData(c, [f[rows] for f in feats], logits[rows],
                                                      np.zeros(rows.stop - rows.start, dtype=bool)))
    return path if remote else Path(path)


def run_rows(run: dict, image_id, pred, conf, fold=None):
    """One probe run's rows from the plain fields a test writes by hand (defaults for the rest: a linear probe
    trained on clean, no cross-fit, seed 0; a run id given is read by `RunIdentity`, and what else the test gives
    must agree with it). Identity keys a test puts in params, as older featstores kept them there, become the
    identity's (probe_id, streamed; probe_name is the one it makes) or the row's (probe_version)."""
    from featstore.records import ProbeRun, RunIdentity, RunRows

    pred, conf = np.asarray(pred), np.asarray(conf)
    params = dict(run.get("params", {}))
    given = {k: v for k, v in run.items() if k in ("model", "view", "train_view", "cross_fit", "seed")}
    if "probe_id" in params:
        given["probe_id"] = params.pop("probe_id")
    if "streamed" in params:
        given["streamed"] = bool(params.pop("streamed"))
    params.pop("probe_name", None)
    version = params.pop("probe_version", None)
    probe = run.get("probe", "linear")
    if "run_id" in run:
        identity = RunIdentity.parse(run["run_id"])
        assert all(getattr(identity, k) == v for k, v in given.items()), (run["run_id"], given)
    else:
        identity = RunIdentity(**{"probe_id": probe, "train_view": "clean", **given})
    return RunRows(ProbeRun(identity, probe, params, pred.shape[0], pred.shape[1], run.get("store", "-"), version,
                            run.get("C")), np.asarray(image_id), pred, conf, fold)


def _probe_group(store, key: str, name: str, anchor: str):
    import zarr

    from featstore.store.location import StoreLocation

    where = StoreLocation.parse(getattr(store, "location", store))  # a FeatureStore, a folder or an s3:// URL
    group = zarr.open_group(where.zarr_store(read_only=True), mode="r")[key]["probes"][name]
    return group[group.attrs["current"]][anchor] if "current" in group.attrs else group[anchor]


def read_probe(store, key: str, name: str, anchor: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """One anchor's current probe weights, biases and attrs, read from the Zarr arrays directly (featstore itself
    never reads them back: predictions come from the fit)."""
    g = _probe_group(store, key, name, anchor)
    return g["weight"][:], g["bias"][:], dict(g.attrs)


def read_probe_arrays(store, key: str, name: str, anchor: str) -> dict[str, np.ndarray]:
    """Every array one anchor's current probe keeps (knn: `reference`, the rows it votes with), from Zarr."""
    return {array: values[:] for array, values in _probe_group(store, key, name, anchor).arrays()}


def register_toy_images(con, labels: np.ndarray, split: np.ndarray, models: tuple[str, ...], anchors: int) -> None:
    """A hand-made database's images (ids 0..n-1, their labels and split) and `anchors` two-wide anchors a0, a1, ...
    for each model: what the tests of tables written without a store start from."""
    from types import SimpleNamespace

    from featstore.analytics import db as fsdb
    from featstore.records import DatasetInfo

    n = len(labels)
    fsdb.register_images(con, DatasetInfo("fp", "t", "-", 0), np.arange(n), np.array(["x.png"] * n), labels,
                         split)
    last = max(1, anchors - 1)
    for model in models:
        fsdb.register_anchors(con, model, [SimpleNamespace(index=a, name=f"a{a}", module=f"a{a}", dim=2,
                                                           depth_frac=a / last) for a in range(anchors)])


def toy_database(path: str | Path, n: int, anchors: int, models: tuple[str, ...] = ("m",), seed: int = 0):
    """A hand-made database of n toy images (3 classes, a 60/10/30 train/val/test split, `register_toy_images`) and
    a head right on about 80% of them; returns the open connection, the generator (to draw the timelines from),
    the labels, the split and the head's answers."""
    from types import SimpleNamespace

    from featstore.analytics import db as fsdb

    rng = np.random.default_rng(seed)
    con = fsdb.connect(path)
    labels = rng.integers(0, 3, n)
    split = rng.choice(["train", "val", "test"], n, p=[0.6, 0.1, 0.3])
    register_toy_images(con, labels, split, models, anchors)
    head = np.where(rng.random(n) < 0.8, labels, rng.integers(0, 3, n))
    return SimpleNamespace(con=con, rng=rng, labels=labels, split=split, head=head)


def settling_timelines(rng: np.random.Generator, head: np.ndarray, anchors: int, latest: int) -> np.ndarray:
    """Predictions [n, anchors] of 3 classes, random until a random anchor below `latest` and the head's answer from
    there on (`latest` = anchors + 1: some never reach it)."""
    settle = rng.integers(0, latest, len(head))
    preds = rng.integers(0, 3, (len(head), anchors))
    for i in range(len(head)):
        preds[i, settle[i]:] = head[i]
    return preds
