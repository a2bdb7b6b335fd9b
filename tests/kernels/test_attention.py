"""GAT and GraphSAGE kernels: every explicit backward against autograd (float64)."""

import pytest
import torch

from dorylus_py.kernels import attention, gat_ops, sage_ops
from dorylus_py.kernels.dropout import EDGE, dropout_keep_mask
from dorylus_py.kernels.heads import (
    EdgeCSR,
    GatherHeads,
    edge_value_grad,
    gather_heads,
    row_sums,
)


def random_csr(rows, cols, seed, self_loops=True):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, cols, generator=g) < 0.3
    if self_loops:
        mask[torch.arange(rows), torch.arange(rows)] = True
    dense = mask.to(torch.float64)
    csr = dense.to_sparse_csr()
    return EdgeCSR(csr.crow_indices(), csr.col_indices(), (rows, cols)), mask


@pytest.mark.parametrize("concat", [True, False])
def test_gather_heads_backward_passes_gradcheck(concat):
    a, _ = random_csr(7, 9, 0)
    heads, f = 3, 2
    values = torch.rand(heads, a.nnz, dtype=torch.float64, requires_grad=True)
    z = torch.randn(9, heads * f, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v, x: GatherHeads.apply(a, a.transpose(), v, x, heads, concat), (values, z))


def test_gather_heads_equals_dense_products_and_sub_rows_pick_their_edges():
    a, mask = random_csr(6, 8, 1)
    heads, f = 2, 3
    values = torch.rand(heads, a.nnz, dtype=torch.float64)
    z = torch.randn(8, heads * f, dtype=torch.float64)
    out = gather_heads(a, values, z, heads)
    for h in range(heads):
        dense = torch.zeros(6, 8, dtype=torch.float64)
        dense[mask] = values[h]
        torch.testing.assert_close(out[:, h * f : (h + 1) * f], dense @ z[:, h * f : (h + 1) * f])
    torch.testing.assert_close(gather_heads(a.rows(2, 5), values, z, heads), out[2:5])
    at = a.transpose()
    torch.testing.assert_close(row_sums(at.rows(1, 4), values), row_sums(at, values)[1:4])
    torch.testing.assert_close(edge_value_grad(a.rows(2, 5), out[2:5], z, heads), edge_value_grad(a, out, z, heads)[:, a.crow[2]:a.crow[5]])


def test_apply_edge_backward_matches_autograd_with_attention_dropout():
    a, _ = random_csr(6, 10, 2)
    heads, rate = 3, 0.4
    src = torch.randn(heads, a.nnz, dtype=torch.float64, requires_grad=True)
    dst = torch.randn(6, heads, dtype=torch.float64, requires_grad=True)
    keep = dropout_keep_mask(100, 100 + a.nnz, heads, rate, 1, 2, 0, EDGE).t()
    alpha = attention.apply_edge_forward(src, dst, a.crow, 0.2, keep, rate)
    assert torch.allclose(attention.segment_sum(attention.apply_edge_forward(src, dst, a.crow, 0.2), a.crow),
                          torch.ones(heads, 6, dtype=torch.float64))  # a softmax per destination
    d_alpha = torch.randn_like(alpha)
    (alpha * d_alpha).sum().backward()
    ds, d_dst = attention.apply_edge_backward(src.detach(), dst.detach(), a.crow, d_alpha, 0.2, keep, rate)
    torch.testing.assert_close(ds, src.grad)
    torch.testing.assert_close(d_dst, dst.grad)


@pytest.mark.parametrize("layer", [0, 1])
def test_gat_apply_vertex_backward_matches_autograd(layer):
    torch.manual_seed(3)
    heads, f, rows, d = 2, 3, 5, 4
    t = lambda *s: torch.randn(*s, dtype=torch.float64, requires_grad=True)  # noqa: E731
    p_raw, w, a_src, a_dst, b = t(rows, d), t(d, heads * f), t(heads, f), t(heads, f), t(heads * f)
    keep = dropout_keep_mask(0, rows, d, 0.3, 1, 1, layer)
    z, s_src, s_dst, self_rows = gat_ops.apply_vertex_forward(p_raw, w, a_src, a_dst, b, layer, keep, 0.3)
    dz, d_src, d_dst, d_out = torch.randn_like(z), torch.randn_like(s_src), torch.randn_like(s_dst), torch.randn(rows, heads * f, dtype=torch.float64)
    ((z * dz).sum() + (s_src * d_src).sum() + (s_dst * d_dst).sum() + (self_rows * d_out).sum()).backward()
    grads, dg = gat_ops.apply_vertex_backward(p_raw.detach(), w.detach(), a_src.detach(), a_dst.detach(), dz, d_src,
                                              d_dst, d_out, layer, keep, 0.3)
    for name, param in {"W": w, "att_src": a_src, "att_dst": a_dst, "b": b}.items():
        torch.testing.assert_close(grads[name], param.grad)
    if layer == 0:
        assert dg is None
    else:
        torch.testing.assert_close(dg, p_raw.grad)


@pytest.mark.parametrize("layer", [0, 1])
def test_sage_apply_vertex_backward_matches_autograd(layer):
    torch.manual_seed(4)
    t = lambda *s: torch.randn(*s, dtype=torch.float64, requires_grad=True)  # noqa: E731
    p_raw, w_self, w_neigh, b = t(6, 4), t(4, 3), t(4, 3), t(3)
    keep = dropout_keep_mask(0, 6, 4, 0.5, 2, 1, layer)
    z, s = sage_ops.apply_vertex_forward(p_raw, w_self, w_neigh, b, layer, keep, 0.5)
    dz, d_out = torch.randn_like(z), torch.randn_like(s)
    ((z * dz).sum() + (s * d_out).sum()).backward()
    grads, dg = sage_ops.apply_vertex_backward(p_raw.detach(), w_self.detach(), w_neigh.detach(), dz, d_out, layer, keep, 0.5)
    for name, param in {"W_self": w_self, "W_neigh": w_neigh, "b": b}.items():
        torch.testing.assert_close(grads[name], param.grad)
    if layer:
        torch.testing.assert_close(dg, p_raw.grad)

