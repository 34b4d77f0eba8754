"""The probes a store keeps, the one place that knows their layout:

    <model>/probes/<name>/                    attrs: current (the version the probe's runs read)
    <model>/probes/<name>/<version>/          attrs: the owner (database and split whose runs name the version)
    <model>/probes/<name>/<version>/<anchor>/ attrs: the fit's record; arrays by name, folds first
                                              (linear: weight [folds, C, D] float32, bias [folds, C]; knn:
                                              reference [folds, N] bool; an estimator: estimator [folds, bytes]
                                              uint8, its pickle)

A version is written in full (`write_probe`, per anchor), then named current (`make_probe_current`) once the
database committed the runs that name it; `read_probe` reads one version back. Stores written before versions kept
one unversioned set of anchors directly under <name>/ (`read_probe` with no version and no `current` reads it).
`FeatureStore` and `StoreWriter` delegate their probe methods here.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from featstore.errors import FeatstoreError, FeatstoreTypeError, Step
from featstore.store.reading import PROBES, StoreReading, one_name

VERSION = re.compile(r"v\d{8}T\d{6}-[0-9a-f]{8}")  # a saved probe version's name (`new_probe_version`)
GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")  # what a version read from elsewhere may be called


def new_probe_version() -> str:
    """A new saved version's name: the time it was begun, then 8 random hex digits."""
    return time.strftime("v%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:8]


@dataclass(frozen=True)
class ProbeVersion:
    """One saved version of a model's probe: <key>/probes/<name>/<version>, the database whose runs it was saved
    for (None: not recorded) and whether the probe's `current` points at it."""

    key: str
    name: str
    version: str
    owner: str | None
    current: bool

    def __str__(self) -> str:
        return f"{self.key}/probes/{self.name}/{self.version}"


@dataclass(frozen=True)
class StoredAnchor:
    """What one anchor's probe keeps: its arrays by name (folds first) and its attrs (the fit's record)."""

    arrays: Mapping[str, np.ndarray]
    attrs: Mapping[str, Any]


@dataclass(frozen=True)
class StoredProbe:
    """One version of a probe as the store keeps it, per anchor name (`read_probe`)."""

    key: str
    name: str
    version: str | None  # None: a store before versions, one unversioned set
    anchors: Mapping[str, StoredAnchor]


# -- reading ------------------------------------------------------------------------------------------


def probe_versions(store: StoreReading, key: str) -> list[ProbeVersion]:
    """Every saved version of every probe of a model (listed; each version's attrs read for its owner)."""
    found: list[ProbeVersion] = []
    if PROBES not in store.listed(key):
        return found
    for name in store.listed(f"{key}/{PROBES}"):
        try:
            current = store.root[key][PROBES][name].attrs.get("current")
        except Exception:  # unreadable metadata: a version of it is current as far as anyone can tell
            current = None
        for version in store.listed(f"{key}/{PROBES}/{name}"):
            if not VERSION.fullmatch(version):  # a store before versions kept one set of anchors here
                continue
            try:
                owner = dict(store.root[key][PROBES][name][version].attrs).get("database")
            except Exception:  # interrupted before its metadata was written
                owner = None
            found.append(ProbeVersion(key, name, version, owner, version == current))
    return found


def probe_version_exists(store: StoreReading, key: str, name: str, version: str) -> bool:
    """True when <model>/probes/<name>/<version> holds weights (listed, no metadata parsed)."""
    try:
        return bool(store.listed(f"{key}/{PROBES}/{name}/{version}"))
    except Exception:
        return False


def read_probe(store: StoreReading, key: str, name: str, version: str | None = None) -> StoredProbe:
    """One version of probe `name` of model `key`, every anchor's arrays and attrs: `version`, or without it the
    one the probe's `current` names (a store before versions: its one unversioned set). What is missing is one
    FeatstoreError naming it."""
    store.model_attrs(key)  # an unknown model is a one-line error
    if not isinstance(name, str):
        raise FeatstoreTypeError("give the kept probes' name ('linear@clean'; ",
                                 Step("fs.open_store(store).info()", "info"), " "
                                 "lists them)", field="name", value=name)
    root = store.root[key]
    with store.damage_is_one_line(f"{key}/{PROBES}/{name}"):
        if PROBES not in root or not one_name(name) or name not in root[PROBES]:
            raise FeatstoreError(f"store {store.location} holds no probes {name!r} of {key!r}; ",
                                 Step("fs.probe(...)", "probe"), " "
                                 "saves them")
        group = root[PROBES][name]
        version = version or group.attrs.get("current")
    if version is not None and not (isinstance(version, str) and GROUP_NAME.fullmatch(version)):
        raise FeatstoreError(f"store {store.location}: {version!r} is no stored-weights version of probes {name!r} "
                             f"(a name of letters, digits, _ . -)")
    held = group if version is None else group.get(version)
    if held is None:
        raise FeatstoreError(f"store {store.location}: the probes {name}/{version} are gone (",
                             Step("fs.open_store(store).verify(dbs=[db])", "verify"), " lists such runs)")
    anchors = {}
    with store.damage_is_one_line(f"{key}/{PROBES}/{name}/{version}"):
        for anchor, g in sorted(held.groups()):
            anchors[anchor] = StoredAnchor({a: np.asarray(arr[:]) for a, arr in sorted(g.arrays())}, dict(g.attrs))
    return StoredProbe(key, name, version, anchors)


# -- writing ------------------------------------------------------------------------------------------


def write_probe(store: StoreReading, key: str, name: str, anchor: str, arrays: dict[str, np.ndarray], attrs: dict,
                version: str, owner: dict | None = None) -> None:
    """Save what one anchor's probe keeps, one array per name with folds first, under
    <model>/probes/<name>/<version>/<anchor>/: bool stays bool, uint8 (a pickle's bytes) stays bytes, every other
    array is float32. Nothing reads them until `make_probe_current` names that version. `owner` (the database and
    split whose runs name the version) goes into the version group's attrs."""
    probe = store.root[key].require_group(PROBES).require_group(name)
    if version not in probe:  # with its owner in one write: a version is never left without one
        probe.create_group(version, attributes=owner or {})
    vg = probe[version]
    if owner and dict(vg.attrs) != owner:
        vg.attrs.put(owner)
    g = vg.require_group(anchor)
    for array, values in arrays.items():
        dtype = "bool" if values.dtype == bool else "uint8" if values.dtype == np.uint8 else "float32"
        g.create_array(array, shape=values.shape, chunks=values.shape, dtype=dtype, overwrite=True)[:] = values
    g.attrs.put(attrs)


def make_probe_current(store: StoreReading, key: str, name: str, version: str, retired: Sequence[str] = ()) -> None:
    """Point <model>/probes/<name> at `version` (one attrs file, written atomically), then drop the `retired`
    versions: those the committing database named before and names no more. Called after the database committed
    the rows of that version, so a failure before leaves the old pair. Versions other jobs wrote (other databases,
    other views of the one-job-per-view pattern) are never touched: each job's version name is its own."""
    g = store.root[key][PROBES][name]
    g.attrs["current"] = version
    present = {k for k, _ in g.groups()}
    for other in retired:
        if other != version and other in present:
            del g[other]


def discard_probe_version(store: StoreReading, key: str, name: str, version: str) -> None:
    """Remove a version that never became current (its database transaction failed)."""
    try:
        g = store.root[key][PROBES][name]
    except KeyError:
        return
    if version in g and g.attrs.get("current") != version:
        del g[version]
