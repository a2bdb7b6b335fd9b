"""GAT's ApplyEdge tasks: attention over a chunk's in-edges, forward and backward as explicit functions.

For the in-edges ``u -> v`` of a chunk's destinations ``v`` (self loops included), per head ``h``
(Veličković et al., ICLR 2018, https://arxiv.org/abs/1710.10903)::

    e_uv = LeakyReLU(s_src[u] + s_dst[v])          s_src = <Z_h, a_src_h>, s_dst = <Z_h, a_dst_h>
    α_uv = exp(e_uv) / Σ_w exp(e_wv)                softmax over v's in-edges
    α̃_uv = dropout(α_uv)                            keyed by edge id (kernels/dropout.py, stream EDGE)

The worker gets only what the edges' endpoints hold: ``src`` (``(H, E)``, ``s_src`` of each edge's
source, gathered by the graph server), ``dst`` (``(R, H)``, the chunk's own ``s_dst``) and the chunk's
CSR row pointer ``indptr`` (``(R + 1,)``); per-edge arrays are head-major ``(H, E)``. Backward, from
``dα̃`` (the graph server's SDDMM of ``dOut`` and ``Z``)::

    dα = dα̃ · keep / (1 - p);   de = α (dα - Σ_w α_wv dα_wv);   ds = de · LeakyReLU'(e)
    d s_src[u] += Σ_v ds_uv  (the graph server's Scatter, also to peers);   d s_dst[v] = Σ_u ds_uv

The softmax and the LeakyReLU are recomputed from the endpoint values, not stored.
"""

from __future__ import annotations

import torch


def _offsets(indptr: torch.Tensor, heads: int) -> torch.Tensor:
    return indptr.expand(heads, -1).contiguous()


def segment_sum(x: torch.Tensor, indptr: torch.Tensor) -> torch.Tensor:
    """``(H, E)`` -> ``(H, R)``: per head, the sum over each row's edges."""
    return torch.segment_reduce(x, "sum", offsets=_offsets(indptr, x.shape[0]), axis=1, unsafe=True)


def scores(src: torch.Tensor, dst: torch.Tensor, indptr: torch.Tensor) -> torch.Tensor:
    """``e`` before the LeakyReLU: ``(H, E)``, ``src[h, e] + dst[v(e), h]``."""
    rows = torch.repeat_interleave(torch.arange(len(indptr) - 1, device=src.device), indptr.diff())
    return src + dst.t()[:, rows]


def softmax_per_destination(e: torch.Tensor, indptr: torch.Tensor) -> torch.Tensor:
    """``(H, E)``: softmax of ``e`` over each destination's in-edges (every row has at least one)."""
    rows = torch.repeat_interleave(torch.arange(len(indptr) - 1, device=e.device), indptr.diff())
    top = torch.segment_reduce(e, "max", offsets=_offsets(indptr, e.shape[0]), axis=1, unsafe=True)
    ex = torch.exp(e - top[:, rows])
    return ex / segment_sum(ex, indptr)[:, rows]


def apply_edge_forward(src, dst, indptr, slope: float, keep=None, rate: float = 0.0) -> torch.Tensor:
    """``α̃`` ``(H, E)`` from the endpoint scores; ``keep`` ``(H, E)`` bool or None."""
    alpha = softmax_per_destination(torch.nn.functional.leaky_relu(scores(src, dst, indptr), slope), indptr)
    return alpha if keep is None else alpha * keep * (1.0 / (1.0 - rate))


def apply_edge_backward(src, dst, indptr, d_alpha, slope: float, keep=None, rate: float = 0.0):
    """From ``dα̃`` ``(H, E)``: ``ds`` ``(H, E)`` (per edge, for the sources) and ``d s_dst`` ``(R, H)``."""
    e = scores(src, dst, indptr)
    alpha = softmax_per_destination(torch.nn.functional.leaky_relu(e, slope), indptr)
    d = d_alpha if keep is None else d_alpha * keep * (1.0 / (1.0 - rate))
    rows = torch.repeat_interleave(torch.arange(len(indptr) - 1, device=e.device), indptr.diff())
    de = alpha * (d - segment_sum(alpha * d, indptr)[:, rows])
    ds = torch.where(e > 0, de, de * slope)
    return ds, segment_sum(ds, indptr).t()
