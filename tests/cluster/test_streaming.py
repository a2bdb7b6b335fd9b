"""Streaming inside a task (``--stream-rows``): whole jobs equal whole-chunk ones; the worker's link
credits replies that came while it computed. How the graph server sends a task in parts and stages
their results until the task's last part commits them: ``tests/graph_servers/test_requests.py`` and
``test_staging.py``."""

import json
import threading
import time

import numpy as np
import pytest
import zmq

from dorylus_py.cli import main
from dorylus_py.config import ConfigError, TrainConfig
from dorylus_py.protocol import Message, Session
from dorylus_py.worker.channel import Channel
from dorylus_py.worker.stream import MAX_BLOCKS, Totals, stream_spans
from tests.clients import KEY
from tests.cluster import assert_gradients_once
from tests.cluster.test_fused import losses, run


def end_stats(tmp_path, name) -> list[dict]:
    return [json.loads(line.split(" end ", 1)[1]) for p in sorted((tmp_path / name / "logs").glob("graph-server-*"))
            for line in p.read_text().splitlines() if " end {" in line]


@pytest.mark.parametrize("kw, faults", [({"model": "gcn", "fuse": "on"}, {}),
                                        ({"model": "sage"}, {"lambda_fail_rate": 0.3, "relaunch_min_s": 0.5})],
                         ids=["gcn-fused", "sage-failing"])
@pytest.mark.long
def test_a_streamed_job_equals_whole_chunks(small_graph, tmp_path, kw, faults):
    """Dropout on (masks by vertex id: a block draws its rows of the chunk's mask); 100 rows a chunk in
    blocks of 37 (the last one short); the row cache fills from blocks and is used by later pulls.
    GCN fused streams fwd, fused and eval tasks; GraphSAGE fwd, loss, bwd and eval, with Lambdas that
    fail before or part-way (their blocks staged, never committed) and are relaunched."""
    plain = run(small_graph, tmp_path, "plain", backend="local", dropout=0.5, **kw)
    streamed = run(small_graph, tmp_path, "streamed", backend="local", dropout=0.5, stream_rows=37, **kw, **faults)
    np.testing.assert_allclose(losses(streamed), losses(plain), rtol=1e-6)
    assert [r["val_acc"] for r in streamed.history] == [r["val_acc"] for r in plain.history]
    assert_gradients_once(streamed.summary, 3 * 2 * 2 * 3)  # a failed copy's staged blocks never commit
    before, after = end_stats(tmp_path, "plain"), end_stats(tmp_path, "streamed")
    assert all(s["result_blocks"] == 0 for s in before) and all(s["result_blocks"] >= 3 * 3 * 3 for s in after)
    if faults:
        assert sum(s["relaunches"] for s in after) > 0
    else:  # the same bytes, give or take headers: the features came in blocks once, then from the cache
        assert sum(s["bytes_sent"] for s in after) <= 1.05 * sum(s["bytes_sent"] for s in before)


def test_blocks_and_totals():
    assert stream_spans(100, 37) == [(0, 37), (37, 74), (74, 100)]
    assert len(stream_spans(10_000, 1)) == MAX_BLOCKS  # every part goes out at once
    for rows, block in ((30, 0), (30, 37), (37, 37)):
        assert stream_spans(rows, block) == []
    t = Totals()
    import torch
    for i in range(3):
        t.add({"grad:W0": torch.full((2, 2), float(i))}, {"loss_sum": 0.5, "correct": [i, 1, 0]})
    grads, fields = t.result()
    assert grads["grad:W0"].tolist() == [[3.0, 3.0], [3.0, 3.0]] and fields == {"loss_sum": 1.5, "correct": [3, 3, 0]}


class _Capped:
    bandwidth_mbps = 8.0  # 1 MB a second: 100 ms for a 100 kB reply

    def get_remaining_time_in_millis(self):
        return 60_000


