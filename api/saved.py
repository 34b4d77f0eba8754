"""The probes a run saved in the store, read back (`load_probe`): per anchor, predict on arrays. (torch and the
probes' modules are imported by the functions that use them.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from featstore.api.estimator import _predict, _proba
from featstore.api.results import Results
from featstore.api.store import ModelData, Store, open_store
from featstore.errors import FeatstoreError, Name
from featstore.records import RunIdentity
from featstore.store.probes import GROUP_NAME

if TYPE_CHECKING:
    from featstore.probing.base import FittedProbe


class LoadedProbe:
    """The probes of one run as the store keeps them: per anchor (name or index) `predict(anchor, X)`,
    `predict_proba(anchor, X)`; `fits[a]` lists the anchor's fits, one per cross-fit fold."""

    def __init__(self, model: ModelData, name: str, version: str | None, fits: list[list[FittedProbe]],
                 attrs: list[dict]):
        self.model, self.name, self.version, self.fits, self.attrs = model, name, version, fits, attrs

    @property
    def anchors(self) -> list[str]:
        return [a.name for a in self.model.anchors]

    def _fit(self, anchor: str | int, fold: int) -> FittedProbe:
        fits = self.fits[self.model.anchor(anchor).index]
        if isinstance(fold, bool) or not isinstance(fold, int | np.integer) or not 0 <= fold < len(fits):
            raise FeatstoreError(f"{self.name} holds {len(fits)} fit(s) per anchor (folds "
                                 f"0..{len(fits) - 1}; a run fitted with ", Name("cross_fit", "K"), " holds K)",
                                 field="fold", value=fold)
        return fits[int(fold)]

    def predict(self, anchor: str | int, X: np.ndarray, fold: int = 0) -> np.ndarray:
        return _predict(self._fit(anchor, fold), X)[0]

    def confidence(self, anchor: str | int, X: np.ndarray, fold: int = 0) -> np.ndarray:
        """The max probability per row: the predictions table's `conf`."""
        return _predict(self._fit(anchor, fold), X)[1]

    def predict_proba(self, anchor: str | int, X: np.ndarray, fold: int = 0) -> np.ndarray:
        return _proba(self._fit(anchor, fold), X)

    def __repr__(self) -> str:
        return f"LoadedProbe({self.model.key!r}, {self.name!r}, version={self.version!r})"


def _probe_name(key: str, run: str) -> str:
    """A run id's stored probe name ('m/clean/linear/seed1' -> 'linear-seed1@clean'), read by `RunIdentity`."""
    identity = RunIdentity.parse(run)
    if identity.model != key:
        raise FeatstoreError(f"run {run!r} is no run id of {key!r} (<model>/<view>/<variant>[/...])")
    return identity.probe_name


LENS_ARRAYS = {"map", "map_bias", "norm_weight", "norm_bias", "head_weight", "head_bias"}  # `TunedLensFit.arrays`


