"""Gather with per-edge values that differ per head (GAT), its backward, and the edge values' gradient.

A layer with ``H`` heads of width ``F`` aggregates ``Z`` (``(C, H·F)``, head ``h`` in columns
``h·F .. (h+1)·F``) along the edges of a CSR ``A`` (``R x C``, rows = destinations) whose entry for
edge ``e`` is ``values[h, e]`` in head ``h``::

    concat:  out[:, h] = A_h Z_h                     (R, H·F)    hidden GAT layers
    mean:    out       = 1/H Σ_h A_h Z_h             (R, F)      the last GAT layer

Backward, with ``dOut`` the gradient of ``out``: ``dZ_h = A_hᵀ dOut_h`` (mean: ``A_hᵀ dOut / H``),
and ``dvalues[h, e] = <dOut_h[dst e], Z_h[src e]>`` (mean: ``<dOut[dst e], Z_h[src e]> / H``), a
sampled dense-dense product (SDDMM). Per-edge arrays are head-major ``(H, E)``, so one head's values
are one contiguous row and need no copy to become a CSR's values; nothing per edge is wider than
``H``. GCN and GraphSAGE are the case ``H = 1`` with fixed values. :class:`HeadBlocks` is a graph
server's ``A`` in the store's local and ghost blocks, its edges numbered block by block.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch

from dorylus_py.kernels.sparse import tensor_view


@dataclass(frozen=True, eq=False)
class EdgeCSR:
    """A sparse pattern whose values come from per-edge arrays: entry ``i`` (in CSR order) takes the
    value of edge ``edge[i]``, or of ``edge_start + i`` when ``edge`` is None (a contiguous run)."""

    crow: torch.Tensor  # (R + 1,) int64
    col: torch.Tensor  # (nnz,) int64, in [0, C)
    shape: tuple[int, int]  # (R, C)
    edge: torch.Tensor | None = None  # (nnz,) int64 positions in the per-edge arrays
    edge_start: int = 0
    fixed: tuple[torch.Tensor, ...] | None = None  # per head, a CSR tensor built once for fixed values

    @classmethod
    def from_csr(cls, indptr, indices, num_cols: int) -> "EdgeCSR":
        crow = torch.from_numpy(np.array(indptr, dtype=np.int64))  # copies: the partition's arrays are read-only maps
        return cls(crow, torch.from_numpy(np.array(indices, dtype=np.int64)), (len(crow) - 1, num_cols))

    def to(self, device) -> "EdgeCSR":
        edge = None if self.edge is None else self.edge.to(device)
        return EdgeCSR(self.crow.to(device), self.col.to(device), self.shape, edge, self.edge_start)

    @property
    def nnz(self) -> int:
        return int(self.col.numel())

    def rows(self, a: int, b: int) -> "EdgeCSR":
        """Rows ``a..b-1`` (their edges stay where they are in the per-edge arrays)."""
        lo, hi = int(self.crow[a]), int(self.crow[b])
        crow = self.crow[a : b + 1] - lo
        if self.edge is None:
            return EdgeCSR(crow, self.col[lo:hi], (b - a, self.shape[1]), None, self.edge_start + lo)
        return EdgeCSR(crow, self.col[lo:hi], (b - a, self.shape[1]), self.edge[lo:hi])

    def row_of_entry(self) -> torch.Tensor:
        """``(nnz,)``: the row of every entry."""
        return torch.repeat_interleave(torch.arange(self.shape[0], device=self.crow.device), self.crow.diff())

    def edges(self) -> torch.Tensor:
        """``(nnz,)``: the edge of every entry."""
        if self.edge is None:
            return torch.arange(self.edge_start, self.edge_start + self.nnz, device=self.crow.device)
        return self.edge

    def transpose(self) -> "EdgeCSR":
        """``Aᵀ`` (``C x R``) over the same edges; rows of the transpose list their entries by row of ``A``."""
        order = torch.argsort(self.col, stable=True)
        crow = torch.cat([torch.zeros(1, dtype=torch.int64, device=self.col.device),
                          torch.bincount(self.col, minlength=self.shape[1]).cumsum(0)])
        return EdgeCSR(crow, self.row_of_entry()[order], (self.shape[1], self.shape[0]), self.edges()[order])

    def pick(self, values: torch.Tensor) -> torch.Tensor:
        """``(H, nnz)``: the entries' values from a per-edge ``(H, E)`` array (a view for a contiguous run)."""
        if self.edge is None:
            return values[:, self.edge_start : self.edge_start + self.nnz]
        return values.index_select(1, self.edge)

    def matrix(self, entry_values: torch.Tensor) -> torch.Tensor:
        """A torch CSR tensor with one value per entry (int32 indices where they fit: the sparse kernels
        convert int64 ones on every call)."""
        crow, col = self._indices()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            return torch.sparse_csr_tensor(crow, col, entry_values.contiguous(), self.shape, check_invariants=False)

    def _indices(self) -> tuple[torch.Tensor, torch.Tensor]:
        cached = self.__dict__.get("_int32")
        if cached is None:
            small = self.nnz < 2**31 and max(self.shape) < 2**31
            cached = (self.crow.int(), self.col.int()) if small else (self.crow, self.col)
            object.__setattr__(self, "_int32", cached)
        return cached

    def matrices(self, values: torch.Tensor | None) -> list[torch.Tensor]:
        """One CSR tensor per head with the values of ``values`` ``(H, E)``, or the fixed ones."""
        if self.fixed is not None:
            return list(self.fixed)
        return [self.matrix(v) for v in self.pick(values)]

    def nbytes(self) -> int:
        """Bytes of its index arrays and edge map."""
        return edge_csr_nbytes(self)

    def fix(self, values: torch.Tensor) -> "EdgeCSR":
        """The same pattern with ``values`` built in once (GCN's ``Â``, GraphSAGE's mean: values that
        never change), so products need no per-call gather of the values."""
        return replace(self, fixed=tuple(self.matrix(v) for v in self.pick(values)))


