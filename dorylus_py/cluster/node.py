"""What every server process shares: a ROUTER that serves requests, a link to the driver, and a loop
that rejects bad messages and keeps running.

A server binds its ROUTER (port 0 = any free port), says ``hello`` to the driver with its address,
and waits for ``start`` (the job spec and every peer's address). After that the driver may send it
``stop`` at any time. Every wait has a timeout. From ``start`` on, a heartbeat thread tells the driver
every second that the process lives, on a socket of its own (so a long computation in the main thread
does not silence it); a server whose driver has not answered for ``SILENCE_S`` seconds, or whose parent
process changed, exits rather than linger as an orphan, and the driver presumes a server that has
been silent that long dead.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

import zmq

from dorylus_py.errors import DorylusError
from dorylus_py.protocol import Message, ProtocolError, decode, encode

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


class Heartbeat:
    """Tell the driver every ``HEARTBEAT_S`` that this process lives; exit it (code 3, one log line)
    once the driver has not answered for ``silence_s``. Runs on a thread with a socket of its own."""

    def __init__(self, driver: str, token: str, role: str, rank: int, silence_s: float = SILENCE_S):
        self.driver, self.token, self.role, self.rank, self.silence_s = driver, token, role, rank, silence_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.driver)
        beat = encode(Message("heartbeat", {"role": self.role, "rank": self.rank}), self.token)
        heard = time.monotonic()
        try:
            while not self._stop.is_set():
                sock.send_multipart(beat)
                deadline = time.monotonic() + HEARTBEAT_S
                while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000) + 1):
                    try:
                        if decode(sock.recv_multipart(), self.token).op == "heartbeat":
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
    def __init__(self, role: str, rank: int, driver: str, token: str, host: str = "127.0.0.1", port: int = 0,
                 bind_host: str | None = None):
        """Bind ``bind_host`` (default ``host``) on ``port`` (0 = any free one); advertise ``host``."""
        self.role, self.rank, self.token = role, rank, token
        self.ctx = zmq.Context.instance()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        where = "*" if bind_host == "0.0.0.0" else (bind_host or host)
        port = bind(self.router, where, port, f"{role} {rank}")
        self.address = f"tcp://{host}:{port}"
        self.driver = self.ctx.socket(zmq.DEALER)
        self.driver.setsockopt(zmq.LINGER, 1000)
        self.driver.connect(driver)
        self.parent = os.getppid()
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.poller.register(self.driver, zmq.POLLIN)
        self.rejected = 0

    # --- driver link ---------------------------------------------------------------------------

    def handshake(self, timeout_s: float = 120.0) -> Message:
        """Say hello with our address; return the driver's ``start`` message."""
        self.to_driver(Message("hello", {"role": self.role, "rank": self.rank, "address": self.address, "pid": os.getpid()}))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.driver.poll(500):
                msg = decode(self.driver.recv_multipart(copy=False), self.token)
                if msg.op == "start":
                    return msg
                if msg.op == "stop":
                    raise Stopped()
            self.check_parent()
        raise DorylusError(f"{self.role} {self.rank}: no start from the driver within {timeout_s:.0f} s")

    def to_driver(self, msg: Message) -> None:
        self.send(self.driver, msg)

    def send(self, sock: zmq.Socket, msg: Message) -> None:
        """Send ``msg`` on one of this process's sockets (tensor frames without copies)."""
        sock.send_multipart(encode(msg, self.token), copy=False)

    def receive(self, sock: zmq.Socket) -> Message:
        """The next message on ``sock``, checked (raises ProtocolError)."""
        return decode(sock.recv_multipart(copy=False), self.token)

    def check_parent(self) -> None:
        if os.getppid() != self.parent:
            raise DorylusError(f"{self.role} {self.rank}: the driver process is gone")

    # --- serving ---------------------------------------------------------------------------------

    def reply(self, identity: bytes, msg: Message) -> None:
        try:
            self.router.send_multipart([identity, *encode(msg, self.token)], copy=False)
        except zmq.ZMQError as e:  # the requester went away (EHOSTUNREACH): nothing to answer
            log.debug("reply to a gone peer dropped: %s", e)

    def serve_once(self, handle, timeout_ms: int = 100) -> bool:
        """Poll once; dispatch requests to ``handle(identity, msg)``. Returns True if anything came.

        A malformed message, or one ``handle`` rejects with a DorylusError, gets an ``error`` reply
        and is counted; the server keeps running.
        """
        events = dict(self.poller.poll(timeout_ms))
        if self.driver in events:
            msg = decode(self.driver.recv_multipart(copy=False), self.token)
            if msg.op == "stop":
                raise Stopped()
            self.on_driver(msg)
        if self.router not in events:
            self.check_parent()
            return bool(events)
        for _ in range(256):  # drain what is queued, bounded so the driver link stays responsive
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            identity, body = frames[0].bytes, frames[1:]
            msg = None
            try:
                msg = decode(body, self.token)
                handle(identity, msg)
            except (DorylusError, KeyError, TypeError, ValueError, OverflowError) as e:  # ProtocolError included
                # A malformed field surfaces as KeyError/TypeError/ValueError inside a handler.
                self.rejected += 1
                log.warning("%s %d rejected a message: %s", self.role, self.rank, e)
                req = msg.get("req") if msg is not None else None  # the requester stops waiting at once
                self.reply(identity, Message("error", {"reason": str(e), "req": req if isinstance(req, str) else None}))
        return True

    def on_driver(self, msg: Message) -> None:
        """Messages from the driver other than stop; servers override."""

    def close(self) -> None:
        self.router.close(0)
        self.driver.close(1000)


def serve(role: str, build, driver: str, rank: int, host: str = "127.0.0.1", port: int = 0,
          token_env: str = "DORYLUS_TOKEN", bind_host: str | None = None) -> None:
    """Run one server: connect to the driver, get ``start`` (the job spec, and for a weight server the
    state to restore), build the server with ``build(node, start)`` and run it until the driver says stop."""
    token = os.environ.get(token_env)
    if not token:
        raise DorylusError(f"the job token is not set (environment variable {token_env})")
    node = Node(role, rank, driver, token, host, port, bind_host)
    server = heartbeat = None
    try:
        start = node.handshake()
        heartbeat = Heartbeat(driver, token, role, rank)
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
    ap.add_argument("--token-env", default="DORYLUS_TOKEN", help="environment variable holding the job token")
    args = ap.parse_args(argv)
    return run_main(lambda: serve(role, build, args.driver, args.rank, args.host, args.port, args.token_env))


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
