"""ZeroMQ between decentralised workers: one receive thread per worker that answers at once, and one set
of outgoing links per thread that asks.

Every worker binds one ROUTER (:class:`Inbox`), served by its own thread: a request (steal, mix,
snapshot, ping) is answered from the worker's state under a short lock, without waiting for its
training loop or for anybody else; a notice (report, dead, row, average, stop) is applied and not
answered. Each thread that talks to peers has its own :class:`Links` (ZeroMQ sockets are not shared
between threads): a DEALER per peer, requests numbered and matched to their answers, every wait bounded,
a late answer dropped. A peer's message is checked (its MAC with the job key and its sequence number,
``protocol/session.py``; then its sender rank, then by the handler its fields and tensor shapes) before
it is used; one that fails the MAC is dropped unanswered; nothing a peer sends can raise past the
receive loop.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import zmq

from dorylus_py.awake import awake_now
from dorylus_py.protocol import AuthError, Message, ProtocolError, Session
from dorylus_py.protocol.transport import Curve, dealer, receive, router
from dorylus_py.protocol.transport import Inbox as CappedInbox
from dorylus_py.serving.node import bind
from dorylus_py.serving.rejections import REJECTED, report_bug

log = logging.getLogger(__name__)

Handler = Callable[[int, Message], "Message | None"]  # (sender rank, message) -> answer (requests) or None


class Inbox:
    def __init__(self, rank: int, world: int, key: bytes, host: str = "127.0.0.1", bind_host: str | None = None):
        """Bind on ``bind_host`` (default ``host``), any free port; peers reach it at :attr:`address`."""
        self.rank, self.world, self.session = rank, world, Session(key)
        self.router = router(zmq.Context.instance(), Curve.among_peers(key))  # encrypted, key holders only
        self.inbox = CappedInbox(self.router, self.session.limits)
        where = "*" if bind_host == "0.0.0.0" else (bind_host or host)
        self.address = f"tcp://{host}:{bind(self.router, where, 0, f'worker {rank}')}"
        self.rejected = 0
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, handle: Handler) -> None:
        self._thread = threading.Thread(target=self._run, args=(handle,), name="inbox", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.router.close(0)

    def _run(self, handle: Handler) -> None:
        while not self._closing.is_set():
            if self.router.poll(100):
                try:  # frame by frame under the message cap; a peer over it is dropped
                    frames = self.inbox.recv()
                except AuthError as e:
                    self.rejected += 1
                    log.debug("worker %d dropped a message: %s", self.rank, e)
                    continue
                self._serve(handle, frames[0].bytes, frames[1:])

    def _serve(self, handle: Handler, identity: bytes, body) -> None:
        msg, reply = None, None
        try:
            msg = self.session.decode(body, self.address)
            sender = msg.get("rank")
            if not isinstance(sender, int) or isinstance(sender, bool) or not 0 <= sender < self.world or sender == self.rank:
                raise ProtocolError(f"op {msg.op}: sender rank {sender!r} is not a peer")
            reply = handle(sender, msg)
        except AuthError as e:  # not from the job: not even an error goes back
            self.rejected += 1
            log.debug("worker %d dropped a message: %s", self.rank, e)
            return
        except REJECTED as e:  # ProtocolError included
            self.rejected += 1
            log.warning("worker %d rejected a message: %s", self.rank, e)
            reply = Message("error", {"reason": str(e)})
        except Exception as e:  # noqa: BLE001  (a bug must not take the receive thread down with it)
            self.rejected += 1
            report_bug(f"worker {self.rank}", msg.op if msg else "a message", msg.sender if msg else b"", e)
            reply = Message("error", {"reason": "internal error"})
        request_id = msg.get("id") if msg is not None else None
        if reply is None or request_id is None:  # notices are not answered
            return
        reply.fields["id"] = request_id
        try:
            self.router.send_multipart([identity, *self.session.encode(reply, msg.sender)], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as e:
            log.debug("answer to a gone peer dropped: %s", e)


class Links:
    def __init__(self, rank: int, key: bytes, addresses: list[str], give_up: Callable[[], bool] = lambda: False):
        """``give_up()`` true: pending waits end at once (the job is stopping)."""
        self.rank, self.session, self.addresses, self.give_up = rank, Session(key), addresses, give_up
        self.curve = Curve.among_peers(key)
        self.socks: dict[int, zmq.Socket] = {}
        self.peer_of: dict[zmq.Socket, int] = {}
        self.poller = zmq.Poller()
        self.next_id = 0

    def _sock(self, peer: int) -> zmq.Socket:
        if peer not in self.socks:
            # LINGER: notices sent just before this worker exits (stop) still go
            sock = dealer(zmq.Context.instance(), self.addresses[peer], self.curve, linger_ms=1000)
            self.socks[peer], self.peer_of[sock] = sock, peer
            self.poller.register(sock, zmq.POLLIN)
        return self.socks[peer]

    def _send(self, peer: int, op: str, fields: dict | None, tensors: dict | None) -> bool:
        msg = Message(op, {"rank": self.rank, **(fields or {})}, tensors or {})
        try:
            self._sock(peer).send_multipart(self.session.encode(msg, self.addresses[peer]), zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:  # its queue is full: it has not read for a long time, it is as good as gone
            return False

    def tell(self, peer: int, op: str, fields: dict | None = None, tensors: dict | None = None) -> None:
        """A notice: sent, not answered, never waited on."""
        self._send(peer, op, fields, tensors)

    def post(self, peer: int, op: str, fields: dict | None = None, tensors: dict | None = None) -> int:
        """Send a request without waiting for its answer (:meth:`collect` brings it); its id, or -1 if it
        could not even be queued."""
        self.next_id += 1
        return self.next_id if self._send(peer, op, {**(fields or {}), "id": self.next_id}, tensors) else -1

    def collect(self, wait_s: float = 0.0) -> list[tuple[int, Message]]:
        """The answers that have come, as (peer, answer); waits up to ``wait_s`` for the first."""
        out: list[tuple[int, Message]] = []
        for sock, _ in self.poller.poll(wait_s * 1000):
            while True:
                try:
                    frames = receive(sock, self.session.limits, zmq.NOBLOCK)
                except zmq.Again:
                    break
                except ProtocolError as e:  # over the message cap (OverCap): read and let go
                    log.warning("worker %d dropped an answer: %s", self.rank, e)
                    continue
                try:
                    out.append((self.peer_of[sock], self.session.decode(frames, self.session.id)))
                except ProtocolError as e:
                    log.warning("worker %d dropped a bad answer: %s", self.rank, e)
        return out

    def ask(self, peer: int, op: str, fields: dict | None = None, tensors: dict | None = None,
            timeout_s: float = 5.0) -> Message | None:
        """``peer``'s answer, or None if none came within ``timeout_s`` (or the job is stopping)."""
        return self.ask_all([peer], op, fields, tensors, timeout_s)[peer]

    def ask_all(self, peers: list[int], op: str, fields: dict | None = None, tensors: dict | None = None,
                timeout_s: float = 5.0) -> dict[int, Message | None]:
        """Ask every one of ``peers`` at once; their answers, None for each that gave none in time.
        Answers to other requests (late ones) are dropped."""
        asked = {self.post(p, op, fields, tensors): p for p in peers}
        asked.pop(-1, None)
        answers: dict[int, Message | None] = dict.fromkeys(peers)
        deadline = awake_now() + timeout_s  # this process's running time: a freeze of ours is not their silence
        while asked and not self.give_up():
            left = deadline - awake_now()
            if left <= 0:
                break
            for peer, reply in self.collect(min(0.05, left)):
                if asked.get(reply.get("id")) == peer:
                    answers[asked.pop(reply["id"])] = reply
        return answers

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close(0)
        self.socks.clear()
