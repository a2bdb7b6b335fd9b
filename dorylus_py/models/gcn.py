"""GCN (Kipf & Welling, ICLR 2017, https://arxiv.org/abs/1609.02907).

``H_{l+1} = σ(Â · dropout(H_l) · W_l)`` with ``σ`` = ReLU between layers and none after the last;
no bias, as in the paper's reference code and in Dorylus. The product is taken in the cheaper order:
``Â · (H W)`` when the layer narrows the width, ``(Â H) · W`` when it widens it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dorylus_py.kernels.dropout import dropout
from dorylus_py.kernels.sparse import NormalizedAdjacency, spmm


def glorot_(w: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Xavier/Glorot uniform init in place: U(-a, a), a = sqrt(6 / (fan_in + fan_out))."""
    a = math.sqrt(6.0 / (w.shape[0] + w.shape[1]))
    with torch.no_grad():
        return w.uniform_(-a, a, generator=generator)


def glorot_parameters(tensors, seed: int) -> nn.ParameterDict:
    """A model's tensors (``TensorSpec``s) in order from one seeded generator: Glorot weights, zero biases."""
    generator = torch.Generator().manual_seed(seed)
    params = {}
    for t in tensors:
        w = torch.zeros(t.shape)
        if t.base != "b":
            glorot_(w, generator)
        params[t.name] = nn.Parameter(w)
    return nn.ParameterDict(params)


class GCN(nn.Module):
    def __init__(self, dims: list[int], dropout: float = 0.5, seed: int = 0):
        """``dims`` = [features, hidden..., classes]; one weight matrix per consecutive pair.

        ``seed`` draws the initial weights and keys the dropout masks (see ``kernels/dropout.py``).
        """
        super().__init__()
        self.dropout = dropout
        self.seed = seed
        generator = torch.Generator().manual_seed(seed)
        self.weights = nn.ParameterList(
            nn.Parameter(glorot_(torch.empty(a, b), generator)) for a, b in zip(dims[:-1], dims[1:])
        )

    @staticmethod
    def graph_input(graph) -> NormalizedAdjacency:
        """What :meth:`forward` aggregates along: ``Â`` of the whole graph."""
        return NormalizedAdjacency.for_graph(graph)

    def tensors(self) -> dict[str, nn.Parameter]:
        """The weights by name (``W0``, ``W1``, ...), as weight servers and ``weights.npz`` name them."""
        return {f"W{i}": w for i, w in enumerate(self.weights)}

    def forward(self, adj: NormalizedAdjacency, x: torch.Tensor, epoch: int = 0) -> torch.Tensor:
        """(N, F) features -> (N, C) logits; ``epoch`` keys the dropout masks while training."""
        h = x
        last = len(self.weights) - 1
        for i, w in enumerate(self.weights):
            if self.training:
                h = dropout(h, self.dropout, self.seed, epoch, i)
            h = spmm(adj, h @ w) if w.shape[1] <= w.shape[0] else spmm(adj, h) @ w
            if i < last:
                h = F.relu(h)
        return h
