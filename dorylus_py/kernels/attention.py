"""GAT's ApplyEdge tasks: attention over a chunk's in-edges, forward and backward as explicit functions.

For the in-edges ``u -> v`` of a chunk's destinations ``v`` (self loops included), per head ``h``
(Veličković et al., ICLR 2018, https://arxiv.org/abs/1710.10903)::

    e_uv = LeakyReLU(s_src[u] + s_dst[v])          s_src = <Z_h, a_src_h>, s_dst = <Z_h, a_dst_h>
    α_uv = exp(e_uv) / Σ_w exp(e_wv)                softmax over v's in-edges
    α̃_uv = dropout(α_uv)                            keyed by edge id (kernels/dropout.py, stream EDGE)

The worker gets only what the edges' endpoints hold: ``src`` (``(H, E)``, ``s_src`` of each edge's
source, gathered by the graph server), ``dst`` (``(R, H)``, the chunk's own ``s_dst``) and the chunk's
CSR row pointer ``indptr`` (``(R + 1,)``); per-edge arrays are head-major ``(H, E)``. A graph server
numbers its edges by block (local sources, then ghosts: ``graph_servers/graph_state.py``);
:func:`row_order` puts a chunk's two runs into the row order the softmax needs. Backward, from
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


def _rows(indptr: torch.Tensor) -> torch.Tensor:
    """``(E,)``: the destination row of each edge."""
    return torch.repeat_interleave(torch.arange(len(indptr) - 1, device=indptr.device), indptr.diff())


def scores(src: torch.Tensor, dst: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``e`` before the LeakyReLU: ``(H, E)``, ``src[h, e] + dst[v(e), h]``."""
    return src + dst.t().contiguous().index_select(1, rows)


def softmax_per_destination(e: torch.Tensor, indptr: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``(H, E)``: softmax of ``e`` over each destination's in-edges (every row has at least one)."""
    top = torch.segment_reduce(e, "max", offsets=_offsets(indptr, e.shape[0]), axis=1, unsafe=True)
    ex = torch.exp(e - top.index_select(1, rows))
    return ex / segment_sum(ex, indptr).index_select(1, rows)


def apply_edge_forward(src, dst, indptr, slope: float, keep=None, rate: float = 0.0) -> torch.Tensor:
    """``α̃`` ``(H, E)`` from the endpoint scores; ``keep`` ``(H, E)`` bool or None."""
    rows = _rows(indptr)
    alpha = softmax_per_destination(torch.nn.functional.leaky_relu(scores(src, dst, rows), slope), indptr, rows)
    return alpha if keep is None else alpha * (keep * (1.0 / (1.0 - rate)))


def apply_edge_backward(src, dst, indptr, d_alpha, slope: float, keep=None, rate: float = 0.0):
    """From ``dα̃`` ``(H, E)``: ``ds`` ``(H, E)`` (per edge, for the sources) and ``d s_dst`` ``(R, H)``."""
    rows = _rows(indptr)
    e = scores(src, dst, rows)
    alpha = softmax_per_destination(torch.nn.functional.leaky_relu(e, slope), indptr, rows)
    d = d_alpha if keep is None else d_alpha * (keep * (1.0 / (1.0 - rate)))
    de = alpha * (d - segment_sum(alpha * d, indptr).index_select(1, rows))
    ds = torch.where(e > 0, de, de * slope)
    return ds, segment_sum(ds, indptr).t()


def row_order(local_ptr: torch.Tensor, ghost_ptr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(indptr, order)`` of edges given block by block (the rows' edges from the local block, then
    from the ghost block, each with its row pointers): the CSR row pointer over both, and for every
    entry in row order its position in the block order (None when that is the identity: no ghosts)."""
    indptr = local_ptr + ghost_ptr
    if int(ghost_ptr[-1]) == 0:
        return indptr, None
    rows = _rows(indptr)
    within = torch.arange(len(rows), device=indptr.device) - indptr[rows]
    local_len = (local_ptr[1:] - local_ptr[:-1])[rows]
    order = torch.where(within < local_len, local_ptr[rows] + within, local_ptr[-1] + ghost_ptr[rows] + within - local_len)
    return indptr, order

