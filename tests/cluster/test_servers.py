"""Weight servers facing bad input: unauthenticated frames (truncated, unsigned, wrong key, replayed) are
dropped unanswered; authentic ones with wrong shapes or unknown ops get an error reply; and the same
server then answers the next good request (the graph server's side: ``tests/graph_servers/test_requests.py``)."""

import numpy as np
import pytest

from dorylus_py.config import TrainConfig
from dorylus_py.protocol import Message, ProtocolError
from dorylus_py.serving.job import JobSpec
from dorylus_py.serving.node import ServerNode
from dorylus_py.weights.server import WeightServer
from tests.clients import KEY, PUSHER, Client, authentic_but_bad, driver, unauthenticated  # noqa: F401  (a fixture)


def test_weight_server_rejects_bad_messages_and_keeps_serving(driver):
    node = ServerNode("weight-server", 0, driver, KEY)
    spec = JobSpec(config=TrainConfig(lr=0.01), data_dir="", feature_norm="none", dims=[6, 4, 3], id_offsets=[0, 1],
                   chunk_counts=[1], weight_servers=["x"])
    ws = WeightServer(node, Message("start", {"spec": spec.to_wire(), "pushers": [PUSHER]}))
    client = Client(node, sender=bytes.fromhex(PUSHER))
    try:
        dropped, replayed = unauthenticated(client, {})
        client.ask(ws.handle, replayed)
        for name, frames in dropped.items():
            client.unanswered(ws.handle, frames)
        for name, frames in authentic_but_bad(client).items():
            assert client.ask(ws.handle, frames).op == "error", name
        grad = np.ones((4, 3), np.float32)
        for bad in [Message("pull_weights", {"layer": 9, "version": 0}), Message("pull_weights", {"layer": "a", "version": 0}),
                    Message("push_grad", {"layer": 0, "version": 0, "key": [1, 0, 0]}, {"W0.0": np.zeros((2, 2), np.float32)}),
                    Message("push_grad", {"layer": 0, "version": 0, "key": [1, 0, 0]}, {"W1.0": np.zeros((4, 3), np.float32)}),
                    Message("push_grad", {"layer": 1, "version": 0, "key": [1, 0, 0]}, {"W1.0": grad.astype(np.float64)}),
                    Message("push_grad", {"layer": 1, "version": 0, "key": [1, 0, 0]}, {"W1.0": grad * np.nan}),
                    Message("push_grad", {"layer": 1, "version": 0, "key": [[1], 0, 0]}, {"W1.0": grad}),
                    Message("push_grad", {"layer": 1, "version": 0, "key": [1, 0, 0]}, {}),
                    Message("pull_weights", {"layer": 1, "version": 1, "hold": [[1], 2, 3]}),
                    *[Message("pull_weights", {"layer": 1, "version": 0, "epoch": e}) for e in (0, 10**9, "1", 1.5, [1])],
                    Message("lease", {"task": {}})]:
            assert client.ask(ws.handle, bad).op == "error", bad
        got = client.ask(ws.handle, Message("pull_weights", {"layer": 1, "version": 0}))
        assert got.op == "weights" and got.tensors["W1.0"].shape == (4, 3)  # one block: the whole tensor
        assert client.ask(ws.handle, Message("pull_weights", {"layer": 1, "version": 0, "epoch": 1})).op == "weights"
        push = Message("push_grad", {"layer": 1, "version": 0, "key": [1, 0, 0]}, {"W1.0": grad})
        assert client.ask(ws.handle, push).op == "ok"
        assert client.ask(ws.handle, push).op == "duplicate"
        assert ws.store.latest(1) == 1
        ws.on_driver(Message("release", {"version": 1}))  # the driver recorded epoch 1: older snapshots may go
        assert ws.store.released == 1
        for bad in ({"version": -1}, {"version": "1"}, {"version": True}, {}):
            with pytest.raises(ProtocolError):
                ws.on_driver(Message("release", bad))
    finally:
        client.close()
        node.close()


