"""Servers facing bad input: unauthenticated frames (truncated, unsigned, wrong key, replayed) are
dropped unanswered; authentic ones with wrong shapes or unknown ops get an error reply; and the same
server then answers the next good request."""

import json
import time

import numpy as np
import pytest
import zmq

from dorylus_py.cluster.job import JobSpec
from dorylus_py.cluster.node import Node
from dorylus_py.config import TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.pipeline.events import Tick
from dorylus_py.protocol import ProtocolError
from dorylus_py.platforms import Platform
from dorylus_py.protocol import Message, Session
from dorylus_py.weights.server import WeightServer
from graph_servers.server import GraphServer
from tests.protocol.forge import signed

KEY = b"k" * 32


@pytest.fixture()
def driver():
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield f"tcp://127.0.0.1:{port}"
    sock.close(0)


class Client:
    """A tensor worker's side: one DEALER and a session with the job key."""

    def __init__(self, node, key=KEY):
        self.node, self.session = node, Session(key)
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(node.address)

    def frames(self, msg: Message) -> list:
        return self.session.encode(msg, self.node.address)

    def ask(self, handle, frames_or_msg):
        frames = self.frames(frames_or_msg) if isinstance(frames_or_msg, Message) else frames_or_msg
        self.sock.send_multipart(frames)
        for _ in range(100):
            self.node.serve_once(handle, 20)
            if self.sock.poll(10):
                return self.session.decode(self.sock.recv_multipart(), self.session.id)
        raise AssertionError("no reply")

    def unanswered(self, handle, frames) -> None:
        before = self.node.rejections.counts["unauthenticated"]
        self.sock.send_multipart(frames)
        for _ in range(100):
            self.node.serve_once(handle, 20)
            if self.node.rejections.counts["unauthenticated"] > before:
                break
        assert self.node.rejections.counts["unauthenticated"] == before + 1
        assert not self.sock.poll(50)  # nothing goes back, not even an error

    def close(self):
        self.sock.close(0)


def unauthenticated(client, task) -> dict:
    good = client.frames(Message("pull_rows", {"task": task}))
    replayed = client.frames(Message("pull_rows", {"task": dict(task, epoch=9)}))
    return {
        "truncated frames": good[:1],
        "unsigned": [b"\0" * 68, json.dumps({"op": "pull_rows", "task": task}).encode()],
        "not json": [b"\xff\xfe"],
        "altered": [good[0], bytes(good[1]) + b" "],  # still valid JSON, no longer what was signed
        "wrong key": Client(client.node, b"another key, 32 bytes long......").frames(Message("pull_rows", {"task": task})),
        "signed for another server": client.session.encode(Message("pull_rows", {"task": task}), "tcp://127.0.0.1:1"),
        "replayed": replayed,
    }, replayed


def authentic_but_bad(client) -> dict:
    header = {"op": "push_result", "task": {}, "tensors": [{"name": "Z", "dtype": "float32", "shape": [2, 4]}]}
    return {
        "short tensor": signed(client.session, json.dumps(header).encode(), b"\0" * 7, to=client.node.address),
        "unknown op": signed(client.session, b'{"op": "format_disk"}', to=client.node.address),
        "deep": signed(client.session, b'{"op": "pull_rows", "task": ' + b"[" * 5000 + b"}", to=client.node.address),
        "huge number": signed(client.session, b'{"op": "pull_rows", "epoch": 1e999}', to=client.node.address),
    }


class Recorder(Platform):
    def __init__(self):
        super().__init__()
        self.events = []

    def invoke(self, event):
        self.events.append(event)


def test_graph_server_rejects_bad_messages_and_keeps_serving(small_graph, tmp_path, driver):
    prepare(small_graph, tmp_path / "p", 1)
    node = Node("graph-server", 0, driver, KEY)
    spec = JobSpec(config=TrainConfig(backend="cpu", tensor_threads=1, chunks=2), data_dir=str(tmp_path / "p"),
                   feature_norm="none", dims=[16, 8, 4], id_offsets=[0, small_graph.num_nodes], chunk_counts=[2],
                   graph_servers=[node.address], weight_servers=[])
    gs = GraphServer(node, Message("start", {"spec": spec.to_wire()}))
    gs.platform.close()
    gs.platform = Recorder()  # the tasks are played by this test
    client = Client(node)
    try:
        rows = int(gs.state.bounds[1])
        task = {"kind": "fwd", "train": True, "epoch": 1, "layer": 0, "chunk": 0}
        gs.feed(Tick(time.time()))
        assert [e["task"]["chunk"] for e in gs.platform.events] == [0, 1]  # epoch 1's first tasks are out
        assert all("token" not in e and KEY.hex() not in json.dumps(e) for e in gs.platform.events)
        dropped, replayed = unauthenticated(client, task)
        client.ask(gs.handle, replayed)  # once: an answer (cancel: nobody runs epoch 9)
        for name, frames in dropped.items():
            client.unanswered(gs.handle, frames)
        for name, frames in authentic_but_bad(client).items():
            assert client.ask(gs.handle, frames).op == "error", name
        wrong_shape = Message("push_result", {"task": task, "version": 0}, {"Z": np.zeros((rows, 5), np.float32)})
        assert "expected" in client.ask(gs.handle, wrong_shape)["reason"]
        for bad_task in ["x", {"kind": "fwd"}, dict(task, chunk=99), dict(task, kind="rm")]:
            assert client.ask(gs.handle, Message("pull_rows", {"task": bad_task})).op == "error"
        assert node.rejections.counts == {"unauthenticated": 7, "invalid": 9, "bugs": 0}
        not_running = dict(task, layer=1)  # a copy nobody wants (any more) is told to stop, and why
        cancel = client.ask(gs.handle, Message("pull_rows", {"task": not_running, "req": "r1"}))
        assert cancel.op == "cancel" and cancel["req"] == "r1" and "not running" in cancel["reason"]

        got = client.ask(gs.handle, Message("pull_rows", {"task": task}))
        assert got.op == "rows" and got.tensors["P"].shape == (rows, 16)
        z = np.ones((rows, 8), np.float32)
        result = Message("push_result", {"task": task, "version": 0}, {"Z": z})
        assert client.ask(gs.handle, result).op == "ok"
        assert client.ask(gs.handle, result).op == "duplicate"
        np.testing.assert_array_equal(gs.state.ZG[True][0][:rows], z)
        late = client.ask(gs.handle, Message("pull_rows", {"task": task, "req": "r2"}))
        assert late.op == "cancel" and late["reason"] == "already done"
    finally:
        client.close()
        gs.close()
        node.close()


def test_weight_server_rejects_bad_messages_and_keeps_serving(driver):
    node = Node("weight-server", 0, driver, KEY)
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
                    Message("pull_rows", {"task": {}})]:
            assert client.ask(ws.handle, bad).op == "error", bad
        got = client.ask(ws.handle, Message("pull_weights", {"layer": 1, "version": 0}))
        assert got.op == "weights" and got.tensors["W1.0"].shape == (4, 3)  # one block: the whole tensor
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

    node = Node("weight-server", 0, driver, KEY)
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
