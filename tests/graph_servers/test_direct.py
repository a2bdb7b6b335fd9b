"""A graph server's own tensor threads (graph_servers/direct.py): tasks go to them on a queue, their
results come back on the loop thread, as from a socket (through the header's codec), and a task that
raises, or whose result no socket would carry, is a failed result, never a dead thread."""

from __future__ import annotations

import threading
import time

import numpy as np
import zmq

from dorylus_py.protocol import Message
from graph_servers.direct import DIRECT, DirectWorkers


class Runner:
    """What a TaskRunner does with a task, as far as the threads care: a result, or an exception."""

    def __init__(self):
        self.thread = None

    def run(self, task: Message, copy_rows: bool = False) -> Message:
        assert copy_rows  # the server's own arrays: the runner copies them
        self.thread = threading.current_thread()
        if task.op == "bad":
            raise ValueError("a malformed task")
        if task.get("silent"):
            return None
        if task.get("diverged"):
            return Message("result", {"task": task["task"], "loss_sum": float("nan")})
        return Message("result", {"task": task["task"], "span": (1, 3), "scale": np.float64(0.5)}, {"Z": task.tensors["P"] * 2})


def _results(workers: DirectWorkers, poller: zmq.Poller, expected: int, timeout_s: float = 10) -> list:
    got, rejected = [], []
    deadline = time.monotonic() + timeout_s
    while len(got) < expected and time.monotonic() < deadline:
        if poller.poll(200):
            workers.serve(lambda who, msg: got.append((who, threading.current_thread(), msg)), (ValueError,), rejected.append)
    return got


def test_results_come_back_on_the_loop_thread_with_wire_types_and_failures_as_results():
    ctx, poller = zmq.Context.instance(), zmq.Poller()
    runner = Runner()
    workers = DirectWorkers(ctx, poller, 2, lambda: runner)
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    workers.send(Message("task", {"task": {"chunk": 0}}, {"P": rows}))
    workers.send(Message("task", {"task": {"chunk": 1}, "silent": True}, {"P": rows}))  # a part with nothing to say
    workers.send(Message("bad", {"task": {"chunk": 2}}))
    workers.send(Message("task", {"task": {"chunk": 3}, "diverged": True}))
    got = _results(workers, poller, 3)
    by_chunk = {msg["task"]["chunk"]: (who, thread, msg) for who, thread, msg in got}
    assert set(by_chunk) == {0, 2, 3}
    who, thread, ok = by_chunk[0]
    assert who is workers and thread is threading.main_thread() and runner.thread is not threading.main_thread()
    assert ok["span"] == [1, 3] and ok["lease"] == DIRECT  # fields as a socket would carry them
    assert type(ok["scale"]) is float and ok["scale"] == 0.5
    np.testing.assert_array_equal(ok.tensors["Z"], rows * 2)
    failed = by_chunk[2][2]
    assert "ValueError: a malformed task" in failed["failed"] and failed["lease"] == DIRECT
    assert "field 'loss_sum': not a finite number" in by_chunk[3][2]["failed"]  # a socket's sender refuses it too
    workers.close()


def test_close_stops_the_threads_and_drops_what_was_not_started():
    ctx, poller = zmq.Context.instance(), zmq.Poller()
    workers = DirectWorkers(ctx, poller, 1, Runner)
    workers.close()
    workers.send(Message("task", {"task": {"chunk": 0}}, {"P": np.zeros((1, 1), np.float32)}))
    time.sleep(0.2)
    assert workers._results.empty()
