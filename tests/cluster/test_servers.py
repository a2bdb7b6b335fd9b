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
from tests.clients import KEY, Client, authentic_but_bad, driver, unauthenticated  # noqa: F401  (a fixture)


def test_weight_server_rejects_bad_messages_and_keeps_serving(driver):
    node = ServerNode("weight-server", 0, driver, KEY)
    spec = JobSpec(config=TrainConfig(lr=0.01), data_dir="", feature_norm="none", dims=[6, 4, 3], id_offsets=[0, 1],
                   chunk_counts=[1], weight_servers=["x"])
    ws = WeightServer(node, Message("start", {"spec": spec.to_wire()}))
    client = Client(node)
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
    ws = WeightServer(node, Message("start", {"spec": spec.to_wire()}))
    client = Client(node)
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