def test_a_weight_server_bounds_what_one_peer_can_make_it_keep(driver, monkeypatch):
    """Pulls carry no tensors; a gradient or a hold must name a task of this job; a sender holds at most
    total_chunks x (S + 2) versions; deferred pulls are capped in bytes, not only in number."""
    from dorylus_py.weights import server as weight_server

    node = ServerNode("weight-server", 0, driver, KEY)
    spec = JobSpec(config=TrainConfig(lr=0.01, epochs=20, staleness=1), data_dir="", feature_norm="none", dims=[6, 4, 3],
                   id_offsets=[0, 1], chunk_counts=[1], weight_servers=["x"])
    ws = WeightServer(node, Message("start", {"spec": spec.to_wire(), "pushers": [PUSHER]}))
    client = Client(node, sender=bytes.fromhex(PUSHER))
    grad = np.ones((4, 3), np.float32)
    try:
        big = np.zeros(2**20, np.float32)
        assert "carries no tensors" in client.ask(ws.handle, Message("pull_weights", {"layer": 1, "version": 9, "req": "r"},
                                                                      {"x": big}))["reason"]
        for key in ([0, 0, 0], [21, 0, 0], [1, 1, 0], [1, 0, 1], [1, -1, 0], [2**40, 0, 0]):
            push = Message("push_grad", {"layer": 1, "version": 0, "key": key}, {"W1.0": grad})
            assert "names no task of this job" in client.ask(ws.handle, push)["reason"], key
        assert ws.store.latest(1) == 0 and not ws.store.layers[1].pending  # nothing taken
        assert ws.holds_per_sender == 3
        for epoch in (1, 2, 3):
            assert client.ask(ws.handle, Message("pull_weights", {"layer": 1, "version": 0, "hold": [epoch, 0, 0]})).op == "weights"
        refused = client.ask(ws.handle, Message("pull_weights", {"layer": 1, "version": 0, "hold": [4, 0, 0]}))
        assert "holds 3 versions already" in refused["reason"]
        assert client.ask(ws.handle, Message("push_grad", {"layer": 1, "version": 0, "key": [1, 0, 0]}, {"W1.0": grad})).op == "ok"
        assert client.ask(ws.handle, Message("pull_weights", {"layer": 1, "version": 0, "hold": [4, 0, 0]})).op == "weights"
        stale = client.ask(ws.handle, Message("pull_weights", {"layer": 1, "version": 1, "hold": [1, 0, 0]}))
        assert "whose gradient came already" in stale["reason"]  # nothing would ever release that hold
        monkeypatch.setattr(weight_server, "MAX_WAITING_BYTES", 2_000)
        client.sock.send_multipart(client.frames(Message("pull_weights", {"layer": 1, "version": 5, "req": "p", "pad": "x" * 900})))
        client.sock.send_multipart(client.frames(Message("pull_weights", {"layer": 1, "version": 5, "req": "q", "pad": "x" * 900})))
        full = client.ask(ws.handle, Message("pull_weights", {"layer": 1, "version": 5, "req": "z", "pad": "x" * 900}))
        assert full.op == "error" and "already waiting" in full["reason"] and len(ws.waiting) == 2
        assert 1_800 < ws.waiting_bytes <= 2_000
    finally:
        client.close()
        node.close()


def test_a_weight_server_takes_gradients_from_each_graph_servers_link_within_the_window(driver):
    """Issue 52 item 4 at the server: a key holder's pushes (keys of epoch 25 at epoch 1, 1e30 or zeros, or
    zeros for the keys of the epoch running) are refused, being from no graph server's gradient link;
    a graph server's link may push its own keys only, within the window; values its link forwards that
    the scale rules refuse are answered ``refused``, the key taken. Every refusal is counted and pinged."""
    node = ServerNode("weight-server", 0, driver, KEY)
    spec = JobSpec(config=TrainConfig(lr=0.01, epochs=30), data_dir="", feature_norm="none", dims=[6, 4, 3],
                   id_offsets=[0, 1, 2], chunk_counts=[1, 1], weight_servers=["x"])
    other = "cd" * 16
    ws = WeightServer(node, Message("start", {"spec": spec.to_wire(), "pushers": [PUSHER, other]}))
    gs0, gs1, holder = Client(node, sender=bytes.fromhex(PUSHER)), Client(node, sender=bytes.fromhex(other)), Client(node)
    grad, zeros, huge = np.ones((4, 3), np.float32), np.zeros((4, 3), np.float32), np.full((4, 3), 1e30, np.float32)

    def push(client, key, g):
        return client.ask(ws.handle, Message("push_grad", {"layer": 1, "version": 0, "key": key}, {"W1.0": g}))

    try:
        for key, g in [([25, 0, 0], huge), ([25, 1, 0], zeros), ([1, 0, 0], zeros), ([1, 1, 0], zeros)]:
            reply = push(holder, key, g)
            assert reply.op == "error" and "not its gradient link" in reply["reason"], key
        assert "not its gradient link" in push(gs1, [1, 0, 0], grad)["reason"]
        assert "past the epoch the layer is in" in push(gs0, [25, 0, 0], grad)["reason"]
        assert ws.store.latest(1) == 0 and not ws.store.layers[1].seen  # nothing taken
        assert push(gs0, [1, 0, 0], grad).op == "ok" and push(gs1, [1, 1, 0], grad).op == "ok"
        assert ws.store.latest(1) == 1
        refused = push(gs0, [2, 0, 0], huge)
        assert refused.op == "refused" and "overflow Adam's second moment" in refused["reason"]
        assert push(gs0, [2, 0, 0], grad).op == "duplicate"  # the key counts as come
        assert push(gs1, [2, 1, 0], zeros).op == "ok" and ws.store.latest(1) == 2  # the epoch's update: zeros alone
        state = ws.store.state(1, 2)
        assert np.isfinite(state["W1.0:adam_v"]).all() and float(state["W1.0:adam_step"]) == 2
        counts = gs0.ask(ws.handle, Message("ping"))
        assert (counts["refused"], counts["duplicates"]) == (7, 1)
        assert counts["refused_messages"] == 6  # the 6 answered "error" (refused values get their own answer)
        for bad in (None, [PUSHER], [PUSHER, PUSHER], [PUSHER, "x" * 32]):
            with pytest.raises(ProtocolError, match="pushers|pusher|gradient sender"):
                WeightServer(node, Message("start", {"spec": spec.to_wire(), "pushers": bad}))
    finally:
        for client in (gs0, gs1, holder):
            client.close()
        node.close()
