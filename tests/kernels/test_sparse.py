import numpy as np
import torch

from dorylus_py.kernels import NormalizedAdjacency, gcn_norm_weights, spmm


def dense_a_hat(g):
    n = g.num_nodes
    a = np.zeros((n, n))
    src, dst = g.edges()
    a[dst, src] = 1.0
    a += np.eye(n)
    d = a.sum(1)
    return a / np.sqrt(d)[:, None] / np.sqrt(d)[None, :]


def test_gcn_norm_matches_dense_formula(small_graph):
    indptr, indices, weights = gcn_norm_weights(small_graph.indptr, small_graph.indices)
    n = small_graph.num_nodes
    got = np.zeros((n, n))
    got[np.repeat(np.arange(n), np.diff(indptr)), indices] = weights
    np.testing.assert_allclose(got, dense_a_hat(small_graph), rtol=1e-6)
    assert all((np.diff(indices[indptr[i] : indptr[i + 1]]) > 0).all() for i in range(n))


def test_spmm_forward_and_backward_match_dense(small_graph):
    adj = NormalizedAdjacency.for_graph(small_graph)
    dense = torch.tensor(dense_a_hat(small_graph), dtype=torch.float64)
    h = torch.randn(small_graph.num_nodes, 5, requires_grad=True)
    w = torch.randn(small_graph.num_nodes, 5)
    out = spmm(adj, h)
    (out * w).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), (dense @ h.detach().double()).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h.grad.numpy(), (dense.T @ w.double()).numpy(), rtol=1e-4, atol=1e-5)


def test_rectangular_transpose():
    # 2 x 3 matrix [[1, 0, 2], [0, 3, 0]]
    adj = NormalizedAdjacency.from_csr([0, 2, 3], [0, 2, 1], [1.0, 2.0, 3.0], (2, 3))
    assert adj.transpose.to_dense().tolist() == [[1, 0], [0, 3], [2, 0]]
    g = torch.ones(2, 1)
    h = torch.zeros(3, 1, requires_grad=True)
    spmm(adj, h).backward(g)
    assert h.grad.squeeze(1).tolist() == [1.0, 3.0, 2.0]
