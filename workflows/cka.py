"""`featstore cka`: linear CKA between every pair of a model's anchors (`featstore.compute.similarity.anchor_cka`), kept
in DuckDB's `anchor_cka` table, replacing the rows of the same model, view and estimator."""

from __future__ import annotations

from pathlib import Path

from featstore.analytics import db as fsdb
from featstore.analytics.queries import anchor_names
from featstore.compute.similarity import DEFAULT_BUDGET, CkaResult, anchor_cka, check_view
from featstore.probing.run import check_complete
from featstore.schema import VIEW
from featstore.store.reader import FeatureStore, model_key


def compute_cka(store: str | Path, model: str, db: str | Path, view: str = VIEW, unbiased: bool = False,
                threads: int | None = None, progress: bool = False,
                memory_budget: int = DEFAULT_BUDGET) -> CkaResult:
    """Check the view is complete and sound and the database of this store's images (as `probe` checks it), compute
    the CKA of every anchor pair and land it in one transaction (with the model's anchors, where the database has
    none of it yet, so the rows have names)."""
    fs = FeatureStore(str(store))
    key = model_key(model)
    fs.model_attrs(key)  # an unknown model is a one-line error
    check_view(fs, key, view)
    check_complete(fs, key, view)
    if Path(db).exists():  # before the work, read-only beside readers
        con = fsdb.connect(db, read_only=True)
        try:
            _check_database(con, Path(db), fs, key)
        finally:
            con.close()
    result = anchor_cka(fs, key, view, unbiased, memory_budget, threads, progress)
    con = fsdb.connect(db, wait_s=fsdb.WRITE_WAIT_S)
    try:
        _check_database(con, Path(db), fs, key)  # another job may have filled it meanwhile
        if fsdb.model_source(con, key) is None:  # what the next cka or probe of another store is refused by
            fsdb.register_source(con, fs.source(key))
        if not anchor_names(con, key):
            fsdb.register_anchors(con, key, fs.anchors(key))
        fsdb.replace_anchor_cka(con, key, view, result.estimator, result.matrix, result.n_images)
    finally:
        con.close()
    return result


def _check_database(con, db: Path, fs: FeatureStore, key: str) -> None:
    """The database holds this store's image set (or none yet) and, for this model, this store's images, weights
    and anchors: CKA over other images would replace the rows of another experiment."""
    fsdb.check_image_set(con, db, fs.image_attrs()["fingerprint"])
    fsdb.check_source(con, db, fs.source(key))
