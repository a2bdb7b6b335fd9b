"""Gather and Gather backward on one partition equal the global matrices', whole and chunk by chunk."""

import numpy as np
import pytest
import torch

from dorylus_py.kernels import NormalizedAdjacency
from dorylus_py.models.spec import model_spec
from dorylus_py.partition import PartitionStore, prepare
from graph_servers.graph_state import GraphState

GCN = model_spec("gcn", [16, 8, 4])


def test_gather_and_backward_match_the_global_matrices(small_graph, tmp_path):
    """One partition (K = 1): Gather is Â·Z and Gather backward Âᵀ·dG, whole and chunk by chunk."""
    prepare(small_graph, tmp_path / "p", 1, "hash")
    state = GraphState(PartitionStore.open(tmp_path / "p").load(0), GCN, [3], "none")
    adj = NormalizedAdjacency.for_graph(small_graph)
    z, dg = np.random.default_rng(0).standard_normal((2, small_graph.num_nodes, 8)).astype(np.float32)
    state.ZG[True][0][:] = z
    state.dG[0][:] = dg
    state.gather(True, 0, None)
    torch.testing.assert_close(torch.from_numpy(state.G[True][0]), torch.sparse.mm(adj.matrix, torch.from_numpy(z)))
    state.gather_backward(0, None)
    expected = torch.sparse.mm(adj.transpose, torch.from_numpy(dg))
    torch.testing.assert_close(torch.from_numpy(state.dZ[0]), expected, rtol=1e-5, atol=1e-6)
    state.dZ[0][:] = 0
    for c in range(state.chunks):
        state.gather_backward(0, c)
    torch.testing.assert_close(torch.from_numpy(state.dZ[0]), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", ["sage", "gat"])
def test_directed_graph_gather_and_backward_match_the_global_matrices(small_graph, tmp_path, model):
    """``Â_LLᵀ`` from the store (GraphSAGE's mean values on it) or built with its edge map (GAT): on a directed
    graph, one partition's Gather and Gather backward equal the global matrix's, chunk by chunk."""
    from dorylus_py.kernels.heads import EdgeCSR
    from dorylus_py.kernels.sparse import gcn_norm_weights
    from dorylus_py.models.sage import mean_adjacency
    from tests.partition.test_partition import _directed

    graph = _directed(small_graph)
    prepare(graph, tmp_path / "p", 1, "hash")
    part = PartitionStore.open(tmp_path / "p").load(0)
    assert not part.local_symmetric
    state = GraphState(part, model_spec(model, [16, 8, 4], heads=1), [3], "none")
    n = graph.num_nodes
    if model == "sage":
        adj = mean_adjacency(graph)
        matrix, transpose = adj.matrix, adj.transpose
    else:
        ip, ix, _ = gcn_norm_weights(graph.indptr, graph.indices)
        values = torch.rand(1, len(ix), generator=torch.Generator().manual_seed(0))
        state.alpha[True][0][:] = values.numpy()
        a = EdgeCSR.from_csr(ip, ix, n)
        matrix, transpose = a.matrices(values)[0], a.transpose().matrices(values)[0]
    z, dg = np.random.default_rng(0).standard_normal((2, n, 8)).astype(np.float32)
    state.ZG[True][0][:] = z
    state.dG[0][:] = dg
    for c in range(state.chunks):
        state.gather(True, 0, c)
        state.gather_backward(0, c)
    S = state.S[True][0] if state.S else 0
    torch.testing.assert_close(torch.from_numpy(state.G[True][0] - S), torch.sparse.mm(matrix, torch.from_numpy(z)),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(state.dZ[0]), torch.sparse.mm(transpose, torch.from_numpy(dg)),
                               rtol=1e-5, atol=1e-5)
