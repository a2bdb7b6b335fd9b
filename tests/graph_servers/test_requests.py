"""What workers and peers ask of a graph server: unauthenticated frames (truncated, unsigned, wrong key,
replayed) are dropped unanswered; authentic ones with wrong shapes, unknown ops or bad tasks get an error
reply, and the server then answers the next good request; streamed results (``--stream-rows``) are served
in blocks, staged and committed only whole, with the task's last message."""

import json
import time

import numpy as np

from dorylus_py.config import TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.pipeline.events import Tick
from dorylus_py.protocol import Message
from dorylus_py.serving.job import JobSpec
from dorylus_py.serving.node import ServerNode
from dorylus_py.worker.event import Stream
from graph_servers.server import GraphServer
from tests.clients import KEY, PUSHER, Client, authentic_but_bad, driver, unauthenticated  # noqa: F401  (a fixture)
from tests.graph_servers import TASK, Recorder, pull, served  # noqa: F401  (a fixture)


def test_graph_server_rejects_bad_messages_and_keeps_serving(small_graph, tmp_path, driver):
    prepare(small_graph, tmp_path / "p", 1)
    node = ServerNode("graph-server", 0, driver, KEY)
    spec = JobSpec(config=TrainConfig(backend="cpu", tensor_threads=1, chunks=2, stream_rows=0), data_dir=str(tmp_path / "p"),
                   feature_norm="none", dims=[16, 8, 4], id_offsets=[0, small_graph.num_nodes], chunk_counts=[2],
                   graph_servers=[node.address], weight_servers=[])
    gs = GraphServer(node, Message("start", {"spec": spec.to_wire(), "push_id": PUSHER}))
    gs.platform.close()
    gs.platform = Recorder()  # the tasks are played by this test
    client = Client(node)
    try:
        rows = int(gs.state.bounds[1])
        task = {"kind": "fwd", "train": True, "epoch": 1, "layer": 0, "chunk": 0}
        gs.feed(Tick(time.time()))
        assert [e.task.key.chunk for e in gs.platform.events] == [0, 1]  # epoch 1's first tasks are out
        assert all("token" not in e.to_dict() and KEY.hex() not in json.dumps(e.to_dict()) for e in gs.platform.events)
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


def test_the_server_serves_blocks_and_commits_a_streamed_result_only_whole(served):
    gs, client = served(stream_rows=40)
    rows = int(gs.state.bounds[1])  # chunk 0 of the one server
    assert gs.platform.events[0].stream == Stream(rows, 40)
    whole = pull(gs, client).tensors["P"]
    part = pull(gs, client, block=[40, 80])
    np.testing.assert_array_equal(part.tensors["P"], whole[40:80])
    assert part["start"] == 0 and part["stop"] == rows  # the chunk's bounds: the worker offsets its ids

    def push(op, block=None, req="r", run="a", **tensors):
        fields = {"task": TASK, "req": req, "run": run} | ({"block": block} if block else {})
        if op == "push_result":
            fields |= {"streamed": True, "version": 0}
        return client.ask(gs.handle, Message(op, fields, tensors))

    z = np.ones((rows, gs.state.shapes[0].z_width), np.float32)
    for bad, why in [([0, rows + 1], "block end"), ([5, 5], "block end"), ([-1, 3], "block start"), ("0-3", "block")]:
        got = push("push_block", bad, req="bad", Z=z[:3])
        assert got.op == "error" and got["req"] == "bad" and why in got["reason"]
    assert "shape" in push("push_block", [0, 3], Z=z[:4]).get("reason")
    assert "names no block" in push("push_block", None, Z=z).get("reason")
    assert "run" in push("push_block", [0, 3], run=["x"], Z=z[:3]).get("reason")

    def stage(block, z, run="a", task=TASK, kept=True):  # unanswered; staged if the copy runs
        before = gs.stats["blocks"]
        client.sock.send_multipart(client.frames(Message("push_block", {"task": task, "block": block, "run": run},
                                                         {"Z": z})))
        for _ in range(100 if kept else 5):
            gs.node.serve_once(gs.handle, 20)
            if gs.stats["blocks"] > before:
                break
        assert gs.stats["blocks"] == before + kept and not client.sock.poll(50)

    stage([0, 40], z[:40])
    assert "came before" in push("push_block", [30, 50], Z=z[30:50]).get("reason")
    stage([0, rows], z, task=dict(TASK, attempt=2), kept=False)  # no copy 2 was launched
    assert len(gs.staging) == 1
    stage([40, rows], z[40:], run="b")  # a retried invocation of the same copy is another run
    assert "misses" in push("push_result").get("reason")  # run a's rows 40.. never came; nothing written
    assert not gs.state.ZG[True][0][:rows].any() and len(gs.staging) == 1  # the failed commit took run a's
    stage([0, 40], z[:40], run="b")
    assert push("push_result", run="b").op == "ok"
    np.testing.assert_array_equal(gs.state.ZG[True][0][:rows], z)
    assert len(gs.staging) == 0 and pull(gs, client).op == "cancel"  # done: a late copy is told to stop
    stage([0, 40], z[:40], run="c", kept=False)  # a late copy's blocks are not kept; its commit: a duplicate
    assert push("push_result", run="c").op == "duplicate" and len(gs.staging) == 0
