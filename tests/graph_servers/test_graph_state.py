"""A graph server's partition in memory: no copies of the store's arrays, structure per edge bounded;
feature rows per chunk; the buffers ``--remat`` shares."""

import numpy as np
import pytest
import torch

from dorylus_py.data.graph import row_normalized
from dorylus_py.models.spec import model_spec
from dorylus_py.partition import PartitionStore, prepare
from graph_servers.graph_state import FusedInput, GraphState

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


def test_input_rows_are_normalised_once_not_per_pull(small_graph, tmp_path, monkeypatch):
    """Layer 0's input never changes: the first pull makes every row's and later pulls are views of them
    (the ``cpu`` backend pulled and normalised it three times a chunk and epoch); with more rows than the
    cache takes, each pull makes its own, as before."""
    import graph_servers.graph_state as graph_state

    calls = []
    monkeypatch.setattr(graph_state, "row_normalized", lambda x: calls.append(len(x)) or row_normalized(x))
    prepare(small_graph, tmp_path / "p", 1, "hash", feature_dtype="bfloat16")
    state = GraphState(PartitionStore.open(tmp_path / "p").load(0), GCN, [3], "row")
    pulls = [state.input_rows(*state.chunk(c)) for _ in range(3) for c in range(3)]
    assert calls == [state.n]  # once, for every row
    assert len({id(rows.base) for rows in pulls}) == 1  # views of one array
    np.testing.assert_array_equal(pulls[4], row_normalized(state.part.feature_rows(*state.chunk(1))))
    calls.clear()
    monkeypatch.setattr(graph_state, "INPUT_CACHE_BYTES", 100)
    big = GraphState(state.part, GCN, [3], "row")
    for _ in range(2):
        big.input_rows(*big.chunk(0))
    assert len(calls) == 2


def test_sage_and_gat_share_the_stores_index_arrays(small_graph, tmp_path):
    """GraphSAGE's mean: values of its own on the mapped patterns; GAT: per-edge arrays over both blocks,
    ``A_LLᵀ`` with an int32 map to its edges."""
    prepare(small_graph, tmp_path / "p", 2, "hash")
    part = PartitionStore.open(tmp_path / "p").load(0)
    sage = GraphState(part, model_spec("sage", [16, 8, 4]), [3, 3], "none")
    col = lambda t: t.col_indices().untyped_storage().data_ptr()
    assert col(sage.adj.local) == col(sage.adj.local_t)  # one pattern (an undirected graph), two sets of values
    assert not torch.equal(sage.adj.local.values(), sage.adj.local_t.values())
    assert sage.structure_bytes / sage.edges <= 24
    gat = GraphState(part, model_spec("gat", [16, 8, 4], heads=2), [3, 3], "none")
    edges = len(part.local_indices) + len(part.ghost_indices)
    assert gat.alpha[True][0].shape == (2, edges)
    assert sum(hi - lo for c in range(3) for lo, hi in gat.edge_runs(c)) == edges
    assert gat.adj.local_t.edge.dtype == torch.int32
    assert gat.structure_bytes / gat.edges <= 32


def test_the_buffers_remat_shares_are_the_ones_never_live_at_once(small_graph, tmp_path):
    prepare(small_graph, tmp_path / "p", 2)
    part = PartitionStore.open(tmp_path / "p").load(0)
    gcn = model_spec("gcn", [16, 8, 4])
    fused = FusedInput(0.5, 1, 0)
    kept = GraphState(part, gcn, [3, 3], "none", fused=fused, sync=True)
    remat = GraphState(part, gcn, [3, 3], "none", fused=fused, sync=True, remat=True)
    n, g = remat.n, remat.g
    for l in range(2):
        assert np.shares_memory(remat.ZG[True][l], remat.ZG[False][l])
        assert np.shares_memory(remat.G[True][l], remat.G[False][l])
        assert np.shares_memory(remat.dZ[l], remat.ZG[True][l][:n]) and remat.dZ[l].shape == kept.dZ[l].shape
        assert not np.shares_memory(remat.dZ[l], remat.ZG[True][l][n:])  # the peers' ghost rows stay clear
        assert not np.shares_memory(kept.ZG[True][l], kept.ZG[False][l])
        assert remat.ZG[False][l].shape == kept.ZG[False][l].shape == (n + g, kept.widths(False, l)[0])
    assert not np.shares_memory(remat.dG[0], remat.dG[1])
    saved = sum(a.nbytes for a in kept.ZG[False] + kept.G[False] + kept.dZ)
    # the evaluation pass's buffers and dZ are gone (the training ones are as wide or wider)
    assert kept.buffer_bytes - remat.buffer_bytes == saved
    with pytest.raises(ValueError, match="sync"):
        GraphState(part, gcn, [3, 3], "none", remat=True)
