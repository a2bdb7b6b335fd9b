"""Refused messages that the design expects (a server's hellos queued while no driver listened, refused as
older than the driver's session) are counted, in the run record too, and not warned about; anything else
refused is a warning a user must look into (issue 56: a clean lab run ended with a false alarm)."""

from __future__ import annotations

import json
import logging
import time

import zmq

from dorylus_py.cluster.driver_link import DriverLink
from dorylus_py.protocol import Message, Session
from dorylus_py.protocol.messages import AuthError, StaleMessage
from dorylus_py.protocol.transport import dealer, gate_of
from dorylus_py.serving.cluster_spec import ClusterSpec
from dorylus_py.serving.rejections import Rejections
from tests.cluster.test_cluster_file import free_ports

KEY = bytes(range(32))


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_expected_refusals_are_counted_not_warned(caplog):
    r = Rejections("driver")
    for _ in range(4):
        r.add("unauthenticated", StaleMessage("message older than this session"))
    with caplog.at_level(logging.DEBUG):
        r.report()
    assert warnings(caplog) == [] and r.record() == {"unauthenticated": 4, "invalid": 0, "bugs": 0, "expected": 4}
    r.add("unauthenticated", AuthError("bad MAC"))
    caplog.clear()
    r.report()
    assert warnings(caplog)[-1] == ("driver refused messages: 5 unauthenticated, 0 invalid, 0 bugs (4 of them from "
                                    "before this start, as expected)")


def test_hellos_from_before_the_driver_started_are_no_alarm(tmp_path, monkeypatch, caplog):
    """As in the lab: the servers of a cluster file start first and say hello to the driver's address; the
    hellos queued before the driver listens are refused as stale when it does."""
    port = free_ports(1)[0]
    address = f"tcp://127.0.0.1:{port}"
    (tmp_path / "cluster.json").write_text(json.dumps({"driver": address, "graph_servers": ["tcp://127.0.0.1:1"],
                                                       "weight_servers": ["tcp://127.0.0.1:2"]}))
    monkeypatch.setenv("DORYLUS_KEY", KEY.hex())
    ctx = zmq.Context()
    server = dealer(ctx, address, gate_of(KEY, None))  # a server's link to the driver, as serving/node.py makes it
    early = Session(KEY)
    for rank in range(3):  # said while no driver listens: they wait in the server's queue
        server.send_multipart(early.encode(Message("hello", {"role": "graph-server", "rank": rank}), address))
    time.sleep(0.01)
    link = DriverLink(tmp_path, ClusterSpec.load(tmp_path / "cluster.json"))
    try:
        deadline = time.monotonic() + 10
        while link.rejections.expected < 3 and time.monotonic() < deadline:
            link.serve_heartbeats()
            time.sleep(0.05)
        with caplog.at_level(logging.DEBUG):
            link.stop()
        assert link.rejections.record() == {"unauthenticated": 3, "invalid": 0, "bugs": 0, "expected": 3}
        assert warnings(caplog) == []
    finally:
        server.close(0)
        ctx.term()
