"""Servers facing bad input: truncated frames, wrong shapes, unknown ops, wrong tokens are rejected
with an error reply, and the same server then answers the next good request."""

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
from dorylus_py.platforms import Platform
from dorylus_py.protocol import Message, decode, encode
from dorylus_py.weights.server import WeightServer
from graph_servers.server import GraphServer

TOKEN = "secret"


@pytest.fixture()
def driver():
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield f"tcp://127.0.0.1:{port}"
    sock.close(0)


def ask(node, handle, client, frames):
    client.send_multipart(frames)
    for _ in range(100):
        node.serve_once(handle, 20)
        if client.poll(10):
            return decode(client.recv_multipart(), TOKEN)
    raise AssertionError("no reply")


def client_for(node):
    c = zmq.Context.instance().socket(zmq.DEALER)
    c.setsockopt(zmq.LINGER, 0)
    c.connect(node.address)
    return c


def bad_frames(task):
    good_header = {"op": "push_result", "token": TOKEN, "task": task,
                   "tensors": [{"name": "Z", "dtype": "float32", "shape": [2, 4]}]}
    return {
        "truncated frames": [json.dumps(good_header).encode()],
        "short tensor": [json.dumps(good_header).encode(), b"\0" * 7],
        "unknown op": encode(Message("format_disk", {}), TOKEN),
        "wrong token": encode(Message("pull_rows", {"task": task}), "guess"),
        "not json": [b"\xff\xfe"],
    }


class Recorder(Platform):
    def __init__(self):
        super().__init__()
        self.events = []

    def invoke(self, event):
        self.events.append(event)


def test_graph_server_rejects_bad_messages_and_keeps_serving(small_graph, tmp_path, driver):
    prepare(small_graph, tmp_path / "p", 1)
    node = Node("graph-server", 0, driver, TOKEN)
    spec = JobSpec(config=TrainConfig(backend="cpu", tensor_threads=1, chunks=2), data_dir=str(tmp_path / "p"),
                   feature_norm="none", dims=[16, 8, 4], id_offsets=[0, small_graph.num_nodes], chunk_counts=[2],
                   graph_servers=[node.address], weight_servers=[])
    gs = GraphServer(node, Message("start", {"spec": spec.to_wire()}))
    gs.platform.close()
    gs.platform = Recorder()  # the tasks are played by this test
    client = client_for(node)
    try:
        rows = int(gs.state.bounds[1])
        task = {"kind": "fwd", "train": True, "epoch": 1, "layer": 0, "chunk": 0}
        gs.feed(Tick(time.time()))
        assert [e["task"]["chunk"] for e in gs.platform.events] == [0, 1]  # epoch 1's first tasks are out
        for name, frames in bad_frames(task).items():
            reply = ask(node, gs.handle, client, frames)
            assert reply.op == "error", name
        wrong_shape = Message("push_result", {"task": task, "version": 0}, {"Z": np.zeros((rows, 5), np.float32)})
        assert "expected" in ask(node, gs.handle, client, encode(wrong_shape, TOKEN))["reason"]
        for bad_task in ["x", {"kind": "fwd"}, dict(task, chunk=99), dict(task, kind="rm")]:
            assert ask(node, gs.handle, client, encode(Message("pull_rows", {"task": bad_task}), TOKEN)).op == "error"
        assert node.rejected == 10
        not_running = dict(task, layer=1)  # a copy nobody wants (any more) is told to stop, and why
        cancel = ask(node, gs.handle, client, encode(Message("pull_rows", {"task": not_running, "req": "r1"}), TOKEN))
        assert cancel.op == "cancel" and cancel["req"] == "r1" and "not running" in cancel["reason"]

        got = ask(node, gs.handle, client, encode(Message("pull_rows", {"task": task}), TOKEN))
        assert got.op == "rows" and got.tensors["P"].shape == (rows, 16)
        z = np.ones((rows, 8), np.float32)
        result = Message("push_result", {"task": task, "version": 0}, {"Z": z})
        assert ask(node, gs.handle, client, encode(result, TOKEN)).op == "ok"
        assert ask(node, gs.handle, client, encode(result, TOKEN)).op == "duplicate"
        np.testing.assert_array_equal(gs.state.ZG[True][0][:rows], z)
        late = ask(node, gs.handle, client, encode(Message("pull_rows", {"task": task, "req": "r2"}), TOKEN))
        assert late.op == "cancel" and late["reason"] == "already done"
    finally:
        client.close(0)
        gs.close()
        node.close()


def test_weight_server_rejects_bad_messages_and_keeps_serving(driver):
    node = Node("weight-server", 0, driver, TOKEN)
    spec = JobSpec(config=TrainConfig(lr=0.01), data_dir="", feature_norm="none", dims=[6, 4, 3], id_offsets=[0, 1],
                   chunk_counts=[1], weight_servers=["x"])
    ws = WeightServer(node, Message("start", {"spec": spec.to_wire()}))
    client = client_for(node)
    try:
        for name, frames in bad_frames({}).items():
            assert ask(node, ws.handle, client, frames).op == "error", name
        for bad in [Message("pull_weights", {"layer": 9, "version": 0}), Message("pull_weights", {"layer": "a", "version": 0}),
                    Message("push_grad", {"layer": 0, "version": 0, "key": [1, 0, 0]}, {"grad": np.zeros((2, 2), np.float32)}),
                    Message("pull_rows", {"task": {}})]:
            assert ask(node, ws.handle, client, encode(bad, TOKEN)).op == "error"
        got = ask(node, ws.handle, client, encode(Message("pull_weights", {"layer": 1, "version": 0}), TOKEN))
        assert got.op == "weights" and got.tensors["W"].shape == (4, 3)
        grad = np.ones((4, 3), np.float32)
        push = Message("push_grad", {"layer": 1, "version": 0, "key": [1, 0, 0]}, {"grad": grad})
        assert ask(node, ws.handle, client, encode(push, TOKEN)).op == "ok"
        assert ask(node, ws.handle, client, encode(push, TOKEN)).op == "duplicate"
        assert ws.store.latest(1) == 1
    finally:
        client.close(0)
        node.close()
