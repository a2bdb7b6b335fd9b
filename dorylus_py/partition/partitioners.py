"""Vertex-to-partition assignment: METIS, a streaming Fennel, or a hash of the vertex id.

- ``metis`` (pymetis): the smallest edge cut, but it holds ``A + Aᵀ`` several times over (about
  100 bytes per entry here), so it fits only graphs of tens of millions of edges on this machine.
- ``fennel``: Fennel (Tsourakakis et al., WSDM 2014) over the vertex stream in id order, restreamed
  (Nishimura & Ugander, KDD 2013): each vertex goes to the partition holding most of its neighbours,
  minus a penalty growing with the partition's size, under a hard capacity. Vertices are taken in
  batches (one vectorised step each, seeing the previous batches' and the previous pass's choices),
  so memory is the owner array plus one batch, and time is a few passes over the edges.
- ``hash``: SplitMix64 of the id; balanced, and blind to the graph (cut ``1 - 1/K`` of the edges).
- ``auto``: METIS when its memory estimate fits the budget, else Fennel; the choice is said and recorded.
"""

from __future__ import annotations

import math

import numpy as np

from dorylus_py.data.graph import Graph
from dorylus_py.errors import ConfigError

PARTITIONERS = ("auto", "metis", "fennel", "hash")
METIS_BYTES_PER_ENTRY = 100  # pymetis peak per adjacency entry of A + Aᵀ, measured 53-84 B, plus its input
METIS_BYTES_PER_VERTEX = 200
FENNEL_PASSES = 4  # one stream and three restreams; more passes changed the cut by < 1 % on synth graphs
FENNEL_BATCH = 1 << 16  # at most this many vertices decided at once (and at most 1/64 of them)
BALANCE_SLACK = 1.03  # fennel: largest vertex count and edge count at most this times the mean


def check_parts(parts: int, num_nodes: int, source: str, method: str) -> None:
    if parts < 1:
        raise ConfigError(f"--partitions must be >= 1, got {parts}")
    if parts > num_nodes:
        raise ConfigError(f"--partitions {parts} exceeds the {num_nodes} vertices of {source}")
    if method not in PARTITIONERS:
        raise ConfigError(f"unknown partitioner {method!r}; choose one of {', '.join(PARTITIONERS)}")


def assign(graph: Graph, parts: int, method: str = "metis", seed: int = 0) -> np.ndarray:
    """Return ``owner`` (N,) int64: the partition of each vertex of an in-memory graph, none empty."""
    check_parts(parts, graph.num_nodes, graph.source, method)
    if method == "auto":
        method = choose(graph.num_nodes, graph.num_edges, parts, budget_bytes=None)[0]
    if parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64)
    if method == "metis":
        owner = metis(*symmetric_csr(graph), parts, seed)
    elif method == "fennel":
        owner = fennel(graph.indptr, graph.indices, parts, seed)
    else:
        owner = hash_owner(np.arange(graph.num_nodes), parts)
    return fill_empty(owner.astype(np.int64), parts)


def metis_bytes(num_nodes: int, num_edges: int) -> int:
    """Upper estimate of METIS's peak memory: ``A + Aᵀ`` has at most ``2 E`` entries."""
    return METIS_BYTES_PER_ENTRY * 2 * num_edges + METIS_BYTES_PER_VERTEX * num_nodes


def choose(num_nodes: int, num_edges: int, parts: int, budget_bytes: int | None) -> tuple[str, str]:
    """``auto``: (``metis`` or ``fennel``, the reason in one line). Default budget: 3/4 of the memory
    available now."""
    if budget_bytes is None:
        import psutil

        budget_bytes = int(0.75 * psutil.virtual_memory().available)
    need = metis_bytes(num_nodes, num_edges)
    if parts == 1 or need <= budget_bytes:
        return "metis", f"METIS needs about {_size(need)}, within the {_size(budget_bytes)} budget"
    return "fennel", f"METIS would need about {_size(need)}, over the {_size(budget_bytes)} budget: streaming Fennel instead"


def _size(b: int) -> str:
    return f"{b / 2**30:.1f} GB" if b >= 2**30 else f"{b / 2**20:.0f} MB"


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


def metis(xadj: np.ndarray, adjncy: np.ndarray, parts: int, seed: int) -> np.ndarray:
    """METIS k-way on the undirected CSR ``(xadj, adjncy)``."""
    import pymetis

    opts = pymetis.Options(seed=seed)
    _, membership = pymetis.part_graph(parts, pymetis.CSRAdjacency(xadj, np.asarray(adjncy)), options=opts)
    return np.asarray(membership, dtype=np.int64)


