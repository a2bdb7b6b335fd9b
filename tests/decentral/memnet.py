"""An in-memory network in place of ZeroMQ for ``decentral/node.py`` (its ``transport``): the same inbox and
links as ``decentral/peers.py`` offer, between workers that are threads of one process.

Every message (a request, its answer, a notice; pings too) is copied, as the wire would, and delivered
after a delay of its own, in order between two endpoints (as over one connection); ``delay(src, dst)``
draws it, so a slow peer can be made slow on the network as well as in its compute. A killed worker's
endpoints take and send nothing, ever again. Every delivery is logged as (sender rank, receiver rank, op).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from typing import Callable

import numpy as np

from dorylus_py.awake import awake_now
from dorylus_py.protocol import Message, ProtocolError
from dorylus_py.serving.rejections import REJECTED

log = logging.getLogger(__name__)


class Net:
    def __init__(self, delay: Callable[[int, int], float]):
        self.delay = delay
        self.endpoints: dict[str, tuple[int, queue.SimpleQueue]] = {}  # address -> (rank, its queue)
        self.killed: set[int] = set()
        self.deliveries: list[tuple[int, int, str]] = []
        self._due: list = []  # (when, order, address, item)
        self._last: dict[tuple[str, str], float] = {}  # (from, to) -> when the last message between them is due
        self._order = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._deliver, name="memnet", daemon=True)
        self._thread.start()

    def endpoint(self, rank: int, name: str) -> tuple[str, queue.SimpleQueue]:
        address, inbox = f"mem://{name}", queue.SimpleQueue()
        self.endpoints[address] = (rank, inbox)
        return address, inbox

    def send(self, src: str, dst: str, msg: Message) -> None:
        """Put a copy of ``msg`` on its way from endpoint ``src`` to endpoint ``dst``."""
        (rank, _), (peer, _) = self.endpoints[src], self.endpoints[dst]
        if rank in self.killed:
            return
        copy = Message(msg.op, _copy(msg.fields), {k: np.array(v) for k, v in msg.tensors.items()})
        with self._cv:
            when = max(time.monotonic() + self.delay(rank, peer), self._last.get((src, dst), 0.0))
            self._last[src, dst] = when
            heapq.heappush(self._due, (when, next(self._order), dst, (src, copy)))
            self._cv.notify()

    def kill(self, rank: int) -> None:
        with self._cv:
            self.killed.add(rank)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=10)

    def _deliver(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (not self._due or self._due[0][0] > time.monotonic()):
                    self._cv.wait(None if not self._due else self._due[0][0] - time.monotonic())
                if self._closed:
                    return
                _, _, dst, (src, msg) = heapq.heappop(self._due)
                (sender, _), (receiver, inbox) = self.endpoints[src], self.endpoints[dst]
                if sender in self.killed or receiver in self.killed:
                    continue
                self.deliveries.append((sender, receiver, msg.op))
            inbox.put((src, msg))


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


class MemInbox:
    """``peers.Inbox`` over a :class:`Net`: a thread that answers requests and applies notices at once."""

    def __init__(self, net: Net, rank: int, world: int, key: bytes = b"", host: str = "", bind_host: str | None = None):
        self.net, self.rank, self.world = net, rank, world
        self.address, self._queue = net.endpoint(rank, f"worker-{rank}")
        self.rejected = 0
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, handle) -> None:
        self._thread = threading.Thread(target=self._run, args=(handle,), name=f"inbox-{self.rank}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self, handle) -> None:
        while not self._closing.is_set():
            try:
                src, msg = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            self._serve(handle, src, msg)

    def _serve(self, handle, src: str, msg: Message) -> None:
        """What ``peers.Inbox._serve`` does with a message that passed its MAC."""
        try:
            sender = msg.get("rank")
            if not isinstance(sender, int) or isinstance(sender, bool) or not 0 <= sender < self.world or sender == self.rank:
                raise ProtocolError(f"op {msg.op}: sender rank {sender!r} is not a peer")
            reply = handle(sender, msg)
        except REJECTED as e:
            self.rejected += 1
            reply = Message("error", {"reason": str(e)})
        except Exception:  # noqa: BLE001  (as the real inbox: logged, answered, the thread goes on)
            self.rejected += 1
            log.exception("worker %d: error while handling a message", self.rank)
            reply = Message("error", {"reason": "internal error"})
        if reply is not None and msg.get("id") is not None:
            reply.fields["id"] = msg["id"]
            self.net.send(self.address, src, reply)


class MemLinks:
    """``peers.Links`` over a :class:`Net`: numbered requests, their answers as they come, bounded waits."""

    _names = itertools.count()

    def __init__(self, net: Net, rank: int, key: bytes, addresses: list[str], give_up: Callable[[], bool] = lambda: False):
        self.net, self.rank, self.addresses, self.give_up = net, rank, addresses, give_up
        self.address, self._answers = net.endpoint(rank, f"links-{rank}-{next(self._names)}")
        self.next_id = 0

    def tell(self, peer: int, op: str, fields: dict | None = None, tensors: dict | None = None) -> None:
        self.net.send(self.address, self.addresses[peer], Message(op, {"rank": self.rank, **(fields or {})}, tensors or {}))

    def post(self, peer: int, op: str, fields: dict | None = None, tensors: dict | None = None) -> int:
        self.next_id += 1
        self.tell(peer, op, {**(fields or {}), "id": self.next_id}, tensors)
        return self.next_id

    def collect(self, wait_s: float = 0.0) -> list[tuple[int, Message]]:
        out = []
        try:
            out.append(self._answers.get(timeout=wait_s) if wait_s > 0 else self._answers.get_nowait())
            while True:
                out.append(self._answers.get_nowait())
        except queue.Empty:
            pass
        return [(self.addresses.index(src), msg) for src, msg in out]

    def ask(self, peer: int, op: str, fields: dict | None = None, tensors: dict | None = None,
            timeout_s: float = 5.0) -> Message | None:
        return self.ask_all([peer], op, fields, tensors, timeout_s)[peer]

    def ask_all(self, peers: list[int], op: str, fields: dict | None = None, tensors: dict | None = None,
                timeout_s: float = 5.0) -> dict[int, Message | None]:
        asked = {self.post(p, op, fields, tensors): p for p in peers}
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
        pass
