"""In-process workers reach their graph server through a queue (graph_servers/direct.py), not a socket."""

from __future__ import annotations

import threading
import time

import numpy as np
import zmq

from dorylus_py.protocol import Message
from graph_servers.direct import DirectLink


def _serve_until(link: DirectLink, poller: zmq.Poller, handle, replies: list, rejected: list, expected: int) -> None:
    while len(replies) < expected:
        if poller.poll(2000):
            link.serve(handle, (ValueError,), rejected.append)


def test_a_request_is_answered_on_the_loop_thread_with_copies_and_wire_types():
    ctx, poller = zmq.Context.instance(), zmq.Poller()
    link = DirectLink(ctx, poller)
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    seen = []

    def handle(slot, msg):
        seen.append((threading.current_thread() is threading.main_thread(), msg.fields))
        if msg.op == "bad":
            raise ValueError("a malformed field")
        slot.answer(Message("rows", {"span": (1, 3)}, {"P": rows}))

    replies, rejected = [], []

    def worker():
        for op in ("pull_rows", "bad"):
            replies.append(link.request(Message(op, {"task": (0, 1)}), timeout_s=10))

    t = threading.Thread(target=worker)
    t.start()
    _serve_until(link, poller, handle, replies, rejected, 2)
    t.join(10)
    ok, bad = replies
    assert seen[0] == (True, {"task": [0, 1]})  # served on the loop thread; fields as JSON decodes them
    assert ok.op == "rows" and ok["span"] == [1, 3]
    np.testing.assert_array_equal(ok.tensors["P"], rows)
    rows[:] = -1  # the server writes its arrays later: the worker's copy keeps what was served
    assert ok.tensors["P"][0, 1] == 1.0
    assert bad.op == "error" and "malformed" in bad["reason"] and len(rejected) == 1
    link.close()


def test_a_request_nobody_answers_times_out():
    link = DirectLink(zmq.Context.instance(), zmq.Poller())
    assert link.request(Message("pull_rows", {}), timeout_s=0.2) is None
    link.close()


def test_a_request_after_close_gets_no_reply_at_once():
    link = DirectLink(zmq.Context.instance(), zmq.Poller())
    link.close()
    t0 = time.monotonic()
    assert link.request(Message("pull_rows", {}), timeout_s=10) is None
    assert time.monotonic() - t0 < 1


def test_close_ends_the_requests_waiting_and_the_first_answer_counts():
    ctx, poller = zmq.Context.instance(), zmq.Poller()
    link = DirectLink(ctx, poller)
    got = []
    t = threading.Thread(target=lambda: got.append(link.request(Message("pull_rows", {}), timeout_s=10)))
    t0 = time.monotonic()
    t.start()
    while poller.poll(2000) == []:  # the request is queued
        pass
    link.close()
    t.join(10)
    assert got == [None] and time.monotonic() - t0 < 5
    from graph_servers.direct import DirectSlot

    slot = DirectSlot()
    slot.answer(Message("ok", {}))
    slot.answer(Message("error", {"reason": "later"}))
    assert slot.wait(1).op == "ok"
