"""Unit tests of ``graph_servers/``, one module each: a graph server of a one-server job whose leases and
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
from dorylus_py.sections import LAMBDA_BACKENDS
from dorylus_py.serving.node import ServerNode
from graph_servers.server import GraphServer
from tests.clients import KEY, PUSHER, Client, driver  # noqa: F401  (a fixture)

TASK = {"kind": "fwd", "train": True, "epoch": 1, "layer": 0, "chunk": 0, "server": 0, "version": None, "hold": None,
        "attempt": 1}


class Recorder(Platform):
    """A platform that only records the leases it is asked to start (the test plays them)."""

    name = "local-lambda"

    def __init__(self, size: int = 2):
        super().__init__()
        self.events, self.size = [], size

    @property
    def concurrency(self) -> int:
        return self.size

    def invoke(self, event):
        self.events.append(event)

    def end(self, event, ok: bool = False, error: str = "died") -> None:
        """The invocation of ``event``'s lease ended (as the platform would say)."""
        from dorylus_py.platforms.base import Completion

        now = time.time()
        self._done.put(Completion({"lease": event.lease}, self.name, now - 1, now, 1000, 1769, ok, error))


@pytest.fixture()
def served(small_graph, tmp_path, driver, monkeypatch):  # noqa: F811
    """A graph server of a one-server job whose leases this test plays (``backend``: the test's parameter);
    epoch 1's first tasks wait for a lease, and the leases they need have been invoked."""
    made = []

    def start(backend="local", **kw):
        prepare(small_graph, tmp_path / "p", 1)
        node = ServerNode("graph-server", 0, driver, KEY)
        cfg = TrainConfig(backend=backend, chunks=2, lambdas=2, tensor_threads=1, **{"stream_rows": 0} | kw)  # planned
        spec = JobSpec(config=cfg, data_dir=str(tmp_path / "p"), feature_norm="row", dims=[16, 8, 4],
                       id_offsets=[0, small_graph.num_nodes], chunk_counts=[2], graph_servers=[node.address],
                       weight_servers=[])
        if backend in LAMBDA_BACKENDS:  # the cpu and gpu backends keep their own threads
            monkeypatch.setattr(server_module, "make_platform", lambda *a: Recorder())
        gs = GraphServer(node, Message("start", {"spec": spec.to_wire(), "push_id": PUSHER}))
        gs.feed(Tick(time.time()))  # epoch 1's first tasks are out
        gs._dispatch()
        client = Client(node)
        made.append((gs, node, client))
        return gs, client

    yield start
    for gs, node, client in made:
        client.close()
        gs.close()
        node.close()


def pump(gs, client, want: int = 1, turns: int = 100, until=lambda: True) -> list[Message]:
    """Run the server (messages in, copies out) until the test's worker has ``want`` messages and
    ``until()`` holds, or for ``turns`` turns; the messages it got."""
    got = []
    for _ in range(turns):
        gs._serve_once(10)
        gs._collect()
        gs._dispatch()
        while client.sock.poll(0):
            got.append(client.session.decode(client.sock.recv_multipart(), client.session.id))
        if len(got) >= want and until():
            break
    return got


def hello(gs, client, lease: str, want: int = 1, **fields) -> list[Message]:
    """The test's worker says it is ``lease``; the messages it gets (its tasks, or a release)."""
    client.sock.send_multipart(client.frames(Message("lease", {"lease": lease} | fields)))
    return pump(gs, client, want)


def result(gs, client, sent: Message, tensors: dict, want: int = 0, **fields) -> list[Message]:
    """The test's worker sends the result of ``sent`` (a task message it got); what comes back (nothing,
    unless the result is refused: an error, or new tasks when ``want``)."""
    fields = {"lease": sent["lease"], "task": sent["task"], "version": 0} | fields
    handled = gs.usage.ops["in:result"] + 1
    client.sock.send_multipart(client.frames(Message("result", fields, tensors)))
    # until the server has read it (a loaded box may take more than a turn to carry it across)
    return pump(gs, client, want, turns=max(500, 5 * want), until=lambda: gs.usage.ops["in:result"] >= handled)


def leave(gs, client, lease: str) -> list[Message]:
    """The test's worker leaves ``lease``; what it gets back (the server's release, which it waits for)."""
    client.sock.send_multipart(client.frames(Message("leave", {"lease": lease, "reason": "idle"})))
    return pump(gs, client, want=1)
