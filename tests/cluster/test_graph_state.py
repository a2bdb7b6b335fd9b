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


def test_gat_attention_dropout_over_two_partitions_does_not_depend_on_the_chunking(small_graph, tmp_path):
    """Edges keyed by their block position: every chunking of K = 2 draws the same masks (two runs per chunk)."""
    from dorylus_py.cluster.launcher import train_distributed
    from dorylus_py.config import TrainConfig
    from dorylus_py.training import RunRecord

    prepare(small_graph, tmp_path / "p", 2)
    runs = []
    for chunks in (1, 3):
        cfg = TrainConfig(epochs=2, chunks=chunks, lambdas=2, feature_norm="none", model="gat", hidden=4, heads=2,
                          dropout=0.0, attn_dropout=0.5, backend="cpu", graph_servers=2)
        result = train_distributed(cfg, tmp_path / "p", RunRecord(tmp_path / f"c{chunks}", cfg.to_dict()), "none",
                                   show_progress=False)
        runs.append([r["loss"] for r in result.history])
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-5)
    no_dropout = TrainConfig(epochs=2, chunks=3, lambdas=2, feature_norm="none", model="gat", hidden=4, heads=2,
                             dropout=0.0, attn_dropout=0.0, backend="cpu", graph_servers=2)
    plain = train_distributed(no_dropout, tmp_path / "p", RunRecord(tmp_path / "plain", no_dropout.to_dict()), "none",
                              show_progress=False)
    assert [r["loss"] for r in plain.history] != pytest.approx(runs[0], rel=1e-4)  # the dropout did something


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


def test_sync_mode_sends_one_sum_of_all_chunks_contributions_per_peer(small_graph, tmp_path):
    """The sum equals the per-chunk contributions added up, in whatever order the chunks finish; the
    receiver takes it as all the sender's chunks, in sync mode only."""
    from dorylus_py.protocol import ProtocolError
    from graph_servers.received import ALL_CHUNKS

    prepare(small_graph, tmp_path / "p", 2, "hash")
    store = PartitionStore.open(tmp_path / "p")
    sender, receiver = (GraphState(store.load(k), GCN, [3, 3], "none", sync=True) for k in range(2))
    sender.dG[0][:] = np.random.default_rng(1).standard_normal(sender.dG[0].shape).astype(np.float32)
    expected = np.zeros((len(receiver.send_ids[0]), 8), np.float64)  # one row per ghost of the sender's
    for c in range(3):
        positions, rows = sender.contributions("bwd", 0, c)[1]
        expected[positions] += rows
    for epoch, order in enumerate(([2, 0, 1], [0, 1, 2])):
        got = [sender.summed_contributions("bwd", 0, c) for c in order]
        assert got[:2] == [None, None] and set(got[2]) == {1}
        positions, rows = got[2][1]
        np.testing.assert_array_equal(positions, np.arange(len(expected)))
        np.testing.assert_allclose(rows, expected, rtol=1e-5, atol=1e-6)
        if epoch == 0:
            first = rows
        else:
            np.testing.assert_array_equal(rows, first)  # the same bits in another order
    receiver.store_peer_rows("bwd", 0, 0, ALL_CHUNKS, {"positions": positions, "rows": rows})
    with pytest.raises(ProtocolError, match="chunk 1 for layer 0"):  # sync: contributions come summed
        receiver.store_peer_rows("bwd", 0, 0, 1, {"positions": positions, "rows": rows})
    async_receiver = GraphState(store.load(1), GCN, [3, 3], "none")
    with pytest.raises(ProtocolError, match="chunk -1 for layer 0"):
        async_receiver.store_peer_rows("bwd", 0, 0, ALL_CHUNKS, {"positions": positions, "rows": rows})


def test_peer_contributions_in_any_order_are_taken_and_repeats_refused(small_graph, tmp_path):
    """Senders send increasing positions (checked without a sort); any other order is taken as long as
    no position repeats, and gives the same sum."""
    from dorylus_py.protocol import ProtocolError

    prepare(small_graph, tmp_path / "p", 2, "hash")
    part = PartitionStore.open(tmp_path / "p").load(1)
    n = len(GraphState(part, GCN, [1, 1], "none").send_ids[0])
    rows = np.random.default_rng(2).standard_normal((n, 8)).astype(np.float32)
    sums = []
    for order in (np.arange(n), np.arange(n)[::-1]):
        s = GraphState(part, GCN, [1, 1], "none")
        s.store_peer_rows("bwd", 0, 0, 0, {"positions": order.astype(np.int64), "rows": rows[order]})
        total = np.zeros((s.n, 8), np.float32)
        s.received[("bwd", 0)].add_to(0, s.n, total)
        sums.append(total)
    np.testing.assert_array_equal(sums[0], sums[1])
    assert np.abs(sums[0]).sum() > 0
    s = GraphState(part, GCN, [1, 1], "none")
    repeated = np.array([0, 2, 1, 2], np.int64)
    with pytest.raises(ProtocolError, match="repeat"):
        s.store_peer_rows("bwd", 0, 0, 0, {"positions": repeated, "rows": rows[:4]})
