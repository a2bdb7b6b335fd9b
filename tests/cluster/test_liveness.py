"""Liveness is progress, and nothing captured earlier counts: a server's heartbeat reports its loop's turns
and ends a process whose loop stands still; every send has a deadline and a peer a cap on unanswered
bytes; a bug in a handler is logged, not fatal (strict in tests); a restarted server or the next job
refuses messages captured before."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from dorylus_py.cluster.driver_link import DriverLink, ServerLost
from dorylus_py.errors import DorylusError
from dorylus_py.protocol import Message, Session
from dorylus_py.protocol.transport import Plain, dealer, router
from dorylus_py.serving import node as node_module
from dorylus_py.serving.node import Peer, PeerStuck, ServerNode
from tests.clients import Client
from tests.cluster.test_cluster_file import free_ports

KEY = b"k" * 32


@pytest.fixture()
def driver():
    sock = router(zmq.Context.instance(), Plain.of_job(KEY))
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield f"tcp://127.0.0.1:{port}"
    sock.close(0)


def test_a_send_to_a_peer_that_never_reads_fails_within_the_hang_timeout(driver):
    """A send used to block forever on a peer whose queue was full, and the heartbeat thread kept the
    stuck process looking alive."""
    node = ServerNode("graph-server", 0, driver, KEY, hang_timeout_s=0.5)
    nobody = node.dealer(f"tcp://127.0.0.1:{free_ports(1)[0]}")  # nothing listens: messages only queue
    try:
        with pytest.raises(PeerStuck, match="has not read a ghosts for 0 s"):
            for _ in range(10_000):  # the queue holds 1,000 (SNDHWM); the next waits, then gives up
                node.send(nobody, Message("ghosts", {"x": 1}))
    finally:
        nobody.close(0)
        node.close()


def test_a_peer_that_answers_nothing_has_a_cap_in_bytes(driver, monkeypatch):
    monkeypatch.setattr(node_module, "PEER_CAP_BYTES", 10_000)
    node = ServerNode("graph-server", 0, driver, KEY)
    listener = router(zmq.Context.instance(), Plain.of_job(KEY))
    port = listener.bind_to_random_port("tcp://127.0.0.1")
    peer = node.dealer(f"tcp://127.0.0.1:{port}", answered=True)
    server = Session(KEY)  # the peer
    try:
        block = {"rows": np.zeros(1_000, np.float32)}  # 4,000 bytes
        node.send(peer, Message("ghosts", {}, block))
        node.send(peer, Message("ghosts", {}, block))
        with pytest.raises(PeerStuck, match="has not answered 2 messages of 8000 bytes"):
            node.send(peer, Message("ghosts", {}, block))
        route, *frames = listener.recv_multipart()
        request = server.decode(frames, f"tcp://127.0.0.1:{port}")
        listener.send_multipart([route, *server.encode(Message("ok"), request.sender)])
        assert peer.poll(5000) and node.receive(peer).op == "ok"  # the peer answered one: room again
        node.send(peer, Message("ghosts", {}, block))
    finally:
        listener.close(0)
        node.close()


def _bound_again(port: int) -> ServerNode:
    """A new server process's node on the port an earlier one just closed (released asynchronously)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return ServerNode("weight-server", 0, "tcp://127.0.0.1:1", KEY, port=port)
        except DorylusError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # the port is still held by the closed socket's I/O thread


HUNG = """
import sys, time
from dorylus_py.serving.heartbeat import Heartbeat
from dorylus_py.serving.node import ServerNode
node = ServerNode("graph-server", 0, sys.argv[1], b"k" * 32, hang_timeout_s=1.0)
Heartbeat(node)
node.serve_once(lambda *a: None, 10)  # the loop turned once: serving
time.sleep(60)  # ... and then stands still, as in a send that never returns
"""


