"""The rows to and from the peers: sync mode's one sum per peer, and peer contributions taken in any order."""

import weakref

import numpy as np
import pytest

from dorylus_py.models.spec import model_spec
from dorylus_py.partition import PartitionStore, prepare
from graph_servers.graph_state import GraphState

GCN = model_spec("gcn", [16, 8, 4])


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


def test_a_chunk_that_comes_early_waits_as_a_name_not_as_a_copy_of_its_contribution(small_graph, tmp_path):
    """Sync: chunks whose ``dG`` rows come before an earlier chunk's are summed only when their turn comes
    (from their rows, written once an epoch): no ghost-sized copy waits meanwhile, and nothing is summed
    before chunk 0; a chunk that comes twice in one epoch is refused."""
    from dorylus_py.protocol import ProtocolError

    prepare(small_graph, tmp_path / "p", 2, "hash")
    state = GraphState(PartitionStore.open(tmp_path / "p").load(0), GCN, [3, 3], "none", sync=True)
    state.dG[0][:] = np.random.default_rng(3).standard_normal(state.dG[0].shape).astype(np.float32)
    total = state.outgoing[("bwd", 0)]
    for c in (2, 1):
        assert state.summed_contributions("bwd", 0, c) is None
        assert total.done == 0 and total.nbytes == 0  # nothing computed, nothing kept
    with pytest.raises(ProtocolError, match="peer 0 chunk 2 contributed twice"):
        state.summed_contributions("bwd", 0, 2)
    assert set(state.summed_contributions("bwd", 0, 0)) == {1}
    assert total.done == 0 and not total.waiting  # the next epoch starts afresh
    state.summed_contributions("bwd", 0, 0)
    with pytest.raises(ProtocolError, match="peer 0 chunk 0 contributed twice"):
        state.summed_contributions("bwd", 0, 0)


def test_a_contribution_whose_product_raised_is_summed_at_the_next_call(small_graph, tmp_path, monkeypatch):
    """A product that fails (e.g. out of device memory) leaves its chunk ready, not lost: the next call
    sums it, and the epoch's sum comes out whole instead of waiting for a chunk that never comes again."""
    prepare(small_graph, tmp_path / "p", 2, "hash")
    store = PartitionStore.open(tmp_path / "p")
    state, reference = (GraphState(store.load(0), GCN, [3, 3], "none", sync=True) for _ in range(2))
    for s in (state, reference):
        s.dG[0][:] = np.random.default_rng(4).standard_normal(s.dG[0].shape).astype(np.float32)
    expected = [reference.summed_contributions("bwd", 0, c) for c in range(3)][2][1][1]
    real, failures = state._contribution, [1]

    def flaky(*args):
        if failures:
            failures.pop()
            raise MemoryError("device out of memory")
        return real(*args)

    monkeypatch.setattr(state, "_contribution", flaky)
    assert state.summed_contributions("bwd", 0, 1) is None
    with pytest.raises(MemoryError):
        state.summed_contributions("bwd", 0, 0)
    got = state.summed_contributions("bwd", 0, 2)
    np.testing.assert_array_equal(got[1][1], expected)


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


def test_a_run_of_consecutive_positions_travels_as_its_first(small_graph, tmp_path):
    """A chunk's forward rows go to a run of the peer's ghost slots: only the first is sent; a sync sum's
    positions too; scattered contributions keep their list. The receiver rebuilds them and checks the range."""
    from dorylus_py.protocol import Message, ProtocolError
    from graph_servers.wire import ghost_placement, ghost_positions

    prepare(small_graph, tmp_path / "p", 2, "hash")
    store = PartitionStore.open(tmp_path / "p")
    sender, receiver = (GraphState(store.load(k), GCN, [3, 3], "none", sync=False) for k in range(2))
    sender.ZG[True][0][:] = np.random.default_rng(2).standard_normal(sender.ZG[True][0].shape).astype(np.float32)
    for c in range(3):
        positions, tensors = sender.rows_for_peers(True, 0, c)[1]
        fields, listed = ghost_placement(positions)
        assert fields == {"first": int(positions[0])} and listed == {}
        msg = Message("ghosts", fields, tensors)
        receiver.store_peer_rows("fwd", 0, 0, c, tensors | {"positions": ghost_positions(msg)})
        at = receiver.n + receiver.part.ghosts_from(0).start + positions
        np.testing.assert_array_equal(receiver.ZG[True][0][at], tensors["rows"])
    scattered = np.array([0, 2, 3], np.int32)
    assert ghost_placement(scattered) == ({}, {"positions": scattered})
    rows = np.zeros((3, 8), np.float32)
    slots = receiver.part.ghosts_from(0)
    beyond = Message("ghosts", {"first": slots.stop - slots.start - 1}, {"rows": rows})
    with pytest.raises(ProtocolError, match="out of range"):
        receiver.store_peer_rows("fwd", 0, 0, 0, {"rows": rows, "positions": ghost_positions(beyond)})
    for fields, tensors in (({"first": -1}, {"rows": rows}), ({"first": 0}, {}), ({}, {"rows": rows})):
        with pytest.raises(ProtocolError):
            ghost_positions(Message("ghosts", fields, tensors))


def test_rows_for_peers_are_picked_into_reused_buffers_only_once_nothing_holds_them(small_graph, tmp_path):
    """A chunk's rows for a peer are ``Z[rows]``; the buffer they are picked into is written again for a
    later chunk only once the message that carried them is gone (graph_servers/spares.py)."""
    prepare(small_graph, tmp_path / "p", 2, "hash")
    state = GraphState(PartitionStore.open(tmp_path / "p").load(0), GCN, [3, 3], "none", sync=True)
    z = state.ZG[True][0]
    z[:] = np.random.default_rng(2).standard_normal(z.shape).astype(np.float32)
    sent = state.rows_for_peers(True, 0, 0)[1]  # held: still on its socket
    held = sent[1]["rows"].copy()
    np.testing.assert_array_equal(held, z[state.send_in_chunk[0][1][1]])
    z[:] += 1
    again = state.rows_for_peers(True, 0, 0)[1][1]["rows"]
    np.testing.assert_array_equal(sent[1]["rows"], held)  # the held rows were not written over
    np.testing.assert_array_equal(again, z[state.send_in_chunk[0][1][1]])
    assert not np.shares_memory(again, sent[1]["rows"])
    buffer = weakref.ref(again.base)
    del sent, again
    third = state.rows_for_peers(True, 0, 0)[1][1]["rows"]
    assert third.base is buffer()  # nothing held it: written into again
    np.testing.assert_array_equal(third, z[state.send_in_chunk[0][1][1]])
