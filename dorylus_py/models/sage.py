"""GraphSAGE with the mean aggregator (Hamilton et al., NeurIPS 2017, https://arxiv.org/abs/1706.02216),
full batch, the reference (autograd) form.

``h'_v = W_selfᵀ h_v + W_neighᵀ mean_{u -> v} h_u + b``: ReLU between layers, dropout on each layer's
input (keyed by vertex), no normalisation of the output (PyG ``SAGEConv``'s defaults). The mean is a
sparse product with ``M = D⁻¹A`` (a vertex without in-neighbours gets 0), taken in the cheaper order
(``M (h W)`` when the layer narrows, ``(M h) W`` when it widens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from dorylus_py.kernels.dropout import dropout
from dorylus_py.kernels.sparse import (
    NormalizedAdjacency,
    gcn_norm_weights,
    mean_weights,
    spmm,
)
from dorylus_py.models.gcn import glorot_parameters

if TYPE_CHECKING:  # a type only: spec.py sits above the architectures that build these modules
    from dorylus_py.models.spec import ModelSpec


def mean_adjacency(graph, device="cpu") -> NormalizedAdjacency:
    """``M = D⁻¹A`` over the pattern of ``A + I`` with zero on the diagonal (the graph servers' pattern)."""
    indptr, indices, _ = gcn_norm_weights(graph.indptr, graph.indices)
    n = graph.num_nodes
    return NormalizedAdjacency.from_csr(indptr, indices, mean_weights(indptr, indices), (n, n), device)


class SAGE(nn.Module):
    def __init__(self, spec: ModelSpec, dropout: float = 0.5, seed: int = 0):
        super().__init__()
        self.spec, self.dropout, self.seed = spec, dropout, seed
        self.params = glorot_parameters(spec.tensors(), seed)

    graph_input = staticmethod(mean_adjacency)

    def tensors(self) -> dict[str, nn.Parameter]:
        return dict(self.params)

    def forward(self, m: NormalizedAdjacency, x: torch.Tensor, epoch: int = 0) -> torch.Tensor:
        h = x
        for l in range(self.spec.num_layers):
            if l:
                h = torch.relu(h)
            if self.training:
                h = dropout(h, self.dropout, self.seed, epoch, l)
            w_neigh = self.params[f"W_neigh{l}"]
            neigh = spmm(m, h @ w_neigh) if w_neigh.shape[1] <= w_neigh.shape[0] else spmm(m, h) @ w_neigh
            h = neigh + h @ self.params[f"W_self{l}"] + self.params[f"b{l}"]
        return h
