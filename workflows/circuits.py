"""`featstore circuits`: compute a circuit run with `featstore.compute.attribution`, persist it with `write_circuit`."""

from __future__ import annotations

from pathlib import Path

from featstore.analytics import db as fsdb
from featstore.compute.attribution import CircuitConfig, CircuitResult, compute_circuit


def run_circuits(cfg: CircuitConfig, db: Path) -> CircuitResult:
    """EAP-IG edge scores of `cfg.model` over its image set, written as one circuit run.

    An existing database is opened first, so that a lock held elsewhere fails before the long computation; a
    new one is created only once there are scores to write (a refused model leaves no file behind)."""
    con = fsdb.connect(db) if Path(db).exists() else None
    try:
        result = compute_circuit(cfg)
        con = con or fsdb.connect(db)
        fsdb.write_circuit(con, result.run, result.edges, result.scores)
        return result
    finally:
        if con is not None:
            con.close()
