"""One tensor task, whatever the model: the rows a worker pulled and the weights it got, in; the
tensors and fields it pushes back, out. The tensor worker (``dorylus_py/worker/handler.py``) and the
tests call only :func:`run_task`; each model's maths is in its own kernel module.

Inputs a graph server ships (rows of the chunk; per-edge arrays ``(H, E)`` over the chunk's in-edges)::

    fwd        P                                    (ApplyVertex forward)
    bwd        P, dZ [, dOut] [, dsrc, ddst]        (ApplyVertex backward; SAGE/GAT: dOut; GAT: scores)
    edge_fwd   src, dst, local_ptr, ghost_ptr       (GAT ApplyEdge forward; edges by block, kernels/attention.py)
    edge_bwd   src, dst, local_ptr, ghost_ptr, dalpha   (GAT ApplyEdge backward)
    loss       logits, labels, train
    fused      AP, labels, train                    (GCN's fused last layer: AP = Â P̃, see gcn_ops)
    eval       logits, labels, masks

Outputs: ``fwd`` -> ``Z`` [``S``] [``src``, ``dst``]; ``bwd`` -> ``grad:TENSOR`` per weight tensor of
the layer [``dG`` below layer 0]; ``edge_fwd`` -> ``alpha``; ``edge_bwd`` -> ``ds``, ``ddst``;
``loss`` -> ``dG`` and the field ``loss_sum``; ``fused`` -> ``grad:W{l}``, ``dG`` (``dL/dAP``) and the
field ``loss_sum``; ``eval`` -> the field ``correct``.

What differs between the models is a :class:`ModelKernels` (below), which the model's architecture
(``models/architectures.py``) picks: this module never reads a model's name.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dorylus_py.kernels import attention, gat_ops, gcn_ops, sage_ops
from dorylus_py.kernels.dropout import EDGE, dropout_keep_mask


@dataclass(frozen=True)
class ModelKernels:
    """One model's own tensor maths: its ApplyVertex ``forward(P, weights, layer, keep, rate) -> outputs``
    and ``backward(P, rows, weights, layer, keep, rate) -> (gradients by base name, dG or None)``, and
    its fused last layer ``fused(AP, W, labels, train, num_train) -> (loss_sum, dW, dAP)`` if it has one."""

    name: str  # what messages call the model
    forward: Callable
    backward: Callable
    fused: Callable | None = None


@dataclass(frozen=True)
class TaskContext:
    model: ModelKernels  # the model's architecture picks them (models/architectures.py)
    kind: str
    layer: int
    epoch: int
    seed: int
    rate: float  # dropout on the layer's input (0 in the evaluation forward)
    attn_rate: float = 0.0  # GAT: dropout on attention coefficients (0 in the evaluation forward)
    negative_slope: float = 0.2
    id_start: int = 0  # the chunk's first vertex id (keys vertex dropout)
    edge_start: int = 0  # the id of the chunk's first edge from a local source (keys attention dropout)
    ghost_edge_start: int = 0  # the id of its first edge from a ghost
    num_train: int = 1  # training vertices in the whole graph (the loss is their mean)


class TaskError(ValueError):
    """The task cannot be run as asked (an unknown kind, a missing input)."""


def run_task(ctx: TaskContext, rows: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]):
    """``(tensors, fields)`` of the task's result. ``weights`` are the layer's tensors by base name
    (``W``, ``att_src``, ...); ``rows`` the chunk's inputs above."""
    try:
        if ctx.kind == "fwd":
            return _forward(ctx, rows, weights), {}
        if ctx.kind == "bwd":
            return _backward(ctx, rows, weights), {}
        if ctx.kind in ("edge_fwd", "edge_bwd"):
            return _edge(ctx, rows), {}
        if ctx.kind == "loss":
            loss_sum, grad = gcn_ops.softmax_cross_entropy(rows["logits"], rows["labels"], rows["train"], ctx.num_train)
            return {"dG": grad}, {"loss_sum": float(loss_sum)}
        if ctx.kind == "fused":
            return _fused(ctx, rows, weights)
        if ctx.kind == "eval":
            return {}, {"correct": gcn_ops.correct_counts(rows["logits"], rows["labels"], list(rows["masks"]))}
    except KeyError as e:
        raise TaskError(f"{ctx.model.name} {ctx.kind} task: missing input {e}") from None
    raise TaskError(f"unknown task kind {ctx.kind!r}")


class _RecentMasks:
    """The last vertex masks this process drew, up to ``limit`` bytes: a layer's backward task needs the
    mask its forward drew (the same rows, epoch and layer), and on ``cpu``/``gpu`` both run in the same
    process (a warm Lambda keeps them too, when it gets both). Drawing a 25 k x 128 mask takes 4-5 ms."""

    def __init__(self, limit: int = 64 << 20):
        self.limit, self.masks, self.lock = limit, OrderedDict(), threading.Lock()

    def get(self, key: tuple, draw) -> torch.Tensor:
        with self.lock:
            if key in self.masks:
                self.masks.move_to_end(key)
                return self.masks[key]
        mask = draw()
        with self.lock:
            self.masks[key] = mask
            while sum(m.numel() for m in self.masks.values()) > self.limit and len(self.masks) > 1:
                self.masks.popitem(last=False)
        return mask


