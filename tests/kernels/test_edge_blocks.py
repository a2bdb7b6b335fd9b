"""A graph server's edges by block (local sources, then ghosts): GAT's ApplyEdge tasks given a chunk's
edges in that order give what the row-order kernels give, attention dropout keyed by each edge's id."""

import numpy as np
import pytest
import torch

from dorylus_py.kernels import attention
from dorylus_py.kernels.dropout import EDGE, dropout_keep_mask
from dorylus_py.kernels.heads import EdgeCSR, HeadBlocks, gather_heads
from dorylus_py.kernels.tasks import TaskContext, run_task
from dorylus_py.models import architecture


def blocks(rows=9, n=9, g=5, seed=0):
    """Random local and ghost blocks (self loops in the local one) as CSR arrays."""
    rng = np.random.default_rng(seed)
    local = rng.random((rows, n)) < 0.3
    local[np.arange(rows), np.arange(rows)] = True
    ghost = rng.random((rows, g)) < 0.3
    ghost[2] = False  # a row without ghost edges
    ptr = lambda m: np.concatenate([[0], np.cumsum(m.sum(1))]).astype(np.int32)
    cols = lambda m: np.nonzero(m)[1].astype(np.int32)
    return (ptr(local), cols(local)), (ptr(ghost), cols(ghost)), local, ghost


def test_row_order_interleaves_each_rows_two_runs():
    (lp, lc), (gp, gc), local, ghost = blocks()
    indptr, order = attention.row_order(torch.from_numpy(lp).long(), torch.from_numpy(gp).long())
    cols_blocks = np.concatenate([lc, len(local) + gc])  # ghost columns after the local ones
    combined = np.concatenate([local, ghost], axis=1)
    assert indptr.tolist() == np.concatenate([[0], np.cumsum(combined.sum(1))]).tolist()
    assert cols_blocks[order.numpy()].tolist() == np.nonzero(combined)[1].tolist()  # row by row, in column order


@pytest.mark.parametrize("kind", ["edge_fwd", "edge_bwd"])
def test_edge_task_in_block_order_equals_the_row_order_kernels(kind):
    (lp, lc), (gp, gc), local, ghost = blocks()
    heads, rate, rows = 3, 0.4, len(local)
    g = torch.Generator().manual_seed(1)
    e = int(lp[-1] + gp[-1])
    src, dst, dalpha = torch.randn(heads, e, generator=g), torch.randn(rows, heads, generator=g), torch.randn(heads, e, generator=g)
    ctx = TaskContext(model=architecture("gat").kernels(), kind=kind, layer=0, epoch=2, seed=5, rate=0.0, attn_rate=rate,
                      edge_start=100, ghost_edge_start=1000)
    t = {"src": src, "dst": dst, "local_ptr": torch.from_numpy(lp).long(), "ghost_ptr": torch.from_numpy(gp).long(),
         "dalpha": dalpha}
    got, _ = run_task(ctx, t, {})
    # the same edges in row order, each with its own id's dropout draw
    indptr, order = attention.row_order(t["local_ptr"], t["ghost_ptr"])
    ids = torch.cat([torch.arange(100, 100 + int(lp[-1])), torch.arange(1000, 1000 + int(gp[-1]))])[order]
    keep = torch.stack([dropout_keep_mask(int(i), int(i) + 1, heads, rate, 5, 2, 0, EDGE)[0] for i in ids]).t()
    if kind == "edge_fwd":
        want = attention.apply_edge_forward(src[:, order], dst, indptr, 0.2, keep, rate)
        torch.testing.assert_close(got["alpha"][:, order], want)
    else:
        ds, ddst = attention.apply_edge_backward(src[:, order], dst, indptr, dalpha[:, order], 0.2, keep, rate)
        torch.testing.assert_close(got["ds"][:, order], ds)
        torch.testing.assert_close(got["ddst"], ddst)


def test_head_blocks_gather_and_backward_equal_the_combined_matrix():
    (lp, lc), (gp, gc), local, ghost = blocks()
    n, heads, f = len(local), 2, 3
    hb = HeadBlocks.from_arrays(lp, lc, gp, gc, n, ghost.shape[1])
    e = int(lp[-1] + gp[-1])
    g = torch.Generator().manual_seed(2)
    values, zg = torch.rand(heads, e, generator=g), torch.randn(n + ghost.shape[1], heads * f, generator=g)
    # the combined CSR over [local | ghost] columns, its entries' values taken by block position
    combined = np.concatenate([local, ghost], axis=1)
    _, order = attention.row_order(torch.from_numpy(lp).long(), torch.from_numpy(gp).long())
    full = EdgeCSR(torch.from_numpy(np.concatenate([[0], np.cumsum(combined.sum(1))])), torch.from_numpy(np.nonzero(combined)[1]),
                   combined.shape, order)
    torch.testing.assert_close(hb.gather(values, zg, heads, True), gather_heads(full, values, zg, heads, True))
    for a, b in ((0, n), (3, 7)):
        dg = torch.randn(n, heads * f, generator=g)
        dense = torch.zeros(heads, n, n)  # A_LL per head from its entries' values
        rows_, cols_ = np.nonzero(local)
        dense[:, rows_, cols_] = values[:, : int(lp[-1])]
        want = torch.cat([dense[h].t() @ dg[:, h * f : (h + 1) * f] for h in range(heads)], dim=1)[a:b]
        torch.testing.assert_close(hb.rows(a, b).gather_t(values, dg, heads, True), want)
    assert hb.local_t.edge.dtype == torch.int32 and hb.local.col.dtype == torch.int32  # the store's int32, no copy