def fennel(indptr: np.ndarray, indices: np.ndarray, parts: int, seed: int = 0, passes: int = FENNEL_PASSES,
           batch: int | None = None, progress=None) -> np.ndarray:
    """Restreamed, batched Fennel over the CSR ``(indptr, indices)`` (rows' neighbours; ``indices``
    may be memory-mapped). Returns ``owner`` (N,) int32.

    Balance is kept on two loads: vertices (tensor work, features) and rows of ``Â`` (``1 + degree``:
    Gather work, structure memory). Each partition holds at most ``BALANCE_SLACK`` times the mean of
    both (a vertex that fits nowhere, late in a pass, goes where there is most room), and Fennel's
    size penalty is paid in each load by what the vertex adds to it, so hubs spread out. On power-law graphs a vertex count alone lets the
    hubs gather in one partition, which then holds twice the edges of another."""
    say = progress or (lambda msg: None)
    n = len(indptr) - 1
    batch = batch or max(1, min(FENNEL_BATCH, n // 64))  # a batch much smaller than the graph: a stream
    m = max(int(indptr[-1]) / 2, 1.0)  # undirected edges, as Fennel counts them
    gamma = 1.5
    alpha = math.sqrt(parts) * m / n**gamma
    totals = np.array([n, int(indptr[-1]) + n], dtype=np.float64)  # vertices, rows of Â
    cap = BALANCE_SLACK * totals / parts + 1
    rng = np.random.default_rng(seed)
    owner = np.full(n, -1, dtype=np.int32)
    for p in range(passes):
        load = np.zeros((parts, 2))
        for r0 in range(0, n, batch):
            if r0 % (16 * batch) == 0:
                say(f"fennel pass {p + 1}/{passes}: {r0:,} of {n:,} vertices")
            r1 = min(n, r0 + batch)
            ptr = indptr[r0 : r1 + 1]
            deg = np.diff(ptr)
            rows = np.repeat(np.arange(r1 - r0, dtype=np.int64), deg)
            seen = owner[np.asarray(indices[ptr[0] : ptr[-1]])]
            known = seen >= 0
            counts = np.bincount(rows[known] * parts + seen[known], minlength=(r1 - r0) * parts)
            weight = np.stack([np.ones(r1 - r0), deg + 1.0], axis=1)
            # Fennel's marginal penalty in each load (scaled to vertices), by what the vertex adds to it
            size = np.sqrt(n * load / totals)  # (parts, 2)
            penalty = 0.5 * alpha * gamma * (weight * (n / totals)) @ size.T  # (rows, parts)
            score = counts.reshape(r1 - r0, parts) - penalty
            score += rng.random(score.shape) * 1e-6  # break ties without favouring partition 0
            choice = _capped_argmax(score, weight, (cap - load) / totals, totals)
            owner[r0:r1] = choice
            for c in range(2):
                load[:, c] += np.bincount(choice, weights=weight[:, c], minlength=parts)
    return owner


def _capped_argmax(score: np.ndarray, weight: np.ndarray, room: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Each row's best column such that the rows sent to column ``k`` weigh at most ``room[k]`` in every
    constraint (``weight`` (rows, C) in units of ``scale`` (C,), ``room`` (columns, C)). A full column
    keeps the rows that would lose most by moving, and closes; the others go to their next best open
    column. A row that fits nowhere goes to the column with the most room in its tightest constraint."""
    cols = score.shape[1]
    score = np.where((room > 0).all(axis=1), score, -np.inf)
    choice = np.argmax(score, axis=1)
    for _ in range(cols):
        nowhere = ~np.isfinite(score.max(axis=1))
        sent = np.stack([np.bincount(choice[~nowhere], weights=w[~nowhere], minlength=cols) for w in weight.T], axis=1)
        sent = sent / scale
        if nowhere.any():
            choice[nowhere] = np.argmax((room - sent).min(axis=1))
        over = np.nonzero((sent > room).any(axis=1))[0]
        if not len(over):
            break
        for k in over:
            rows = np.nonzero((choice == k) & ~nowhere)[0]
            others = score[rows].copy()
            others[:, k] = -np.inf
            rows = rows[np.argsort(others.max(axis=1) - score[rows, k], kind="stable")]  # most to lose first
            fits = (np.cumsum(weight[rows] / scale, axis=0) <= room[k]).all(axis=1)
            moved = rows[len(rows) if fits.all() else int(np.argmin(fits)) :]
            closed = choice != k
            closed[moved] = True
            score[closed, k] = -np.inf
            choice[moved] = np.argmax(score[moved], axis=1)
    return choice


def fill_empty(owner: np.ndarray, parts: int) -> np.ndarray:
    """Move one vertex from the largest partition into each empty one (tiny graphs only)."""
    counts = np.bincount(owner, minlength=parts)
    for k in np.nonzero(counts == 0)[0]:
        donor = int(np.argmax(counts))
        v = int(np.nonzero(owner == donor)[0][-1])
        owner[v] = k
        counts[donor] -= 1
        counts[k] += 1
    return owner
