"""What every server process shares: a ROUTER that serves requests, a link to the driver, and a loop
that rejects bad messages and keeps running.

A server binds its ROUTER (port 0 = any free port), says ``hello`` to the driver with its address,
and waits for ``start`` (the job spec and every peer's address). After that the driver may send it
``stop`` at any time. Every wait has a timeout. From ``start`` on, a heartbeat thread tells the driver
every second that the process lives, on a socket of its own (so a long computation in the main thread
does not silence it); a server whose driver has not answered for ``SILENCE_S`` seconds, or whose parent
process changed, exits rather than linger as an orphan, and the driver presumes a server that has
been silent that long dead.

Every message is signed and checked (``protocol/session.py``): requests are signed for the address
they go to, replies for the session that asked (the ``identity`` a handler gets is a :class:`Peer`).
A message that fails its MAC or replays one seen before is dropped unanswered and counted; one that
is authentic but wrong gets an ``error`` reply with its request id; nothing raises past the loop.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

import zmq

from dorylus_py.errors import DorylusError
from dorylus_py.jobkey import load_job_key
from dorylus_py.protocol import AuthError, Message, ProtocolError, Session
from dorylus_py.protocol.transport import Curve, dealer, router

log = logging.getLogger(__name__)
HEARTBEAT_S = 1.0  # a server says it lives this often
SILENCE_S = 6.0  # a process not heard from for this long is presumed dead (well within 10 s)


def bind(sock: zmq.Socket, host: str, port: int, who: str) -> int:
    """Bind ``sock`` on ``host:port`` (0: any free port); return the port, or say who cannot listen."""
    try:
        if port:
            sock.bind(f"tcp://{host}:{port}")
            return port
        return sock.bind_to_random_port(f"tcp://{host}")
    except zmq.ZMQError as e:
        raise DorylusError(f"{who}: cannot listen on {host}:{port} ({e})") from None


def exit_with_parent(code: int = 0) -> None:
    """Exit this process (with ``code``) once its parent is gone: a killed launcher or graph server must
    not leave its workers behind. Checks once a second on a daemon thread."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(code)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def peak_rss_mb() -> float:
    """This process's peak resident memory, MiB (Linux reports KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


class Stopped(Exception):
    """The driver asked this server to stop."""


# What a hostile but authentic message can make a handler raise; all of it is answered, none kills.
REJECTED = (DorylusError, LookupError, TypeError, ValueError, ArithmeticError, AttributeError, RecursionError)


class Peer(tuple):
    """Who sent a request: its ROUTER identity and its verified session id (a reply is signed for it)."""

    __slots__ = ()

    def __new__(cls, route: bytes, sender: bytes):
        return super().__new__(cls, (route, sender))

    route = property(lambda self: self[0])
    sender = property(lambda self: self[1])


class Rejections:
    """Counts refused messages; logs the first few of each kind and then every thousandth."""

    def __init__(self, who: str):
        self.who, self.counts = who, {"unauthenticated": 0, "invalid": 0}

    def add(self, kind: str, error: Exception) -> None:
        self.counts[kind] += 1
        n = self.counts[kind]
        if n <= 5 or n % 1000 == 0:
            log.warning("%s: %s message #%d refused: %s", self.who, kind, n, error)

    def __str__(self) -> str:
        return ", ".join(f"{n} {kind}" for kind, n in self.counts.items())


class Heartbeat:
    """Tell the driver every ``HEARTBEAT_S`` that this process lives; exit it (code 3, one log line)
    once the driver has not answered for ``silence_s``. Runs on a thread with a socket of its own."""

    def __init__(self, driver: str, session: Session, role: str, rank: int, silence_s: float = SILENCE_S,
                 curve: Curve | None = None):
        self.driver, self.session, self.role, self.rank, self.silence_s = driver, session, role, rank, silence_s
        self.curve = curve
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sock = dealer(zmq.Context.instance(), self.driver, self.curve)
        beat = Message("heartbeat", {"role": self.role, "rank": self.rank})
        heard = time.monotonic()
        try:
            while not self._stop.is_set():
                sock.send_multipart(self.session.encode(beat, self.driver))  # a new sequence number each time
                deadline = time.monotonic() + HEARTBEAT_S
                while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000) + 1):
                    try:
                        if self.session.decode(sock.recv_multipart(), self.session.id).op == "heartbeat":
                            heard = time.monotonic()
                    except ProtocolError:
                        pass  # not from our driver: it proves nothing
                if time.monotonic() - heard > self.silence_s and not self._stop.is_set():
                    log.error("%s %d: the driver has not answered for %.0f s; exiting", self.role, self.rank,
                              self.silence_s)
                    logging.shutdown()
                    os._exit(3)
        finally:
            sock.close(0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * HEARTBEAT_S)


class Node:
    def __init__(self, role: str, rank: int, driver: str, key: bytes, host: str = "127.0.0.1", port: int = 0,
                 bind_host: str | None = None, curve: Curve | None = None):
        """Bind ``bind_host`` (default ``host``) on ``port`` (0 = any free one); advertise ``host``. ``key``:
        the job key; ``curve``: the cluster's CurveZMQ keys (None: plain TCP)."""
        self.role, self.rank, self.curve = role, rank, curve
        self.job_key = key  # for the platform's own workers; never sent
        self.session = Session(key)
        self.ctx = zmq.Context.instance()
        self.router = router(self.ctx, curve)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        where = "*" if bind_host == "0.0.0.0" else (bind_host or host)
        port = bind(self.router, where, port, f"{role} {rank}")
        self.address = f"tcp://{host}:{port}"
        self.driver_address = driver
        self._audience: dict[zmq.Socket, str] = {}
        self.driver = self.dealer(driver, linger_ms=1000)
        self.parent = os.getppid()
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.poller.register(self.driver, zmq.POLLIN)
        self.rejections = Rejections(f"{role} {rank}")

    def dealer(self, address: str, linger_ms: int = 0) -> zmq.Socket:
        """A DEALER to ``address`` (a peer, a weight server, the driver); what it sends is signed for it."""
        sock = dealer(self.ctx, address, self.curve, linger_ms=linger_ms)
        self._audience[sock] = address
        return sock

    # --- driver link ---------------------------------------------------------------------------

    def handshake(self, timeout_s: float = 120.0) -> Message:
        """Say hello with our address; return the driver's ``start`` message."""
        self.to_driver(Message("hello", {"role": self.role, "rank": self.rank, "address": self.address, "pid": os.getpid()}))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.driver.poll(500):
                msg = self._from_driver()
                if msg is None:
                    continue
                if msg.op == "start":
                    return msg
                if msg.op == "stop":
                    raise Stopped()
            self.check_parent()
        raise DorylusError(f"{self.role} {self.rank}: no start from the driver within {timeout_s:.0f} s")

    def to_driver(self, msg: Message) -> None:
        self.send(self.driver, msg)

    def send(self, sock: zmq.Socket, msg: Message) -> None:
        """Send ``msg`` on one of this process's DEALERs (tensor frames without copies)."""
        sock.send_multipart(self.session.encode(msg, self._audience[sock]), copy=False)

    def receive(self, sock: zmq.Socket) -> Message | None:
        """The next message on one of this process's DEALERs, checked; None (counted) if it is refused."""
        try:
            return self.session.decode(sock.recv_multipart(copy=False), self.session.id)
        except ProtocolError as e:
            self.rejections.add("unauthenticated" if isinstance(e, AuthError) else "invalid", e)
            return None

    def _from_driver(self) -> Message | None:
        return self.receive(self.driver)

    def check_parent(self) -> None:
        if os.getppid() != self.parent:
            raise DorylusError(f"{self.role} {self.rank}: the driver process is gone")

    # --- serving ---------------------------------------------------------------------------------

    def reply(self, identity: Peer, msg: Message) -> None:
        try:
            self.router.send_multipart([identity.route, *self.session.encode(msg, identity.sender)], zmq.NOBLOCK,
                                       copy=False)
        except zmq.ZMQError as e:  # gone (EHOSTUNREACH), or not reading its replies (EAGAIN): never wait on it
            log.debug("reply to a gone peer dropped: %s", e)

    def serve_once(self, handle, timeout_ms: int = 100) -> bool:
        """Poll once; dispatch requests to ``handle(identity, msg)``. Returns True if anything came.

        A message that fails its MAC or sequence is dropped unanswered; an authentic one that is
        malformed, or that ``handle`` rejects, gets an ``error`` reply; both are counted, and the
        server keeps running.
        """
        events = dict(self.poller.poll(timeout_ms))
        if self.driver in events:
            msg = self._from_driver()
            if msg is not None and msg.op == "stop":
                raise Stopped()
            if msg is not None:
                try:
                    self.on_driver(msg)
                except REJECTED as e:  # an authentic but malformed driver message: nobody to answer
                    self.rejections.add("invalid", e)
        if self.router not in events:
            self.check_parent()
            return bool(events)
        for _ in range(256):  # drain what is queued, bounded so the driver link stays responsive
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            route, body = frames[0].bytes, frames[1:]
            try:
                msg = self.session.decode(body, self.address)
            except AuthError as e:  # not provably from the job: not even an error goes back
                self.rejections.add("unauthenticated", e)
                continue
            except ProtocolError as e:  # authentic but malformed: the request id is unknown
                self.rejections.add("invalid", e)
                self.reply(Peer(route, e.sender), Message("error", {"reason": str(e)[:300], "req": None}))
                continue
            try:
                handle(Peer(route, msg.sender), msg)
            except REJECTED as e:  # a malformed field surfaces as one of these inside a handler
                self.rejections.add("invalid", e)
                req = msg.get("req")  # the requester stops waiting at once
                self.reply(Peer(route, msg.sender), Message("error", {"reason": str(e)[:300],
                                                                      "req": req if isinstance(req, str) else None}))
        return True

    def on_driver(self, msg: Message) -> None:
        """Messages from the driver other than stop; servers override."""

    def close(self) -> None:
        if sum(self.rejections.counts.values()):
            log.warning("%s %d refused messages: %s", self.role, self.rank, self.rejections)
        self.router.close(0)
        self.driver.close(1000)


