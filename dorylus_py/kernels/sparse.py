"""GCN normalisation and the sparse Gather kernel.

``Â = D^-1/2 (A + I) D^-1/2`` where ``D`` counts in-edges plus the self loop (as PyG's ``gcn_norm``).
Gather is ``Â @ H`` with a torch CSR tensor; its backward is ``Âᵀ @ G`` with a transposed CSR built
once beside it, which on 2 cores is about 10x faster than a scatter-based message-passing step.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch


def gcn_norm_weights(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the CSR of ``Â`` (self loops added): ``(indptr, indices, weights)``, rows = destinations.

    ``indptr``/``indices`` is the in-edge CSR of a graph without self loops.
    """
    n = len(indptr) - 1
    deg = np.diff(indptr).astype(np.float64) + 1.0
    inv_sqrt = 1.0 / np.sqrt(deg)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    # Insert the diagonal: sort keys (row, col) of edges plus self loops.
    all_rows = np.concatenate([rows, np.arange(n, dtype=np.int64)])
    all_cols = np.concatenate([indices, np.arange(n, dtype=np.int64)])
    order = np.lexsort((all_cols, all_rows))
    all_rows, all_cols = all_rows[order], all_cols[order]
    weights = (inv_sqrt[all_rows] * inv_sqrt[all_cols]).astype(np.float32)
    new_indptr = indptr + np.arange(n + 1, dtype=np.int64)
    return new_indptr, all_cols, weights


def mean_weights(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Values of ``M = D⁻¹A`` (GraphSAGE's mean) on the pattern of ``A + I``: 0 on each row's self loop
    (column = row), ``1 / in-degree`` elsewhere. Rows are local rows; a row's self loop is column ``row``."""
    lens = np.diff(indptr)
    rows = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    degree = np.maximum(lens - 1, 1).astype(np.float64)
    return np.where(np.asarray(indices) == rows, 0.0, 1.0 / degree[rows]).astype(np.float32)


@dataclass(frozen=True, eq=False)
class NormalizedAdjacency:
    """A sparse matrix as a torch CSR tensor, with its transpose kept for backward."""

    matrix: torch.Tensor  # (R, C) sparse CSR, float32
    transpose: torch.Tensor  # (C, R) sparse CSR, float32

    @classmethod
    def from_csr(cls, indptr, indices, weights, shape: tuple[int, int], device="cpu") -> "NormalizedAdjacency":
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            matrix = torch.sparse_csr_tensor(
                torch.as_tensor(np.array(indptr), dtype=torch.int64),
                torch.as_tensor(np.array(indices), dtype=torch.int64),
                torch.as_tensor(np.array(weights), dtype=torch.float32),
                size=shape,
                check_invariants=False,  # built here from validated arrays
            )
            transpose = matrix.t().to_sparse_csr()
        return cls(matrix.to(device), transpose.to(device))

    @classmethod
    def for_graph(cls, graph, device="cpu") -> "NormalizedAdjacency":
        """``Â`` of a :class:`~dorylus_py.data.Graph`."""
        indptr, indices, weights = gcn_norm_weights(graph.indptr, graph.indices)
        n = graph.num_nodes
        return cls.from_csr(indptr, indices, weights, (n, n), device)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.matrix.shape)


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, adj: NormalizedAdjacency, h: torch.Tensor) -> torch.Tensor:  # (R, C) @ (C, F) -> (R, F)
        ctx.adj = adj
        return torch.sparse.mm(adj.matrix, h)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # (R, F) -> (C, F)
        if not ctx.needs_input_grad[1]:
            return None, None
        return None, torch.sparse.mm(ctx.adj.transpose, grad.contiguous())


def spmm(adj: NormalizedAdjacency, h: torch.Tensor) -> torch.Tensor:
    """Gather: ``adj.matrix @ h``, differentiable in ``h`` through the precomputed transpose."""
    return _SpMM.apply(adj, h)
