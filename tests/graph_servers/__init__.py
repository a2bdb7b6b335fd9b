"""Unit tests of ``graph_servers/``, one module each: a graph server of a one-server job whose tasks and
peers the test plays over real sockets, or the arrays and helpers alone; no job runs (those are in
``tests/cluster/``)."""

import time

import pytest

import graph_servers.server as server_module
from dorylus_py.config import TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.pipeline.events import Tick
from dorylus_py.platforms import Platform
from dorylus_py.protocol import Message
from dorylus_py.serving.job import JobSpec
from dorylus_py.serving.node import ServerNode
from graph_servers.server import GraphServer
from tests.clients import KEY, PUSHER, Client, driver  # noqa: F401  (a fixture)

TASK = {"kind": "fwd", "train": True, "epoch": 1, "layer": 0, "chunk": 0, "server": 0}


class Recorder(Platform):
    def __init__(self):
        super().__init__()
        self.events = []

    def invoke(self, event):
        self.events.append(event)


@pytest.fixture()
def served(small_graph, tmp_path, driver, monkeypatch):  # noqa: F811
    """A graph server of a one-server job whose tasks this test plays (``backend``: the test's parameter)."""
    made = []

    def start(backend="local", **kw):
        prepare(small_graph, tmp_path / "p", 1)
        node = ServerNode("graph-server", 0, driver, KEY)
        cfg = TrainConfig(backend=backend, chunks=2, lambdas=1, tensor_threads=1, **{"stream_rows": 0} | kw)  # planned
        spec = JobSpec(config=cfg, data_dir=str(tmp_path / "p"), feature_norm="row", dims=[16, 8, 4],
                       id_offsets=[0, small_graph.num_nodes], chunk_counts=[2], graph_servers=[node.address],
                       weight_servers=[])
        monkeypatch.setattr(server_module, "make_platform", lambda *a: Recorder())
        gs = GraphServer(node, Message("start", {"spec": spec.to_wire(), "push_id": PUSHER}))
        gs.feed(Tick(time.time()))  # epoch 1's first tasks are out
        client = Client(node)
        made.append((gs, node, client))
        return gs, client

    yield start
    for gs, node, client in made:
        client.close()
        gs.close()
        node.close()


def pull(gs, client, task=TASK, **fields) -> Message:
    return client.ask(gs.handle, Message("pull_rows", {"task": task} | fields))