def use_huge_pages() -> None:
    """Back torch's tensors of 2 MB and more with transparent huge pages, unless the environment says
    otherwise (``THP_MEM_ALLOC_ENABLE=0``). Servers allocate and free tensors of tens of MB each task;
    with 4 KB pages the kernel zeroes every page on first touch: GAT on the 200 k graph (`cpu`, K = 2)
    spent as much time in the kernel as in torch (14 M page faults in 3 epochs; 6.9 M with huge pages,
    epoch 7.1 -> 5.7-6.0 s). Emulated Lambdas inherit it with the environment."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def serve(role: str, build, driver: str, rank: int, host: str = "127.0.0.1", port: int = 0,
          bind_host: str | None = None, key: bytes | None = None, curve: Curve | None = None) -> None:
    """Run one server: connect to the driver, get ``start`` (the job spec, and for a weight server the
    state to restore), build the server with ``build(node, start)`` and run it until the driver says stop.
    ``key``: the job key (default: from the environment, ``jobkey.py``)."""
    use_huge_pages()
    node = Node(role, rank, driver, key or load_job_key(), host, port, bind_host, curve)
    server = heartbeat = None
    try:
        start = node.handshake()
        heartbeat = Heartbeat(driver, node.session, role, rank, curve=curve)
        server = build(node, start)
        server.run()
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        if server is not None and hasattr(server, "close"):
            server.close()
        node.close()


def serve_process(role: str, build, argv=None) -> int:
    """``python -m`` entry point of a server process started by the driver."""
    import argparse

    ap = argparse.ArgumentParser(description=f"dorylus {role} (started by the driver, or by `dorylus {role}`)")
    ap.add_argument("--driver", required=True, help="driver address, tcp://HOST:PORT")
    ap.add_argument("--rank", type=int, required=True, help="this server's index")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind and advertise (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=0, help="port to bind (default: any free port)")
    args = ap.parse_args(argv)  # the job key comes in the environment (DORYLUS_KEY), never on the command line
    return run_main(lambda: serve(role, build, args.driver, args.rank, args.host, args.port))


def run_main(main) -> int:
    """Entry-point wrapper for server processes: one-line errors, exit 2; clean exit on stop."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("dorylus").setLevel(logging.INFO)  # each server's start and end lines
    try:
        main()
    except Stopped:
        return 0
    except (DorylusError, ProtocolError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
