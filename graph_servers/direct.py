"""In-process tensor workers (``cpu``/``gpu`` backends) reach their graph server without a socket.

Their requests (``pull_rows``, ``push_result``) go on a queue that the server's loop thread answers
exactly as it answers a socket's, through the same handler and scheduler; the reply comes back on a
slot the worker waits on. Nothing leaves the process, so nothing is signed, framed or copied through
the kernel: at 10 M vertices a ``cpu`` graph server moved about 7 GB of task rows an epoch through its
own socket and spent most of its loop thread on them. Rows are copied once, out of the server's arrays,
by the worker (off the loop thread): a task's rows are not written while the task runs (the scheduler's
rule for every task), and the copy means no later write can reach a worker that holds them longer.
"""

from __future__ import annotations

import json
import queue
import threading

import numpy as np
import zmq

from dorylus_py.protocol import Message


class DirectSlot:
    """Where the answer to one in-process request goes (the ``identity`` the server replies to)."""

    def __init__(self):
        self._done = threading.Event()
        self.reply: Message | None = None

    def answer(self, reply: Message | None) -> None:
        """The first answer counts, as on a socket (None: the server stopped without one)."""
        if self._done.is_set():
            return
        if reply is not None:
            self.reply = Message(reply.op, _as_on_the_wire(reply.fields), dict(reply.tensors))
        self._done.set()

    def wait(self, timeout_s: float) -> Message | None:
        """The reply, its tensors copied (on the waiting thread), or None after ``timeout_s``."""
        if not self._done.wait(timeout_s) or self.reply is None:
            return None
        return Message(self.reply.op, self.reply.fields, {k: np.array(v) for k, v in self.reply.tensors.items()})


class DirectLink:
    """The queue between a graph server's loop thread and the tensor threads of its own process."""

    def __init__(self, ctx: zmq.Context, poller: zmq.Poller):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        address = f"inproc://direct-{id(self)}"
        self._wake_recv = ctx.socket(zmq.PULL)
        self._wake_recv.bind(address)
        self._wake_send = ctx.socket(zmq.PUSH)  # shared by the tensor threads: sent under the lock
        self._wake_send.connect(address)
        self._lock = threading.Lock()
        self._closed = False
        self._poller = poller
        poller.register(self._wake_recv, zmq.POLLIN)  # a request wakes the loop's poll

    def request(self, msg: Message, timeout_s: float) -> Message | None:
        """From a tensor thread: the server's reply, or None if none came within ``timeout_s``."""
        slot = DirectSlot()
        self._requests.put((slot, Message(msg.op, _as_on_the_wire(msg.fields), msg.tensors)))
        with self._lock:
            if self._closed:  # the server is stopping: the task ends as if it got no reply
                return None
            self._wake_send.send(b"", zmq.NOBLOCK)
        return slot.wait(timeout_s)

    def serve(self, handle, rejected: tuple, on_rejected) -> None:
        """On the loop thread: answer every queued request with ``handle(slot, msg)``; a request the
        handler rejects gets an ``error`` reply (``on_rejected(error)`` counts it), as on a socket."""
        while self._wake_recv.poll(0):
            self._wake_recv.recv()
        while True:
            try:
                slot, msg = self._requests.get_nowait()
            except queue.Empty:
                return
            try:
                handle(slot, msg)
            except rejected as e:
                on_rejected(e)
                slot.answer(Message("error", {"reason": str(e)[:300]}))

    def close(self) -> None:
        with self._lock:  # no tensor thread is sending on the socket being closed
            self._closed = True
            self._wake_send.close(0)
        while True:  # requests no one will serve end now, not at their timeout
            try:
                slot, _ = self._requests.get_nowait()
            except queue.Empty:
                break
            slot.answer(None)
        self._poller.unregister(self._wake_recv)
        self._wake_recv.close(0)


def _as_on_the_wire(fields: dict) -> dict:
    """The fields as the receiver would decode them from a socket (JSON types: lists, not tuples)."""
    return json.loads(json.dumps(fields))
