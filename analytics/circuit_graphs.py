"""Graph views of circuits for the Circuit Shift Score: the top-n edge graph of a circuit, its Laplacian spectrum
and NetLSD heat trace, and the distances between an ID and an OOD circuit's graphs.

SQL cannot take eigenvalues, so these two distances are computed here: `featstore zoo` stores them in `css_graph`,
where the `css_grid` / `css` macros read them beside the vector distances they compute themselves, and
`featstore css` computes one pair on the fly without writing.

- Top-n graph: the `top_n` edges by |score| (ties broken by edge order, as the jaccard distance does), undirected
  and unweighted over all nodes of the model's graph; a head's q, k and v inputs are one node (the head).
- laplacian: Euclidean distance between the sorted eigenvalues of the combinatorial Laplacians L = D - A.
- netlsd: Euclidean distance between heat traces h(t) = tr exp(-t L_sym) / n, with L_sym = I - D^-1/2 A D^-1/2
  (zero rows for isolated nodes), at 250 times log-spaced from 0.01 to 100 (NetLSD's defaults, normalised by
  the empty graph's trace n).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from featstore.analytics import db as fsdb
from featstore.analytics.queries import query
from featstore.errors import FeatstoreError
from featstore.schema import CSS_DISTANCES, TOP_N

HEAT_TIMES = np.logspace(-2, 2, 250)
GRAPH_DISTANCES = ("laplacian", "netlsd")


def node_of(name: str) -> str:
    """The graph node an edge endpoint belongs to: a head's q/k/v input is the head."""
    stem, _, kind = name.rpartition(".")
    return stem if kind in ("q", "k", "v") and stem else name


def top_n_adjacency(src: list[str], dst: list[str], scores: np.ndarray, top_n: int, nodes: list[str]) -> np.ndarray:
    """Symmetric 0/1 adjacency over `nodes` of the top_n edges by |score|."""
    index = {n: i for i, n in enumerate(nodes)}
    adjacency = np.zeros((len(nodes), len(nodes)))
    for e in np.argsort(-np.abs(scores), kind="stable")[:top_n]:
        u, v = index[node_of(src[e])], index[node_of(dst[e])]
        if u != v:
            adjacency[u, v] = adjacency[v, u] = 1.0
    return adjacency


def laplacian_spectrum(adjacency: np.ndarray) -> np.ndarray:
    """Ascending eigenvalues of D - A."""
    return np.linalg.eigvalsh(np.diag(adjacency.sum(axis=1)) - adjacency)


def heat_trace(adjacency: np.ndarray, times: np.ndarray = HEAT_TIMES) -> np.ndarray:
    """NetLSD's heat trace signature tr exp(-t L_sym) / n at each t."""
    degree = adjacency.sum(axis=1)
    inv_sqrt = np.where(degree > 0, 1 / np.sqrt(np.maximum(degree, 1e-300)), 0.0)
    sym = np.diag((degree > 0).astype(float)) - inv_sqrt[:, None] * adjacency * inv_sqrt[None, :]
    eigenvalues = np.linalg.eigvalsh(sym)
    return np.exp(-np.outer(times, eigenvalues)).sum(axis=1) / len(adjacency)


def graph_distances(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """laplacian and netlsd distances between two adjacency matrices over the same nodes."""
    return {"laplacian": float(np.linalg.norm(laplacian_spectrum(a) - laplacian_spectrum(b))),
            "netlsd": float(np.linalg.norm(heat_trace(a) - heat_trace(b)))}


def pair_distances(con: duckdb.DuckDBPyConnection, id_run: str, ood_run: str, top_n: int) -> dict[str, float] | None:
    """The graph distances of one (ID, OOD) pair of circuit runs, or None when they are not two circuits of one
    model (css_grid has no row for them either)."""
    src, dst, x = fsdb.read_edges(con, id_run)
    src_b, dst_b, y = fsdb.read_edges(con, ood_run)
    if src != src_b or dst != dst_b or not src:
        return None
    nodes = sorted({node_of(n) for n in src + dst})
    found = graph_distances(top_n_adjacency(src, dst, x, top_n, nodes), top_n_adjacency(src, dst, y, top_n, nodes))
    return {**found, "n_edges": len(src)}


def store_graph_css(con: duckdb.DuckDBPyConnection, pairs: list[tuple[str, str]], top_n: int) -> None:
    """Compute and store (replacing earlier values at this top_n) the graph distances of each (ID, OOD) pair."""
    rows = []
    for id_run, ood_run in pairs:
        found = pair_distances(con, id_run, ood_run, top_n)
        if found is not None:
            rows += [(id_run, ood_run, name, top_n, found[name], found["n_edges"]) for name in GRAPH_DISTANCES]
    fsdb.replace_graph_css(con, pairs, top_n, rows)


def circuit_shift(db: str | Path, id_run: str, ood_run: str, distance: str = CSS_DISTANCES[0], top_n: int = TOP_N):
    """One CSS value as a frame (id_run, ood_run, distance, css, n_edges). A graph distance that `featstore zoo`
    has not stored for this pair and top_n is computed here from the edges, and not written: queries never write."""
    frame = query(db, "SELECT * FROM css(?, ?, distance := ?, top_n := ?)", [id_run, ood_run, distance, top_n])
    if distance in GRAPH_DISTANCES and frame.is_empty():
        con = fsdb.connect(db, read_only=True)
        try:
            found = pair_distances(con, id_run, ood_run, top_n)
        finally:
            con.close()
        if found is not None:
            frame = pl.DataFrame({"id_run": [id_run], "ood_run": [ood_run], "distance": [distance],
                                  "css": [found[distance]], "n_edges": [found["n_edges"]]},
                                 schema=frame.schema)
    if frame.is_empty() or frame["n_edges"][0] == 0:
        raise FeatstoreError(f"no common edges between {id_run!r} and {ood_run!r} in {db}; they must be circuit "
                             f"runs of the same model")
    return frame
