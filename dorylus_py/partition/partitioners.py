"""Vertex-to-partition assignment: METIS (min edge cut) through pymetis, or a hash of the vertex id."""

from __future__ import annotations

import numpy as np

from dorylus_py.data.graph import Graph
from dorylus_py.errors import ConfigError

PARTITIONERS = ("metis", "hash")


def assign(graph: Graph, parts: int, method: str = "metis", seed: int = 0) -> np.ndarray:
    """Return ``owner`` (N,) int64: the partition of each vertex, every partition non-empty."""
    if parts < 1:
        raise ConfigError(f"--partitions must be >= 1, got {parts}")
    if parts > graph.num_nodes:
        raise ConfigError(f"--partitions {parts} exceeds the {graph.num_nodes} vertices of {graph.source}")
    if method not in PARTITIONERS:
        raise ConfigError(f"unknown partitioner {method!r}; choose one of {', '.join(PARTITIONERS)}")
    if parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64)
    owner = _metis(graph, parts, seed) if method == "metis" else hash_owner(np.arange(graph.num_nodes), parts)
    return _fill_empty(owner, parts)


def hash_owner(ids: np.ndarray, parts: int) -> np.ndarray:
    """SplitMix64 finaliser of the id, modulo ``parts``: balanced in expectation, no id patterns."""
    z = ids.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(parts)).astype(np.int64)


def symmetric_csr(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """CSR of ``A + Aᵀ`` without duplicates or self loops (what METIS needs)."""
    n = graph.num_nodes
    src, dst = graph.edges()
    keys = np.unique(np.concatenate([src * n + dst, dst * n + src]))
    rows = keys // n
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=xadj[1:])
    return xadj, keys - rows * n


def _metis(graph: Graph, parts: int, seed: int) -> np.ndarray:
    import pymetis

    xadj, adjncy = symmetric_csr(graph)
    opts = pymetis.Options(seed=seed)
    _, membership = pymetis.part_graph(parts, pymetis.CSRAdjacency(xadj, adjncy), options=opts)
    return np.asarray(membership, dtype=np.int64)


def _fill_empty(owner: np.ndarray, parts: int) -> np.ndarray:
    """Move one vertex from the largest partition into each empty one (tiny graphs only)."""
    counts = np.bincount(owner, minlength=parts)
    for k in np.nonzero(counts == 0)[0]:
        donor = int(np.argmax(counts))
        v = int(np.nonzero(owner == donor)[0][-1])
        owner[v] = k
        counts[donor] -= 1
        counts[k] += 1
    return owner
