"""The graph server's side of the static-row cache: a pull that names the server's own token for the
chunk's input features gets them no more (and the server's byte counters say so); a wrong, forged or
other chunk's token gets the rows; a malformed ``have`` is refused with an error and the server keeps
serving; and the worker's side (``handler._pull_rows``) puts the held rows back, bit for bit."""

import threading
import time

import numpy as np
import pytest

import graph_servers.server as server_module
from dorylus_py.cluster.job import JobSpec
from dorylus_py.cluster.node import Node
from dorylus_py.config import TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.pipeline.events import TaskKey, Tick
from dorylus_py.protocol import Message, ProtocolError
from graph_servers.server import GraphServer
from graph_servers.task_io import has_static
from graph_servers.wire import MAX_HELD, held_tokens
from lambda_functions import handler as worker
from lambda_functions.row_cache import RowCache
from tests.cluster.fuzz_corpus import hypothesis_values
from tests.cluster.test_servers import KEY, Client, Recorder, driver  # noqa: F401  (a fixture)

TASK = {"kind": "fwd", "train": True, "epoch": 1, "layer": 0, "chunk": 0, "server": 0}


@pytest.fixture()
def served(small_graph, tmp_path, driver, monkeypatch):  # noqa: F811
    """A graph server of a one-server job whose tasks this test plays (``backend``: the test's parameter)."""
    made = []

    def start(backend="local", **kw):
        prepare(small_graph, tmp_path / "p", 1)
        node = Node("graph-server", 0, driver, KEY)
        cfg = TrainConfig(backend=backend, chunks=2, lambdas=1, tensor_threads=1, **kw)
        spec = JobSpec(config=cfg, data_dir=str(tmp_path / "p"), feature_norm="row", dims=[16, 8, 4],
                       id_offsets=[0, small_graph.num_nodes], chunk_counts=[2], graph_servers=[node.address],
                       weight_servers=[])
        monkeypatch.setattr(server_module, "make_platform", lambda *a: Recorder())
        gs = GraphServer(node, Message("start", {"spec": spec.to_wire()}))
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


def test_a_held_token_skips_the_features_and_a_wrong_one_gets_them(served):
    gs, client = served()
    assert [e["row_cache_mb"] for e in gs.platform.events] == [752, 752]  # a quarter of 3008 MB
    first = pull(gs, client)
    token = first["static"]["P"]
    features = np.array(first.tensors["P"])
    np.testing.assert_array_equal(features, gs.state.input_rows(0, int(gs.state.bounds[1])))
    other_chunk = pull(gs, client, dict(TASK, chunk=1))["static"]["P"]
    assert other_chunk != token and len(token) == 32

    before = gs.usage.totals["bytes_sent"]
    hit = pull(gs, client, have=[token])
    assert "P" not in hit.tensors and hit["static"] == {"P": token}
    assert gs.usage.totals["bytes_sent"] == before  # a fwd of layer 0 pulls nothing else
    for wrong in (["f" * 32], [other_chunk], ["forged", token[:-1] + "0"], []):
        got = pull(gs, client, have=wrong)
        np.testing.assert_array_equal(got.tensors["P"], features)
        assert got["static"] == {"P": token}
    assert gs.usage.totals["bytes_sent"] == before + 4 * features.nbytes


def test_only_layer_0_inputs_are_static_and_cpu_backends_name_none(served):
    static = [k for k in ("fwd", "bwd", "edge_fwd", "loss", "fused", "eval") for layer in (0, 1)
              if has_static(TaskKey(k, True, 1, layer, 0))]
    assert static == ["fwd", "bwd"]
    gs_cpu, cpu = served("cpu")
    assert all(e["row_cache_mb"] == 0 for e in gs_cpu.platform.events)
    got = pull(gs_cpu, cpu, have=["f" * 32])
    assert got.op == "rows" and "static" not in got.fields and got.tensors["P"].shape[1] == 16


@pytest.mark.parametrize("have", ["x", 5, {"a": 1}, [1], [None], [""], ["a" * 65], ["t"] * (MAX_HELD + 1), [["t"]]])
def test_a_malformed_have_is_refused_and_the_server_keeps_serving(served, have):
    gs, client = served()
    refused = pull(gs, client, have=have, req="bad")
    assert refused.op == "error" and refused["req"] == "bad" and "have" in refused["reason"]
    assert pull(gs, client).tensors["P"].shape[1] == 16


def test_any_json_as_have_is_a_token_set_or_a_protocol_error():
    for value in hypothesis_values(300) + [None, [], ["t"] * MAX_HELD]:
        try:
            tokens = held_tokens(value)
        except ProtocolError:
            continue
        assert isinstance(tokens, frozenset) and all(isinstance(t, str) for t in tokens)


def test_the_worker_puts_its_held_rows_back_bit_for_bit(served, monkeypatch):
    gs, client = served()
    cache = RowCache()
    monkeypatch.setattr(worker, "_row_cache", cache)
    event = {"graph_server": gs.node.address, "row_cache_mb": 1}
    got = []

    def pulls():
        sock = worker._socket(gs.node.address, None)
        try:
            for _ in range(2):
                reply, tensors = worker._pull_rows(event, TASK, lambda msg: worker._request(sock, msg, client.session))
                got.append((reply, {k: np.array(v) for k, v in tensors.items()}))
        finally:
            sock.close(0)

    t = threading.Thread(target=pulls)
    t.start()
    while t.is_alive():
        gs.node.serve_once(gs.handle, 20)
    (cold, cold_rows), (warm, warm_rows) = got
    assert "P" in cold.tensors and "P" not in warm.tensors and len(cache) == 1
    np.testing.assert_array_equal(warm_rows["P"], cold_rows["P"])
    assert warm_rows["P"].dtype == np.float32

    event["row_cache_mb"] = 0  # a later event that turns the cache off empties it
    assert worker._row_cache_of(event) is None and len(cache) == 0