def edge_csr_nbytes(*ms: EdgeCSR) -> int:
    """Bytes of the index arrays and edge maps behind ``ms``, an array shared by several counted once."""
    arrays = {(t.data_ptr(), t.nbytes) for m in ms for t in (m.crow, m.col, m.edge) if t is not None}
    return sum(nbytes for _, nbytes in arrays)


def _head(x: torch.Tensor, h: int, width: int) -> torch.Tensor:
    return x[:, h * width : (h + 1) * width]


def gather_heads(a: EdgeCSR, values: torch.Tensor, z: torch.Tensor, heads: int, concat: bool = True) -> torch.Tensor:
    """Gather: ``(C, H·F)`` -> ``(R, H·F)`` (concat) or ``(R, F)`` (mean over heads); ``values`` ``(H, E)``."""
    f = z.shape[1] // heads
    mats = a.matrices(values)
    if heads == 1:
        return torch.sparse.mm(mats[0], z.contiguous())
    parts = [torch.sparse.mm(mats[h], _head(z, h, f).contiguous()) for h in range(heads)]
    return torch.cat(parts, dim=1) if concat else torch.stack(parts).sum(0) / heads


def gather_heads_backward(at: EdgeCSR, values: torch.Tensor, d_out: torch.Tensor, heads: int,
                          concat: bool = True) -> torch.Tensor:
    """``dZ`` ``(C, H·F)`` from ``dOut`` through the transpose ``at`` (``EdgeCSR.transpose()`` of Gather's)."""
    mats = at.matrices(values)
    if heads == 1:
        return torch.sparse.mm(mats[0], d_out.contiguous())
    if concat:
        f = d_out.shape[1] // heads
        return torch.cat([torch.sparse.mm(mats[h], _head(d_out, h, f).contiguous()) for h in range(heads)], dim=1)
    d = d_out.contiguous() / heads
    return torch.cat([torch.sparse.mm(mats[h], d) for h in range(heads)], dim=1)


def edge_value_grad(a: EdgeCSR, d_out: torch.Tensor, z: torch.Tensor, heads: int, concat: bool = True) -> torch.Tensor:
    """``(H, nnz)``: the gradient of Gather's entries, ``<dOut_h[row], Z_h[col]>`` (mean: ``/ H``)."""
    f = z.shape[1] // heads
    out = torch.zeros((heads, a.nnz), dtype=z.dtype, device=z.device)
    if a.nnz == 0:
        return out
    pattern = a.matrix(torch.zeros(a.nnz, dtype=z.dtype, device=z.device))
    for h in range(heads):
        left = _head(d_out, h, f).contiguous() if concat else d_out.contiguous() / heads
        out[h] = torch.sparse.sampled_addmm(pattern, left, _head(z, h, f).t(), beta=0.0).values()
    return out


def row_sums(a: EdgeCSR, values: torch.Tensor) -> torch.Tensor:
    """``(R, H)``: per row, the sum of its entries' values (per head)."""
    vals = a.pick(values)
    heads = vals.shape[0]
    if a.nnz == 0:
        return torch.zeros((a.shape[0], heads), dtype=values.dtype, device=values.device)
    offsets = a.crow.expand(heads, -1).contiguous()
    return torch.segment_reduce(vals.contiguous(), "sum", offsets=offsets, axis=1, unsafe=True).t()


