"""Probe weights no run names: what `featstore verify` lists and `featstore gc` removes.

A probe saves its weights as a new version in the store, then commits its runs to the database, then points the
probe at that version (workflows/probe.py). A probe killed between the first two steps leaves a version no run
names, forever. A version is removable only when every database in reach (its owner, recorded in the version's
attrs when it was saved, and any `--db` given) can be read and none of them names it, it is not its probe's
current one, and nothing under it was written for `min_age_s` (a probe saving it now, or about to commit, is
left alone). A version whose database is not here, is held by a writer or cannot be read is listed, never
removed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from featstore.analytics import db as fsdb
from featstore.errors import FeatstoreError
from featstore.schema import MIN_AGE_S, check_field
from featstore.store.reader import FeatureStore, ProbeVersion
from featstore.store.writer import StoreWriter


@dataclass(frozen=True)
class Unreferenced:
    """A saved probe version no run of a database in reach names, whether `gc` removes it and why."""

    version: ProbeVersion
    removable: bool
    why: str

    def __str__(self) -> str:
        return f"probe weights {self.version}: {self.why}"


def unreferenced(store: str | Path, dbs: Sequence[Path] = (), model: str | None = None,
                 min_age_s: float = MIN_AGE_S) -> list[Unreferenced]:
    """Every saved probe version of the store (or of `model`) that no run of a database in reach names. A negative
    `min_age_s` would let a version a running probe is writing count as old: refused."""
    min_age_s = check_field("min_age", min_age_s)
    fs = FeatureStore(store)
    named: dict[Path, set[tuple[str, str, str]] | str] = {}
    found = []
    for key in [model] if model else fs.models():
        for pv in fs.probe_versions(key):
            if pv.current:
                continue
            reach = list(dict.fromkeys([Path(d).resolve() for d in dbs] + ([Path(pv.owner)] if pv.owner else [])))
            runs = [_runs_of(db, named) for db in reach]
            if any(isinstance(r, set) and (key, pv.name, pv.version) in r for r in runs):
                continue
            found.append(_judge(fs, pv, reach, runs, min_age_s))
    return found


def collect(store: str | Path, dbs: Sequence[Path] = (), model: str | None = None, min_age_s: float = MIN_AGE_S,
            dry_run: bool = False) -> list[Unreferenced]:
    """Remove the removable unreferenced versions (none with `dry_run`); returns every unreferenced one."""
    found = unreferenced(store, dbs, model, min_age_s)
    if not dry_run and any(u.removable for u in found):
        writer = StoreWriter(store)
        for u in found:
            if u.removable:
                writer.delete(str(u.version))
    return found


def _runs_of(db: Path, named: dict) -> set[tuple[str, str, str]] | str:
    """The (model, probe name, version) of every run of `db`, or why they cannot be read (read once per call)."""
    if db not in named:
        if not db.exists():
            named[db] = f"its database {db} is not here"
        else:
            try:
                con = fsdb.connect(db, read_only=True)
            except FeatstoreError as e:
                named[db] = f"its database {db} cannot be read now ({str(e)[:160]})"
            else:
                try:
                    named[db] = {(m, n, v) for _, m, n, v in fsdb.run_weights(con)}
                finally:
                    con.close()
    return named[db]


def _judge(fs: FeatureStore, pv: ProbeVersion, reach: list[Path], runs: list, min_age_s: float) -> Unreferenced:
    unread = [r for r in runs if isinstance(r, str)]
    if unread:
        return Unreferenced(pv, False, f"no run names it, but {unread[0]}: kept")
    if not reach:
        return Unreferenced(pv, False, "no database is recorded for it (name the database it was probed into): kept")
    age = time.time() - (fs.location.last_written(str(pv)) or 0.0)
    if age < min_age_s:
        return Unreferenced(pv, False, f"no run of {', '.join(map(str, reach))} names it, but it was written "
                                       f"{age:.0f} s ago (a probe may still be committing it): kept")
    return Unreferenced(pv, True, f"no run of {', '.join(map(str, reach))} names it (a probe stopped between saving "
                                  f"its weights and committing its runs)")