_MASKS = _RecentMasks()


def _keep(ctx: TaskContext, p: torch.Tensor):
    if ctx.rate <= 0:
        return None
    key = (ctx.id_start, p.shape[0], p.shape[1], ctx.rate, ctx.seed, ctx.epoch, ctx.layer, p.device)
    return _MASKS.get(key, lambda: dropout_keep_mask(ctx.id_start, ctx.id_start + p.shape[0], p.shape[1], ctx.rate,
                                                     ctx.seed, ctx.epoch, ctx.layer, device=p.device))


def _forward(ctx, t, w) -> dict:
    return ctx.model.forward(t["P"], w, ctx.layer, _keep(ctx, t["P"]), ctx.rate)


def _backward(ctx, t, w) -> dict:
    grads, dg = ctx.model.backward(t["P"], t, w, ctx.layer, _keep(ctx, t["P"]), ctx.rate)
    out = {f"grad:{base}{ctx.layer}": g for base, g in grads.items()}
    return out | ({"dG": dg} if dg is not None else {})


def _fused(ctx, t, w):
    if ctx.model.fused is None:
        raise TaskError(f"the fused last layer is GCN's, not {ctx.model.name}'s")
    loss_sum, dw, dap = ctx.model.fused(t["AP"], w["W"], t["labels"], t["train"], ctx.num_train)
    return {f"grad:W{ctx.layer}": dw, "dG": dap}, {"loss_sum": float(loss_sum)}


def _edge(ctx, t) -> dict:
    """ApplyEdge over a chunk's edges, given and returned in block order (its local block's, then its
    ghost block's: two runs of edge ids), computed in row order."""
    src, dst, local_ptr, ghost_ptr = t["src"], t["dst"], t["local_ptr"], t["ghost_ptr"]
    indptr, order = attention.row_order(local_ptr, ghost_ptr)
    in_rows = (lambda x: x) if order is None else (lambda x: x.index_select(1, order))
    keep = None
    if ctx.attn_rate > 0:
        runs = ((ctx.edge_start, int(local_ptr[-1])), (ctx.ghost_edge_start, int(ghost_ptr[-1])))
        keep = torch.cat([dropout_keep_mask(start, start + count, src.shape[0], ctx.attn_rate, ctx.seed, ctx.epoch,
                                            ctx.layer, EDGE, src.device) for start, count in runs]).t()
        keep = in_rows(keep)
    if ctx.kind == "edge_fwd":
        alpha = attention.apply_edge_forward(in_rows(src), dst, indptr, ctx.negative_slope, keep, ctx.attn_rate)
        return {"alpha": _in_blocks(alpha, order)}
    ds, d_dst = attention.apply_edge_backward(in_rows(src), dst, indptr, in_rows(t["dalpha"]), ctx.negative_slope, keep,
                                              ctx.attn_rate)
    return {"ds": _in_blocks(ds, order), "ddst": d_dst}


def _in_blocks(x: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """A per-edge ``(H, E)`` array in row order back in block order."""
    if order is None:
        return x
    out = torch.empty_like(x)
    out[:, order] = x
    return out


def _gcn_forward(p, w, l, keep, rate) -> dict:
    return {"Z": gcn_ops.apply_vertex_forward(p, w["W"], l, keep, rate)}


def _gcn_backward(p, t, w, l, keep, rate):
    dw, dg = gcn_ops.apply_vertex_backward(p, w["W"], t["dZ"], l, keep, rate)
    return {"W": dw}, dg


def _sage_forward(p, w, l, keep, rate) -> dict:
    z, s = sage_ops.apply_vertex_forward(p, w["W_self"], w["W_neigh"], w["b"], l, keep, rate)
    return {"Z": z, "S": s}


def _sage_backward(p, t, w, l, keep, rate):
    return sage_ops.apply_vertex_backward(p, w["W_self"], w["W_neigh"], t["dZ"], t["dOut"], l, keep, rate)


def _gat_forward(p, w, l, keep, rate) -> dict:
    z, s_src, s_dst, s = gat_ops.apply_vertex_forward(p, w["W"], w["att_src"], w["att_dst"], w["b"], l, keep, rate)
    return {"Z": z, "src": s_src, "dst": s_dst, "S": s}


def _gat_backward(p, t, w, l, keep, rate):
    return gat_ops.apply_vertex_backward(p, w["W"], w["att_src"], w["att_dst"], t["dZ"], t["dsrc"], t["ddst"], t["dOut"],
                                         l, keep, rate)


GCN = ModelKernels("gcn", _gcn_forward, _gcn_backward, gcn_ops.fused_last_layer)
SAGE = ModelKernels("sage", _sage_forward, _sage_backward)
GAT = ModelKernels("gat", _gat_forward, _gat_backward)
