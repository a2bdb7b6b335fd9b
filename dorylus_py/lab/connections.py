"""The Lambda service's door: which connections it holds, for how long, and what it says when one ends badly.

It used to keep a thread per connection with a timeout per read: 512 connections sending a header line every
25 s (no signature needed) shut every new client out for 100 s and more, and each connection reset by its peer
printed a traceback (issue 52). Now:

- a request must arrive whole, request line to last byte of body, within ``REQUEST_S`` of its first byte; a new
  connection must have sent a signed request within ``REQUEST_S`` of its connect. One that has (a *caller*) may
  then wait up to ``IDLE_S`` between requests (a timeout per read, as before, but only that wait is left to it);
- at most ``PER_PEER`` connections from one address and ``MOST`` in all; a newcomer that would pass a cap takes
  the place of the oldest connection that has not sent a signed request yet, of its own address or else of the
  address holding the most. A peer holding connections open therefore cannot keep a caller out, from its own
  address or another, and a caller's connection is never given up for a newcomer;
- a connection that ends badly (reset by its peer, cut at its deadline, given up for a newcomer) is counted, and
  the counts are said in one warning line at most every ``LOG_EVERY_S``, never a traceback.

:class:`Connections` decides (no sockets); :class:`GuardedServer` carries its decisions out.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import ThreadingHTTPServer

from dorylus_py.timescale import scaled

log = logging.getLogger(__name__)
IDLE_S = 60.0  # a caller's connection, between its requests
REQUEST_S = 20.0  # one whole request (6 MiB, the largest event, at 10 Mbit/s takes 5 s); a newcomer's first, from its connect
LOG_EVERY_S = 1.0  # at most one warning line this often


@dataclass
class _Held:
    peer: str
    opened: float
    since: float | None  # when its request's clock started; None: not running (a caller between requests, or waiting on the function)
    caller: bool = False  # it has sent a request signed with the service's credentials


class Connections:
    """The connections held, by peer address, with their clocks. Thread-safe: the accepting thread admits and
    reaps, each connection's thread starts and stops its own clock."""

    def __init__(self, most: int, per_peer: int):
        self.most, self.per_peer = most, per_peer
        self._held: dict[object, _Held] = {}
        self._lock = threading.Lock()

    def admit(self, conn, peer: str, now: float) -> list | None:
        """Take ``conn`` from ``peer``; the connections to let go for it, or None: refused (every place that
        it could take is a caller's). Its clock starts now: its first request must be in and signed in time."""
        with self._lock:
            mine = [c for c, h in self._held.items() if h.peer == peer]
            if len(mine) >= self.per_peer:
                candidates = mine
            elif len(self._held) >= self.most:
                counts = Counter(h.peer for h in self._held.values())
                most = max(counts.values())
                candidates = [c for c, h in self._held.items() if counts[h.peer] == most]
            else:
                candidates = []
            victims = []
            if candidates:
                newcomers = [c for c in candidates if not self._held[c].caller]
                if not newcomers:
                    return None
                victims = [min(newcomers, key=lambda c: self._held[c].opened)]
                del self._held[victims[0]]
            self._held[conn] = _Held(peer, now, now)
            return victims

    def clock(self, conn, now: float) -> None:
        """A request of ``conn`` began arriving (or its answer is going out): its deadline runs from now."""
        with self._lock:
            held = self._held.get(conn)
            if held is not None and held.since is None:
                held.since = now

    def pause(self, conn) -> None:
        """A caller's request is in (the function runs) or answered (the connection idles): no deadline. A
        newcomer's clock runs on until it is a caller."""
        with self._lock:
            held = self._held.get(conn)
            if held is not None and held.caller:
                held.since = None

    def signed(self, conn) -> None:
        """``conn`` sent a request signed with the service's credentials: a caller's, never given up for another."""
        with self._lock:
            if conn in self._held:
                self._held[conn].caller = True

    def overdue(self, now: float, limit_s: float) -> list:
        """Let go of, and return, the connections whose clock has run past ``limit_s``."""
        with self._lock:
            late = [c for c, h in self._held.items() if h.since is not None and now - h.since > limit_s]
            for c in late:
                del self._held[c]
            return late

    def release(self, conn) -> None:
        with self._lock:
            self._held.pop(conn, None)

    def count(self, peer: str | None = None) -> int:
        with self._lock:
            return sum(peer is None or h.peer == peer for h in self._held.values())


class Tally:
    """Connections that ended badly, by how; one warning line at most every ``LOG_EVERY_S``."""

    def __init__(self, who: str):
        self.who, self.counts = who, Counter()
        self._unlogged, self._logged_at = 0, float("-inf")
        self._lock = threading.Lock()

    def add(self, how: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.counts[how] += 1
            self._unlogged += 1
            if now - self._logged_at < LOG_EVERY_S:
                return
            n, self._unlogged, self._logged_at = self._unlogged, 0, now
            so_far = ", ".join(f"{v} {k}" for k, v in sorted(self.counts.items()))
        log.warning("%s: %d connections ended early since the last report (so far: %s)", self.who, n, so_far)


class GuardedServer(ThreadingHTTPServer):
    """A thread per connection, under :class:`Connections`' caps and deadlines (checked on every turn of
    ``serve_forever``, at its ``poll_interval``)."""

    MOST, PER_PEER = 512, 64  # a graph server keeps about ten connections open
    request_queue_size = 128  # the listen backlog (socketserver's 5 made a burst of connects wait a second each)
    daemon_threads = True

    def __init__(self, address, handler, who: str = "lambda service"):
        super().__init__(address, handler)
        self.held = Connections(self.MOST, self.PER_PEER)
        self.ended = Tally(who)
        self._cut: set = set()  # connections this server shut: what their threads meet next is not news

    def verify_request(self, request, client_address) -> bool:
        victims = self.held.admit(request, client_address[0], time.monotonic())
        if victims is None:
            self.ended.add("refused (every place held by callers)")
            return False
        for conn in victims:
            self._shut(conn, "given up for a newcomer")
        return True

    def service_actions(self) -> None:
        for conn in self.held.overdue(time.monotonic(), scaled(REQUEST_S)):
            self._shut(conn, "cut at the request deadline")

    def _shut(self, conn, how: str) -> None:
        """End ``conn`` under its thread's feet: a read returns end of file, a write fails; the thread closes it."""
        self._cut.add(conn)
        self.ended.add(how)
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def shutdown_request(self, request) -> None:
        super().shutdown_request(request)
        self.held.release(request)
        self._cut.discard(request)

    def handle_error(self, request, client_address) -> None:
        """A connection's thread ended on an exception: a socket's error (reset by the peer, a write after a
        cut) is counted, not printed; anything else is a bug, logged with its traceback."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            log.error("%s: bug while serving %s", self.ended.who, client_address[0], exc_info=error)
        elif request not in self._cut:
            self.ended.add("reset by the peer" if isinstance(error, ConnectionError) else f"{type(error).__name__}")