def test_a_reply_that_came_while_the_worker_computed_is_timed_from_before_its_compute():
    """The server answers the second request only once the worker has taken the first reply and started
    its compute (an event), so the second reply comes while the worker computes; the test waits until it
    is on the socket (poll, nothing taken) and takes it after the compute."""
    ctx = zmq.Context.instance()
    server, session = ctx.socket(zmq.ROUTER), Session(KEY)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    sock = ctx.socket(zmq.DEALER)
    sock.connect(address)
    payload = np.zeros(25_000, np.float32)  # 100 kB
    computing = threading.Event()
    server_session = Session(KEY)  # made before anything is sent to it: it refuses what is older

    def serve():
        for i in range(2):
            route, *body = server.recv_multipart()
            msg = server_session.decode(body, address)
            if i == 1:
                computing.wait(30)  # a hang guard
            reply = Message("task", {"req": msg["req"]}, {"x": payload})
            server.send_multipart([route, *server_session.encode(reply, msg.sender)])

    t = threading.Thread(target=serve)
    t.start()
    try:
        ch = Channel(sock, address, session, _Capped())
        ch.link.in_free = ch.link.out_free = 0.0
        first, second = ch.send(Message("pull_weights", {})), ch.send(Message("pull_weights", {}))
        empty_at = ch.quiet  # the socket was last seen empty then (at the latest)
        assert ch.reply(first, time.monotonic() + 30).tensors["x"].nbytes == payload.nbytes
        transfer_s = (payload.nbytes + 1_000) / (_Capped.bandwidth_mbps * 1e6 / 8)  # a reply, its header under 1 kB
        assert time.time() >= empty_at + payload.nbytes / 1e6  # the first waited out its transfer: 100 kB at 1 MB/s
        computing_from = ch.quiet
        assert second not in ch.replies
        computing.set()
        assert sock.poll(30_000)  # the second reply is on the socket, not taken (a hang guard)
        time.sleep(3 * transfer_s)  # the compute goes on for longer than two transfers
        looked_at = time.time()
        ch.drain()
        _, arrives = ch.replies[second]
        # Credited from when the socket was last seen empty, right behind the first reply (which arrived at
        # most one transfer after that): at most two transfers after it, before the worker looked again;
        # counted from the look, it would be a transfer after the look.
        assert arrives <= computing_from + 2 * transfer_s < looked_at, (arrives - computing_from, looked_at - computing_from)
    finally:
        computing.set()
        t.join(5)
        sock.close(0)
        server.close(0)


def test_stream_rows_is_refused_where_nothing_streams(capsys):
    with pytest.raises(ConfigError, match="^stream_rows streams a Lambda"):
        TrainConfig(backend="cpu", stream_rows=100).check()
    with pytest.raises(ConfigError, match="GAT"):
        TrainConfig(backend="local", model="gat", stream_rows=100).check()
    with pytest.raises(ConfigError, match="^stream_rows must be >= 0"):
        TrainConfig(backend="local", stream_rows=-1).check()
    TrainConfig(backend="local", stream_rows=100).check()
    assert main(["train", "--backend", "cpu", "--stream-rows", "64", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "--stream-rows" in err and "Traceback" not in err


def test_stream_rows_auto_streams_where_the_links_are_capped(graph_npz, tmp_path):
    from dorylus_py.plan import plan
    from dorylus_py.settings import AUTO

    def rows(**kw) -> int:
        cfg = TrainConfig(**{"backend": "local", "lambdas": 4, "graph_servers": 2} | kw)
        cfg.check()
        return plan(cfg, 16, 4, 200_000, [100_001, 99_999]).config.stream_rows

    assert TrainConfig().stream_rows is AUTO
    # 4 Lambdas, 2 a server: 2 chunks of the larger part (50,001 rows), each in 4 blocks
    assert rows(lambda_bandwidth_mbps=200) == 12_501
    assert rows(lambda_bandwidth_mbps=200, chunks=5) == 5_001
    assert rows(lambda_bandwidth_mbps=200, model="sage") == 12_501
    for whole in ({}, {"lambda_bandwidth_mbps": 200, "lambdas": AUTO}, {"lambda_bandwidth_mbps": 200, "model": "gat"},
                  {"backend": "cpu"}, {"lambda_latency_ms": 20}):
        assert rows(**whole) == 0, whole
    assert rows(lambda_bandwidth_mbps=200, stream_rows=0) == 0 and rows(stream_rows=64) == 64  # given: kept
    # a real job on a prepared store: the record holds the count it streamed with, from the partitions'
    # sizes (fennel's are uneven here, 307 and 293: the larger one's single chunk in 4 blocks of 77, where
    # an even split's 75 would make a fifth block of 7 rows), and the epoch ran
    store, run_dir = tmp_path / "store", tmp_path / "run"
    assert main(["prepare", str(graph_npz), "-k", "2", "--partitioner", "fennel", "--out", str(store)]) == 0
    largest = max(p["nodes"] for p in json.loads((store / "manifest.json").read_text())["parts"])
    assert main(["train", "--backend", "local", "--data", str(store), "--lambdas", "2", "--epochs", "1",
                 "--lambda-bandwidth-mbps", "1000", "--out", str(run_dir), "--quiet"]) == 0
    config = json.loads((run_dir / "config.json").read_text())
    assert largest > config["graph"]["nodes"] // 2 and config["chunks"] == 1 and config["stream_rows"] == -(-largest // 4)
    assert all(s["result_blocks"] >= 3 for s in end_stats(tmp_path, "run"))  # its tasks came back in blocks