class GatherHeads(torch.autograd.Function):
    """Autograd form of :func:`gather_heads` for the reference trainer (backward: the two functions above)."""

    @staticmethod
    def forward(ctx, a: EdgeCSR, at: EdgeCSR, values, z, heads: int, concat: bool):
        ctx.save_for_backward(values, z)
        ctx.graph = (a, at, heads, concat)
        return gather_heads(a, values, z, heads, concat)

    @staticmethod
    def backward(ctx, d_out):
        values, z = ctx.saved_tensors
        a, at, heads, concat = ctx.graph
        d_values = edge_value_grad(a, d_out, z, heads, concat) if ctx.needs_input_grad[2] else None
        d_z = gather_heads_backward(at, values, d_out, heads, concat) if ctx.needs_input_grad[3] else None
        return None, None, d_values, d_z, None, None


def _compact(m: EdgeCSR) -> EdgeCSR:
    """``m`` with int32 row pointers, columns and edge map where the counts allow (half the bytes)."""
    if m.nnz >= 2**31 or max(m.shape) >= 2**31 or (m.edge is not None and m.edge.numel() and int(m.edge.max()) >= 2**31):
        return m
    return replace(m, crow=m.crow.int(), col=m.col.int(), edge=None if m.edge is None else m.edge.int())


@dataclass(frozen=True, eq=False)
class HeadBlocks:
    """Rows of a partition's ``A`` (all its rows, or one chunk's) with per-edge values ``(H, E)``, in the
    store's two blocks: ``local`` over local columns, its edges numbered ``0..nnz_L-1`` in CSR order, and
    ``ghost`` over ghost columns, numbered from ``nnz_L``; so a chunk's edges are two contiguous runs and
    its values two views. ``local_t`` (rows = local sources) maps its entries to their edges for backward.
    The blocks' index arrays are the store's (memory-mapped, int32 where it has them)."""

    local: EdgeCSR  # (R, n)
    ghost: EdgeCSR  # (R, g)
    local_t: EdgeCSR  # (R, n) rows of Aᵀ over local sources, with an edge map

    @classmethod
    def from_arrays(cls, local_indptr, local_indices, ghost_indptr, ghost_indices, n: int, g: int) -> "HeadBlocks":
        local = EdgeCSR(tensor_view(local_indptr), tensor_view(local_indices), (n, n))
        ghost = EdgeCSR(tensor_view(ghost_indptr), tensor_view(ghost_indices), (n, g), None, local.nnz)
        return cls(local, ghost, _compact(local.transpose()))

    def to(self, device) -> "HeadBlocks":
        """These blocks on ``device``."""
        return HeadBlocks(self.local.to(device), self.ghost.to(device), self.local_t.to(device))

    def rows(self, a: int, b: int) -> "HeadBlocks":
        """Rows ``a..b-1`` (views; their edges keep their numbers)."""
        if a == 0 and b == self.local.shape[0]:
            return self
        return HeadBlocks(self.local.rows(a, b), self.ghost.rows(a, b), self.local_t.rows(a, b))

    def edge_runs(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """The edges of these rows: ``(lo, hi)`` of the local block's run and of the ghost block's."""
        return ((self.local.edge_start, self.local.edge_start + self.local.nnz),
                (self.ghost.edge_start, self.ghost.edge_start + self.ghost.nnz))

    def gather(self, values: torch.Tensor, zg: torch.Tensor, heads: int, concat: bool) -> torch.Tensor:
        """These rows of ``A [Z | Z_ghost]``, ``zg`` having the ghosts' rows last."""
        n = self.local.shape[1]
        out = gather_heads(self.local, values, zg[:n], heads, concat)
        return out + gather_heads(self.ghost, values, zg[n:], heads, concat) if self.ghost.nnz else out

    def gather_t(self, values: torch.Tensor, d_out: torch.Tensor, heads: int, concat: bool) -> torch.Tensor:
        """These rows of ``A_LLᵀ dOut`` (``d_out`` over all local rows)."""
        return gather_heads_backward(self.local_t, values, d_out, heads, concat)

    def value_grads(self, d_out: torch.Tensor, zg: torch.Tensor, heads: int, concat: bool):
        """``(H, nnz)`` per block: the SDDMM ``<dOut_h[row], Z_h[col]>`` of each entry."""
        n = self.local.shape[1]
        return edge_value_grad(self.local, d_out, zg[:n], heads, concat), edge_value_grad(self.ghost, d_out, zg[n:],
                                                                                          heads, concat)

    def ghost_transpose(self) -> tuple[np.ndarray, EdgeCSR]:
        """``(touched, A_LGᵀ)``: the ghosts these rows have edges from (sorted) and the transposed block
        over them, ``(len(touched), R)``, its entries mapped to their edges."""
        cols = self.ghost.col.to(torch.int64)
        touched = torch.unique(cols)
        compact = replace(self.ghost, col=torch.searchsorted(touched, cols), shape=(self.ghost.shape[0], len(touched)))
        return touched.numpy(), _compact(compact.transpose())

    def nbytes(self) -> int:
        """Bytes of the index arrays and edge maps behind these blocks (each array once)."""
        return edge_csr_nbytes(self.local, self.ghost, self.local_t)
