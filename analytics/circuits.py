"""Circuit runs into DuckDB: compute with `featstore.circuits`, persist with `write_circuit`."""

from __future__ import annotations

from featstore.analytics import db as fsdb
from featstore.circuits import CircuitConfig, compute_circuit


def run_circuits(cfg: CircuitConfig) -> str:
    """EAP-IG edge scores of `cfg.model` over its image set, written as one circuit run; returns the run id."""
    con = fsdb.connect(cfg.db)  # fail on a locked database before the long computation
    try:
        result = compute_circuit(cfg)
        fsdb.write_circuit(con, result.run, result.edges, result.scores)
        return result.run["run_id"]
    finally:
        con.close()
