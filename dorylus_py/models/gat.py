"""GAT (Veličković et al., ICLR 2018, https://arxiv.org/abs/1710.10903), the reference (autograd) form.

Per layer and head: ``z = P W``, ``e_uv = LeakyReLU(a_srcᵀ z_u + a_dstᵀ z_v)`` over the in-edges of
``v`` and its self loop, ``α = softmax_v(e)``, ``h'_v = Σ_u α_uv z_u``; heads concatenated in hidden
layers and averaged in the last, then ``+ b``; ELU between layers; dropout on each layer's input
(keyed by vertex) and on the attention coefficients (keyed by edge: the position of ``u -> v`` in the
CSR of ``A + I``, which is a single graph server's edge numbering too). The scores and the softmax are
plain torch autograd; the aggregation is :class:`~dorylus_py.kernels.heads.GatherHeads` (a sparse
product per head, its backward checked against autograd in the tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from dorylus_py.kernels.dropout import EDGE, dropout, dropout_keep_mask
from dorylus_py.kernels.heads import EdgeCSR, GatherHeads
from dorylus_py.kernels.sparse import gcn_norm_weights
from dorylus_py.models.gcn import glorot_parameters

if TYPE_CHECKING:  # a type only: spec.py sits above the architectures that build these modules
    from dorylus_py.models.spec import ModelSpec


@dataclass(frozen=True, eq=False)
class AttentionGraph:
    """``A + I`` as edges: the CSR (rows = destinations), its transpose, and each edge's ends."""

    a: EdgeCSR
    at: EdgeCSR
    dst: torch.Tensor  # (E,) destination (row) of each edge
    src: torch.Tensor  # (E,) source (column) of each edge

    @classmethod
    def for_graph(cls, graph, device="cpu") -> "AttentionGraph":
        indptr, indices, _ = gcn_norm_weights(graph.indptr, graph.indices)
        a = EdgeCSR.from_csr(indptr, indices, graph.num_nodes).to(device)
        return cls(a, a.transpose(), a.row_of_entry(), a.col)


class _PerEdge(torch.autograd.Function):
    """``x[dst]`` for edges sorted by destination: its backward is a segment sum over each destination's
    edges, not the scatter-add of ``index_select``'s backward (3x the time on 4 M edges)."""

    @staticmethod
    def forward(ctx, x, indptr, dst):
        ctx.save_for_backward(indptr)
        return x.index_select(0, dst)

    @staticmethod
    def backward(ctx, grad):
        (indptr,) = ctx.saved_tensors
        return torch.segment_reduce(grad, "sum", offsets=indptr, axis=0, unsafe=True), None, None


def _per_edge(x: torch.Tensor, indptr: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return _PerEdge.apply(x, indptr, dst)


class GAT(nn.Module):
    def __init__(self, spec: ModelSpec, dropout: float = 0.6, attn_dropout: float = 0.6, seed: int = 0):
        super().__init__()
        self.spec, self.dropout, self.attn_dropout, self.seed = spec, dropout, attn_dropout, seed
        self.params = glorot_parameters(spec.tensors(), seed)

    graph_input = staticmethod(AttentionGraph.for_graph)

    def tensors(self) -> dict[str, nn.Parameter]:
        return dict(self.params)

    def forward(self, g: AttentionGraph, x: torch.Tensor, epoch: int = 0) -> torch.Tensor:
        h = x
        for l, s in enumerate(self.spec.layers):
            if l:
                h = F.elu(h)
            if self.training:
                h = dropout(h, self.dropout, self.seed, epoch, l)
            z = h @ self.params[f"W{l}"]  # (N, H·F)
            zh = z.view(-1, s.heads, s.per_head)
            s_src = (zh * self.params[f"att_src{l}"]).sum(-1)  # (N, H)
            s_dst = (zh * self.params[f"att_dst{l}"]).sum(-1)
            # per edge, (E, H): index_select and segment reductions along rows are the fast paths
            e = F.leaky_relu(s_src.index_select(0, g.src) + _per_edge(s_dst, g.a.crow, g.dst), self.spec.negative_slope)
            top = torch.segment_reduce(e.detach(), "max", offsets=g.a.crow, axis=0, unsafe=True)
            ex = torch.exp(e - top.index_select(0, g.dst))
            if self.training and self.attn_dropout:  # keyed by edge; the scale folded into the mask
                keep = dropout_keep_mask(0, g.a.nnz, s.heads, self.attn_dropout, self.seed, epoch, l, EDGE, ex.device)
                ex_kept = ex * (keep * (1.0 / (1.0 - self.attn_dropout)))
            else:
                ex_kept = ex
            den = torch.segment_reduce(ex, "sum", offsets=g.a.crow, axis=0, unsafe=True)
            alpha = (ex_kept / _per_edge(den, g.a.crow, g.dst)).t().contiguous()  # (H, E): a head's values, one CSR's
            h = GatherHeads.apply(g.a, g.at, alpha, z, s.heads, s.concat) + self.params[f"b{l}"]
        return h
