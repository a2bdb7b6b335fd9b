"""A tensor worker's messages on one socket: its requests in flight and their replies, and what the
server sends it unasked (a lease's tasks), as they come in.

A worker sends one request or several (its pulls of a layer's weights from several weight servers) and
takes each reply by its request id, in any order; a lease takes the tasks its graph server sends it, in
order (``accept``: which unasked messages are its own). Replies to requests it does not wait for (an
earlier, abandoned invocation on this warm socket; an error about a message that needs no answer) are
skipped, as are messages that do not decode.

On an emulated link (``link.py``) a message is sent once the link would have carried it, or at once
when nothing waits on it (``wait=False``: a streamed task's result blocks, which the graph server only
stages; its final message then waits for every byte before it). A reply counts as received once the
link would have carried it, counting from when it was there to carry: the later of the moment the
graph server stamped it sent (``sent``; the emulator runs on one host, one clock) and the last moment
the worker saw its socket empty (the return of a blocking poll when it waits, the previous look when
it was computing: a streamed task looks between blocks). So a reply that came while the worker
computed is credited with the transfer time that overlapped its compute, from when it was sent.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque

import zmq

from dorylus_py.protocol import Message, ProtocolError, Session
from dorylus_py.protocol.transport import receive
from dorylus_py.worker.link import frame_bytes, link_of, wait_until

_req_ids = itertools.count()


class Channel:
    def __init__(self, sock: zmq.Socket, address: str, session: Session, context=None, accept=None):
        """``accept(msg)``: whether a message that answers no request is for this worker (a lease's task)."""
        self.sock, self.address, self.session = sock, address, session
        self.link = link_of(context)
        self.accept = accept
        self.waiting: set[str] = set()
        self.replies: dict[str, tuple[Message, float]] = {}  # req -> reply, when the link has it all in
        self.pushed: deque[tuple[Message, float]] = deque()  # accepted unasked messages, in order, likewise
        self.quiet = time.time()  # the last moment the socket was seen empty

    def send(self, msg: Message, wait: bool = True, answered: bool = True) -> str | None:
        """Send ``msg``; the request id to take its reply by (``answered``; else None). ``wait``: on a
        capped link it leaves once the link would have carried it out; else at once, its bytes still
        counted before the next message's."""
        req = None
        if answered:
            req = msg.fields["req"] = f"{id(threading.current_thread())}-{next(_req_ids)}"
        frames = self.session.encode(msg, self.address)
        if self.link is not None:
            departs = self.link.departs(frame_bytes(frames), time.time())
            if wait:
                wait_until(departs)
        self.sock.send_multipart(frames, copy=False)
        if answered:
            self.waiting.add(req)
        return req

    def drain(self) -> None:
        """Take every message queued now (without blocking)."""
        while True:
            try:
                frames = receive(self.sock, self.session.limits, zmq.NOBLOCK)
            except zmq.Again:
                break
            except ProtocolError:
                continue  # over the cap: read and let go as it came
            try:
                reply = self.session.decode(frames, self.session.id)
            except ProtocolError:
                continue  # not a reply we can trust: keep waiting for ours
            req = reply.get("req")
            if isinstance(req, str) and req in self.waiting:
                self.waiting.discard(req)
                self.replies[req] = (reply, self._arrival(reply, frames))
            elif self.accept is not None and self.accept(reply):
                self.pushed.append((reply, self._arrival(reply, frames)))
        self.quiet = time.time()

    def _arrival(self, reply: Message, frames) -> float:
        """When the link would have carried ``reply`` in: from the later of the last moment the socket
        was seen empty and the moment the server stamped it sent (``sent``, same host), if it did."""
        if self.link is None:
            return 0.0
        sent = reply.get("sent")
        ready = self.quiet
        if isinstance(sent, float) and sent == sent:
            ready = min(max(ready, sent), time.time())
        return self.link.arrives(frame_bytes(frames), ready)

    def reply(self, req: str, deadline: float) -> Message | None:
        """The reply to ``req`` once the link has carried it; None if none came by ``deadline``
        (``time.monotonic()``)."""
        if not self._until(lambda: req in self.replies, deadline):
            return None
        reply, arrives = self.replies.pop(req)
        wait_until(arrives)
        return reply

    def next(self, deadline: float) -> Message | None:
        """The next accepted unasked message once the link has carried it; None if none came by ``deadline``."""
        if not self._until(lambda: bool(self.pushed), deadline):
            return None
        msg, arrives = self.pushed.popleft()
        wait_until(arrives)
        return msg

    def _until(self, ready, deadline: float) -> bool:
        """Take what comes until ``ready()``; False if it is not by ``deadline`` (``time.monotonic()``)."""
        self.drain()
        while not ready():
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000) + 1):
                return False
            self.quiet = time.time()  # it came just now
            self.drain()
        return True
