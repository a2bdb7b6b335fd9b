"""Cluster-GCN mini-batches (Chiang et al., KDD 2019, https://arxiv.org/abs/1905.07953).

The graph is cut once into ``clusters`` METIS parts (the partition module's ``assign``). Each epoch
the clusters are shuffled with a seed every worker shares and grouped ``per_batch`` at a time; a batch
is the union of its clusters with the edges among them. Its adjacency is the paper's normalisation with
diagonal enhancement: ``Ã = (D + I)⁻¹ (A + I)``, then ``Ã + λ · diag(Ã)``. Every worker computes the
same batch list from ``(seed, epoch)``, so the work pool only hands out batch numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dorylus_py.data.graph import Graph
from dorylus_py.errors import ConfigError
from dorylus_py.kernels.sparse import NormalizedAdjacency
from dorylus_py.models import Architecture, architecture
from dorylus_py.partition.partitioners import assign


def batch_count(clusters: int, per_batch: int) -> int:
    """Batches per epoch: the clusters grouped ``per_batch`` at a time, the last group possibly smaller."""
    return -(-clusters // per_batch)


@dataclass(frozen=True, eq=False)
class Batch:
    nodes: np.ndarray  # (B,) global vertex ids, sorted
    adj: object  # what the model aggregates along (batch_input): GCN: (B, B) normalised, diagonal enhanced
    x: torch.Tensor  # (B, F)
    y: torch.Tensor  # (B,)
    train: torch.Tensor  # (B,) bool


@dataclass(frozen=True)
class Subgraph:
    """The in-edge CSR of the subgraph induced by some vertices (what ``Architecture.graph_input`` reads)."""

    indptr: np.ndarray
    indices: np.ndarray
    num_nodes: int


def induced_subgraph(indptr: np.ndarray, indices: np.ndarray, nodes: np.ndarray, num_nodes: int) -> Subgraph:
    """The subgraph induced by sorted ``nodes``, renumbered ``0..len(nodes)-1``."""
    rows, cols = _induced_edges(indptr, indices, nodes, num_nodes)
    ptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=len(nodes)))]).astype(np.int64)
    return Subgraph(ptr, cols, len(nodes))


def _induced_edges(indptr, indices, nodes, num_nodes) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the induced subgraph's edges, row-major, in the new numbering."""
    m = len(nodes)
    local = np.full(num_nodes, -1, dtype=np.int64)
    local[nodes] = np.arange(m)
    starts, counts = indptr[nodes], indptr[nodes + 1] - indptr[nodes]
    total = int(counts.sum())
    offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts)
    cols = local[indices[np.arange(total) + offsets]]
    rows = np.repeat(np.arange(m), counts)
    keep = cols >= 0
    return rows[keep], cols[keep]


def enhanced_adjacency(indptr: np.ndarray, indices: np.ndarray, nodes: np.ndarray, num_nodes: int,
                       diag_lambda: float, device="cpu") -> NormalizedAdjacency:
    """The normalised, diagonal-enhanced adjacency of the subgraph induced by sorted ``nodes``.

    ``indptr``/``indices`` is the graph's in-edge CSR (no self loops); rows are destinations.
    """
    m = len(nodes)
    rows, cols = _induced_edges(indptr, indices, nodes, num_nodes)
    inv = 1.0 / (np.bincount(rows, minlength=m) + 1.0)  # (D + I)^-1, D = in-degree inside the batch
    rows = np.concatenate([rows, np.arange(m)])
    cols = np.concatenate([cols, np.arange(m)])
    weights = inv[rows]
    weights[-m:] *= 1.0 + diag_lambda  # Ã + λ diag(Ã): the self loop's entry is the diagonal
    order = np.argsort(rows, kind="stable")
    csr_indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=m), out=csr_indptr[1:])
    return NormalizedAdjacency.from_csr(csr_indptr, cols[order], weights[order].astype(np.float32), (m, m), device)


def batch_input(arch: Architecture, graph: Graph, nodes: np.ndarray | None, diag_lambda: float, device="cpu"):
    """What ``arch`` aggregates along in the subgraph induced by sorted ``nodes`` (``None``: the whole
    graph, which the recorder evaluates on): Cluster-GCN's diagonal-enhanced ``Ã`` where the architecture
    trains on it (GCN), else the architecture's own graph input."""
    if arch.enhanced_batches:
        every = np.arange(graph.num_nodes) if nodes is None else nodes
        return enhanced_adjacency(graph.indptr, graph.indices, every, graph.num_nodes, diag_lambda, device)
    sub = graph if nodes is None else induced_subgraph(graph.indptr, graph.indices, nodes, graph.num_nodes)
    return arch.graph_input(sub, device)


class ClusterBatches:
    def __init__(self, graph: Graph, features: np.ndarray, clusters: int, per_batch: int, diag_lambda: float,
                 seed: int = 0, device: str = "cpu", owner: np.ndarray | None = None, model: str = "gcn"):
        """``owner``: each vertex's cluster, when already computed (else METIS runs here); ``model``: what
        a batch's ``adj`` is for (GCN: Cluster-GCN's normalisation; GAT, GraphSAGE: their own)."""
        self.arch = architecture(model)
        if clusters < 1 or per_batch < 1 or per_batch > clusters:
            raise ConfigError(f"need 1 <= --clusters-per-batch ({per_batch}) <= --clusters ({clusters})")
        self.graph, self.per_batch, self.diag_lambda, self.seed, self.device = graph, per_batch, diag_lambda, seed, device
        self.owner = assign(graph, clusters, "metis", seed) if owner is None else owner
        if len(self.owner) != graph.num_nodes or self.owner.min() < 0 or self.owner.max() >= clusters:
            raise ConfigError(f"cluster assignment does not fit {graph.num_nodes} vertices and {clusters} clusters")
        order = np.argsort(self.owner, kind="stable")
        bounds = np.searchsorted(self.owner[order], np.arange(clusters + 1))
        self.members = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        self.x = torch.from_numpy(np.ascontiguousarray(features))
        self.y = torch.from_numpy(graph.labels)
        self.train = torch.from_numpy(graph.train_mask)

    @property
    def batches_per_epoch(self) -> int:
        return batch_count(len(self.members), self.per_batch)

    def epoch_plan(self, epoch: int) -> list[np.ndarray]:
        """The clusters of each batch of ``epoch``: the same list in every worker."""
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.members))
        return [perm[i:i + self.per_batch] for i in range(0, len(perm), self.per_batch)]

    def batch(self, epoch: int, index: int) -> Batch:
        clusters = self.epoch_plan(epoch)[index]
        nodes = np.sort(np.concatenate([self.members[c] for c in clusters]))
        adj = batch_input(self.arch, self.graph, nodes, self.diag_lambda, self.device)
        idx = torch.from_numpy(nodes)
        dev = self.device
        return Batch(nodes, adj, self.x[idx].to(dev), self.y[idx].to(dev), self.train[idx].to(dev))

