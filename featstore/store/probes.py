"""The probes a store keeps, laid out as:

    <model>/probes/<name>/                    attrs: current (the version the probe's runs read)
    <model>/probes/<name>/<version>/          attrs: the owner (database and split whose runs name the version)
    <model>/probes/<name>/<version>/<anchor>/ attrs: the fit's record; arrays by name, folds first
                                              (linear: weight [folds, C, D] float32, bias [folds, C]; knn:
                                              reference [folds, N] bool; an estimator: estimator [folds, bytes]
                                              uint8, its pickle)

A version is written in full (`StoreWriter.write_probe`, per anchor), then named current
(`StoreWriter.make_probe_current`) once the database committed the runs that name it; `FeatureStore.read_probe`
reads one version back. Stores written before versions kept one unversioned set of anchors directly under <name>/
(`read_probe` with no version and no `current` reads it). This module holds the records and names those methods
share.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

PROBES = "probes"  # <model>/probes: the probes kept

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