def test_a_server_whose_loop_stands_still_ends_itself_as_hung(driver, tmp_path):
    """Its heartbeat thread alone would keep it looking alive: it reports the loop's turns, and ends the
    process (code 4, one line) once they stop for the hang timeout, well before the driver's silence."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", HUNG, driver], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "the serving loop has not turned for 1 s (hung); exiting" in proc.stderr
    assert time.monotonic() - t0 < 30


def test_the_driver_reports_a_server_whose_loop_stands_still_as_hung(tmp_path, monkeypatch):
    monkeypatch.setenv("DORYLUS_KEY", KEY.hex())
    link = DriverLink(tmp_path, hang_timeout_s=1.0)
    link.begin()
    link.expect(["graph-server-0"])
    beat = dealer(zmq.Context.instance(), link.address, Plain.of_job(KEY))
    server = Session(KEY).for_job(link.session.job)
    try:
        with pytest.raises(ServerLost, match="graph-server-0 is hung: its serving loop has not turned for 1 s"):
            for turns in [1, 2, 3] + [3] * 100:  # turning, then standing still (beating all the while)
                beat.send_multipart(server.encode(Message("heartbeat", {"role": "graph-server", "rank": 0,
                                                                        "turns": turns}), link.address))
                try:
                    link.recv(0.2)
                except ServerLost:
                    raise
                except DorylusError:
                    pass  # nothing but heartbeats came, as expected
    finally:
        beat.close(0)
        link.stop()


def test_a_bug_in_a_handler_is_logged_and_the_loop_goes_on(driver, monkeypatch, caplog):
    node = ServerNode("graph-server", 0, driver, KEY)
    client = Client(node)

    def handle(peer: Peer, msg: Message) -> None:
        if msg.op == "result":
            raise IndexError("a bug")
        node.reply(peer, Message("ok", {"req": msg.get("req")}))

    try:
        with pytest.raises(IndexError):  # in the tests (DORYLUS_STRICT=1) a bug fails, never counts as refused
            client.ask(handle, Message("result", {"req": "a"}))
        monkeypatch.delenv("DORYLUS_STRICT")  # as in production
        reply = client.ask(handle, Message("result", {"req": "b"}))
        assert reply.op == "error" and reply["reason"] == "internal error" and reply["req"] == "b"
        assert client.ask(handle, Message("lease", {"req": "c"})).op == "ok"  # still serving
        assert node.rejections.counts["bugs"] == 2 and node.rejections.counts["invalid"] == 0
        assert "bug while handling result from" in caplog.text
    finally:
        client.close()
        node.close()


def test_nothing_captured_in_one_job_or_process_is_accepted_in_the_next(tmp_path):
    """Fixed addresses (a cluster file) and a key kept across jobs: a request captured in job 1 used to be
    accepted again by a restarted server, or by the same server in job 2, within the clock window."""
    port = free_ports(1)[0]
    address = f"tcp://127.0.0.1:{port}"
    ctx = zmq.Context.instance()

    def serve(node: ServerNode, frames) -> str:
        """Send ``frames`` to ``node``: 'answered' or 'dropped' (unauthenticated)."""
        sock = dealer(ctx, address, Plain.of_job(KEY))
        before = node.rejections.counts["unauthenticated"]
        sock.send_multipart(frames)
        deadline = time.monotonic() + 60  # a hang guard: each way ends on an event
        try:
            while time.monotonic() < deadline:
                node.serve_once(lambda peer, msg: node.reply(peer, Message("ok")), 20)
                if sock.poll(0):
                    return "answered"
                if node.rejections.counts["unauthenticated"] > before:
                    return "dropped"
            raise AssertionError("neither answered nor dropped within 60 s")
        finally:
            sock.close(0)

    job1, job2 = b"\x01" * 16, b"\x02" * 16
    peer = Session(KEY, job=job1)
    node = ServerNode("weight-server", 0, "tcp://127.0.0.1:1", KEY, port=port)
    node.session = node.session.for_job(job1)  # its start
    captured = peer.encode(Message("push_grad", {"layer": 0}), address)
    hello = Session(KEY).encode(Message("ping"), address)  # unbound, as before a start
    assert serve(node, captured) == "answered"
    node.new_job()
    node.session = node.session.for_job(job2)
    assert serve(node, captured) == "dropped"  # the next job, same process and address
    node.close()
    restarted = _bound_again(port)
    restarted.session = restarted.session.for_job(job1)  # even bound to the same job
    assert serve(restarted, captured) == "dropped"  # stamped before this process began
    assert serve(restarted, hello) == "dropped"
    assert serve(restarted, Session(KEY, job=job1).encode(Message("push_grad", {}), address)) == "answered"
    restarted.close()


ORPHAN = """
import os, sys, time
from dorylus_py.serving.node import exit_with_parent
exit_with_parent(3)
print(os.environ.get("DORYLUS_PARENT_PID", "taken out"), flush=True)  # not for this process's own children
time.sleep(60)
"""


def test_a_worker_whose_spawner_died_before_it_looked_exits_at_once():
    """A gossip worker imports torch for seconds before it watches its parent; a launcher killed in that
    time left it running for good (its parent was already init). The spawner names itself in the
    environment: a child whose named parent is gone exits; one whose parent lives runs on."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = subprocess.Popen([sys.executable, "-c", ORPHAN], env=dict(os.environ, DORYLUS_PARENT_PID=str(gone.pid)))
    child = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, DORYLUS_PARENT_PID=str(os.getpid())))
    try:
        assert orphan.wait(timeout=20) == 3
        assert child.stdout.readline().strip() == "taken out"
        time.sleep(2)
        assert child.poll() is None  # its parent (this test) lives
    finally:
        for p in (orphan, child):
            p.kill()
            p.wait()
