"""A graph server's partition in memory: no copies of the store's arrays, structure per edge bounded."""

import numpy as np
import pytest
import torch

from dorylus_py.data.graph import row_normalized
from dorylus_py.kernels import NormalizedAdjacency
from dorylus_py.models.spec import model_spec
from dorylus_py.partition import PartitionStore, prepare
from graph_servers.graph_state import GraphState

GCN = model_spec("gcn", [16, 8, 4])


@pytest.mark.parametrize("chunks", [1, 4])
def test_structure_is_at_most_16_bytes_per_edge_and_shares_the_store(small_graph, tmp_path, chunks):
    prepare(small_graph, tmp_path / "p", 2, "hash")  # hash: the largest cut, the worst case
    store = PartitionStore.open(tmp_path / "p")
    for k in range(2):
        part = store.load(k)
        state = GraphState(part, GCN, [chunks, chunks], "none")
        cut = len(part.ghost_indices)
        # 8 bytes per entry of Â (edges and self loops); Â_LGᵀ: 8 per cut edge, and a row pointer per
        # ghost a chunk touches (at most one per cut edge); int32 row pointers of the blocks and their views
        assert state.structure_bytes <= 8 * (state.edges + state.n) + 12 * cut + 4 * (4 * state.n + 2 + chunks)
        assert state.structure_bytes / state.edges <= 16
        for rows in state.rows_of:  # a chunk's rows are views of the mapped arrays
            assert rows.local.values().untyped_storage().data_ptr() == state.adj.local.values().untyped_storage().data_ptr()
        assert not hasattr(state, "x")  # features stay in the store's file, read chunk by chunk


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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_input_rows_are_float32_and_row_normalised_per_chunk(small_graph, tmp_path, dtype):
    prepare(small_graph, tmp_path / "p", 1, "hash", feature_dtype=dtype)
    part = PartitionStore.open(tmp_path / "p").load(0)
    state = GraphState(part, GCN, [2], "row")
    x = np.abs(part.feature_rows())
    rows = state.input_rows(10, 50)
    assert rows.dtype == np.float32
    expected = row_normalized(part.feature_rows()[10:50])
    np.testing.assert_array_equal(rows, expected)
    assert x.shape == (small_graph.num_nodes, 16)
