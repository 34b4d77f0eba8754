"""`featstore cost`: read the model's anchors from the store (or the DB), time them with
`featstore.compute.prefix_costs.measure_costs`, and keep them in DuckDB's `anchor_costs` / `model_costs`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from featstore.analytics import db as fsdb
from featstore.analytics import queries as q
from featstore.compute.prefix_costs import ModelCost, measure_costs
from featstore.errors import FeatstoreError, Name
from featstore.nets.anchors import resolve_anchors
from featstore.nets.models import load_model
from featstore.runtime import resolve_device, tune_allocator
from featstore.schema import COST_BATCH_SIZES, DEVICE, REPEATS
from featstore.store.reader import FeatureStore
from featstore.threads import ThreadPolicy


def measure_model(key: str, db: str | Path, store: str | Path | None = None, device: str = DEVICE,
                  batch_sizes: Sequence[int] = COST_BATCH_SIZES, repeats: int = REPEATS,
                  image_size: int | None = None, threads: int | None = None,
                  on_start: Callable[[], None] | None = None) -> list[ModelCost]:
    """Measure a model of the store/DB and save its costs. Weights do not change timings, so the architecture
    is rebuilt with random weights (and the head width the stored model has). On the CPU each batch size is
    timed with one thread count throughout (`threads`, or the cores idle when its measurement starts), so its
    anchors compare; the count is part of the recorded device ('cpu: ..., 2 threads'). `on_start` is called once
    the input is checked, before the timing (the CLI says what it does then, not before a refusal)."""
    tune_allocator()
    if store is not None:
        fs = FeatureStore(store)
        cfg = fs.config(key)
        name, anchors, pool_kind = cfg.model, list(cfg.anchors), cfg.token_pool or "cls"
        if image_size is None and cfg.preprocessing is None:
            raise FeatstoreError(f"store {store} holds features of {key!r} written without images (no crop "
                                 f"size recorded); pass ", Name("image_size"))
        crop = image_size or cfg.preprocessing.crop
        head, probe_classes = cfg.num_classes, len(fs.image_attrs().get("class_names", [])) or cfg.num_classes
    else:  # read only: a refusal leaves no database behind
        names = q.anchor_names(db, key) if Path(db).exists() else []
        if not names:
            raise FeatstoreError(f"database {db} has no anchors of {key!r}; pass ", Name("store"),
                                 ", or probe the model first")
        name, pool_kind, head = key, "cls", None
        probe_classes = q.label_count(db) or 1000
        crop = None
    if store is not None and "/" not in name:  # the library the store was built with (convnext_tiny: both have it)
        name = f"{cfg.library}/{name}"
    loaded = load_model(name, weights="none", image_size=image_size if store is None else crop, num_classes=head)
    if store is None:
        anchors = resolve_anchors(loaded.module, names)
    crop = crop or loaded.preprocessing.crop
    dev = resolve_device(device)
    con = fsdb.connect(db)  # opened for writing once every check has passed
    if on_start is not None:
        on_start()
    try:
        results = []
        for batch in batch_sizes:
            with ThreadPolicy(threads, dev):
                cost = measure_costs(loaded.module, anchors, crop, probe_classes, dev, batch, pool_kind, repeats)
            fsdb.replace_costs(con, key, cost)
            results.append(cost)
        return results
    finally:
        con.close()