def load_probe(store: str | Path | Store, model: str, run: str, db: str | Path | None = None, *,
               trust_pickle: bool = False) -> LoadedProbe:
    """The fitted per-anchor probes of a run, read back from the store: the version the database `db` names for
    it (each database's runs name their own version), or without `db` the store's current one.

    What is read follows the variant the run records (the database's runs row, else the store's record of the
    probes), never the arrays the store holds. An estimator probe is a pickle, and unpickling runs whatever code it
    names: it is read only with `trust_pickle=True`, and then only bytes whose sha256 matches the one `db`
    recorded with the run (docs/python.md says what to trust)."""
    import torch

    from featstore.probing.base import LinearFit

    handle = store if isinstance(store, Store) else open_store(store)
    data = handle.model(model)
    name, version, recorded, digests = _probe_name(data.key, run), None, None, {}
    if db is not None:
        results = Results(db)
        rows = results.sql("SELECT probe, params, probe_name, probe_version FROM runs WHERE run_id = ?", [run])
        if not len(rows):
            raise FeatstoreError(f"database {db} has no run {run!r}")
        held = rows["probe_name"][0]
        if held is not None and held != name:
            raise FeatstoreError(f"database {db}: its row of run {run!r} names probes {held!r} where "
                                 f"run {run!r} names {name!r} (the name its id spells); load_probe reads no other")
        recorded, version = (rows["probe"][0], json.loads(rows["params"][0])), rows["probe_version"][0]
        digests = _recorded_digests(results, run)
    if version is not None and not (isinstance(version, str) and GROUP_NAME.fullmatch(version)):
        raise FeatstoreError(f"database {db}: {version!r} is no stored-weights version of run {run!r} (a name of "
                             f"letters, digits, _ . -)")
    try:
        stored = data.stored_probe(name, version)
    except FeatstoreError as e:
        raise FeatstoreError(f"run {run!r}: ", *e.whole()) from None
    fits, attrs = [], []
    for anchor in data.anchors:
        held = stored.anchors.get(anchor.name)
        attrs.append(dict(held.attrs) if held is not None else {})
        variant, variant_params = recorded or (attrs[-1].get("variant"), attrs[-1].get("params") or {})
        arrays = held.arrays if held is not None else {}
        kept = sorted(arrays)
        if "estimator" in variant_params:  # the estimator variant records its estimator's repr
            if not trust_pickle:
                raise FeatstoreError(f"run {run!r} is an estimator probe ({variant}), kept pickled, and unpickling "
                                     f"runs whatever code the pickle names: pass trust_pickle=True only if you trust "
                                     f"whoever wrote {handle.location}" + (f" and {db}" if db is not None else ""))
            if "estimator" not in kept:
                raise FeatstoreError(f"store {handle.location}: the probes {name} of run {run!r} keep no estimator "
                                     f"for anchor {anchor.name} ({', '.join(kept) or 'nothing'})")
            fits.append([_unpickled(e, digests, (fold, anchor.index), f"run {run!r}, anchor {anchor.name}", db)
                         for fold, e in enumerate(arrays["estimator"])])
        elif {"weight", "bias"} <= set(kept):
            fits.append([LinearFit(weight=torch.from_numpy(w), bias=torch.from_numpy(b))
                         for w, b in zip(arrays["weight"], arrays["bias"], strict=True)])
        elif LENS_ARRAYS <= set(kept):  # a tuned lens read through the model's final norm: no linear map
            from featstore.probing.tuned_lens import TunedLensFit

            records = attrs[-1].get("folds") or []
            fits.append([TunedLensFit.from_arrays({k: arrays[k][fold] for k in LENS_ARRAYS}, records[fold])
                         for fold in range(len(arrays["map"]))])
        else:
            raise FeatstoreError(f"run {run!r} records variant {variant}, so load_probe reads a weight and a bias, "
                                 f"and its probes of anchor {anchor.name} keep {', '.join(kept) or 'nothing'}: "
                                 f"load_probe reads linear and estimator probes (knn keeps only which rows vote)")
    version = stored.version
    return LoadedProbe(data, name, version, fits, attrs)


def _recorded_digests(results: Results, run: str) -> dict[tuple[int, int], str]:
    """(fold, anchor) -> the sha256 of the pickle an estimator run's fit was saved as, as the database recorded it
    when the probe was written (none in a database written before they were recorded)."""
    rows = results.sql("SELECT fold, anchor, info->>'pickle_sha256' AS sha FROM probe_fits WHERE run_id = ? AND "
                           "info->>'pickle_sha256' IS NOT NULL", [run])
    return {(int(f), int(a)): sha for f, a, sha in rows.iter_rows()}


def _unpickled(values: np.ndarray, digests: dict[tuple[int, int], str], key: tuple[int, int], where: str,
               db: str | Path | None) -> FittedProbe:
    """One fold's fitted estimator from the bytes the store keeps (`pickle_bytes`), refused when the database
    recorded digests and these bytes are not the ones it recorded."""
    from featstore.probing.estimator_variant import EstimatorFit, pickle_bytes

    blob = pickle_bytes(values, where)
    if digests:
        sha = hashlib.sha256(blob).hexdigest()
        if digests.get(key) != sha:
            raise FeatstoreError(f"{where}: the pickle's sha256 {sha[:16]}… differs from the one database {db} "
                                 f"recorded with the run ({(digests.get(key) or 'none')[:16]}…): the store's copy "
                                 f"is not what was written, so it is not unpickled")
    try:
        return EstimatorFit.from_pickle(blob)
    except Exception as e:
        raise FeatstoreError(f"{where}: the stored estimator does not unpickle ({type(e).__name__}: {e})") from None
