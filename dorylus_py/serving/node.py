"""What every server process shares: a ROUTER that serves requests, a link to the driver, and a loop
that rejects bad messages and keeps running.

A server binds its ROUTER (port 0 = any free port) once, then serves job after job: for each, it says
``hello`` to the driver with its address (again every second until the driver answers, so a server
started before its driver, or waiting between jobs, is found), and waits for ``start`` (the job spec,
every peer's address and the job's nonce). After that the driver may send it ``stop`` at any time,
which ends the job. Every wait has a timeout. From ``start`` on, a heartbeat thread tells the driver
every second that the process lives and how many turns its main loop has made (so a loop stuck in a
send is seen as hung, not alive), on a socket of its own; a server whose driver has not answered for
``SILENCE_S`` seconds, or whose parent process changed, exits rather than linger as an orphan, and the
driver presumes a server that has been silent that long dead.

Every message is signed and checked (``protocol/session.py``): requests are signed for the address
they go to and the job's nonce, replies for the session that asked (the ``identity`` a handler gets is
a :class:`Peer`). Each job gets a fresh session (a new id; nothing stamped before it is accepted), so
nothing captured in an earlier job or process lifetime is accepted in this one. A message that fails
its MAC or replays one seen before is dropped unanswered and counted; one that is authentic but wrong
(a handler raises a :class:`DorylusError`, :class:`ProtocolError` included) gets an ``error`` reply
with its request id; any other exception in a handler is a bug in this program, logged with the op and
sender and the message dropped (``DORYLUS_STRICT=1``, as the tests set, makes it fatal instead);
nothing raises past the loop.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import time

import zmq

from dorylus_py.errors import DorylusError
from dorylus_py.protocol import AuthError, Limits, Message, ProtocolError, Session
from dorylus_py.protocol.transport import Curve, Inbox, dealer, gate_of, receive, router
from dorylus_py.serving.rejections import REJECTED, Rejections
from dorylus_py.timescale import scaled

log = logging.getLogger(__name__)
HELLO_EVERY_S = 1.0  # a server waiting for its job says hello this often
PEER_CAP_BYTES = 4 * 2**30  # tensor bytes sent to one peer and not yet answered: more, and the peer is stuck


def bind(sock: zmq.Socket, host: str, port: int, who: str) -> int:
    """Bind ``sock`` on ``host:port`` (0: any free port); return the port, or say who cannot listen."""
    try:
        if port:
            sock.bind(f"tcp://{host}:{port}")
            return port
        return sock.bind_to_random_port(f"tcp://{host}")
    except zmq.ZMQError as e:
        raise DorylusError(f"{who}: cannot listen on {host}:{port} ({e})") from None


PARENT_ENV = "DORYLUS_PARENT_PID"  # set by a spawner (the driver, the gossip launcher) to its own pid


@functools.cache
def parent_pid() -> int:
    """The process that started this one. A spawner names itself in :data:`PARENT_ENV`, because a child
    that imports torch for seconds may ask only after its parent was killed, when ``getppid()`` already
    names the init process; the name is taken out of the environment, so this process's own children
    do not inherit it."""
    named = os.environ.pop(PARENT_ENV, "")
    return int(named) if named.isdigit() else os.getppid()


def exit_with_parent(code: int = 0) -> None:
    """Exit this process (with ``code``) once its parent is gone, or at once if it already is: a killed
    launcher or graph server must not leave its workers behind. Checks once a second on a daemon thread."""
    parent = parent_pid()

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




class Peer(tuple):
    """Who sent a request: its ROUTER identity and its verified session id (a reply is signed for it)."""

    __slots__ = ()

    def __new__(cls, route: bytes, sender: bytes):
        return super().__new__(cls, (route, sender))

    route = property(lambda self: self[0])
    sender = property(lambda self: self[1])


class ServerNode:
    def __init__(self, role: str, rank: int, driver: str, key: bytes, host: str = "127.0.0.1", port: int = 0,
                 bind_host: str | None = None, curve: Curve | None = None, hang_timeout_s: float = 60.0):
        """Bind ``bind_host`` (default ``host``) on ``port`` (0 = any free one); advertise ``host``. ``key``:
        the job key; ``curve``: the cluster's CurveZMQ keys (None: the PLAIN gate of ``key``); ``hang_timeout_s``: how long
        a send may wait for a peer that does not read (then :class:`PeerStuck`), and the serving loop may
        stand still, before this process gives up (each job sets its own: :meth:`set_hang_timeout`)."""
        self.role, self.rank, self.gate = role, rank, gate_of(key, curve)
        self.job_key = key  # for the platform's own workers; never sent
        self.hang_timeout_s = hang_timeout_s
        self.ctx = zmq.Context.instance()
        self.router = router(self.ctx, self.gate)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.inbox = Inbox(self.router, Limits())
        where = "*" if bind_host == "0.0.0.0" else (bind_host or host)
        port = bind(self.router, where, port, f"{role} {rank}")
        self.address = f"tcp://{host}:{port}"
        self.driver_address = driver
        self._audience: dict[zmq.Socket, str] = {}
        self._sessions: dict[zmq.Socket, Session] = {}  # links that sign with a session of their own
        self._unanswered: dict[zmq.Socket, _Unanswered] = {}  # request/reply links
        self.parent = parent_pid()
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.rejections = Rejections(f"{role} {rank}")
        self.turns = 0  # of the serving loop: the heartbeat reports it, so a stuck loop is seen as hung
        self.driver: zmq.Socket | None = None
        self.new_job()

    def new_job(self) -> None:
        """Before each job: a fresh session (new id, nothing stamped earlier accepted, bound to no job
        until ``start``) and a fresh link to the driver (a new driver process may listen there now)."""
        self.session = Session(self.job_key)
        if self.driver is not None:
            self.poller.unregister(self.driver)
            self.driver.close(0)
        self._audience = {sock: a for sock, a in self._audience.items() if not sock.closed}  # the last job's are
        self._sessions = {sock: s for sock, s in self._sessions.items() if not sock.closed}
        self._unanswered = {sock: q for sock, q in self._unanswered.items() if not sock.closed}
        # a short queue: of the hellos said while no driver listens, few wait to be refused as stale when one
        # comes (ZMQ_IMMEDIATE would queue none, but lost the driver's last messages: its stop, 1 job in 3)
        self.driver = self.dealer(self.driver_address, linger_ms=1000, queue=4)
        self.poller.register(self.driver, zmq.POLLIN)

    def set_hang_timeout(self, seconds: float) -> None:
        """The job's hang timeout, for every send from now on (the driver link's too) and the loop."""
        self.hang_timeout_s = seconds
        for sock in self._audience:
            sock.setsockopt(zmq.SNDTIMEO, self.send_timeout_ms)

    @property
    def send_timeout_ms(self) -> int:
        return max(1, int(self.hang_timeout_s * 1000))

    def dealer(self, address: str, linger_ms: int = 0, queue: int = 1000, answered: bool = False,
               session: Session | None = None) -> zmq.Socket:
        """A DEALER to ``address`` (a peer, a weight server, the driver); what it sends is signed for it.
        ``answered``: the peer answers every message (peers, weight servers): the tensor bytes sent and
        not yet answered are counted, and more than ``PEER_CAP_BYTES`` of them is :class:`PeerStuck`.
        ``session``: sign with that one instead of this node's (a graph server's gradients go with a
        sender id the driver drew, which only the weight servers learn: ``weights/server.py``)."""
        sock = dealer(self.ctx, address, self.gate, linger_ms=linger_ms, queue=queue)
        sock.setsockopt(zmq.SNDTIMEO, self.send_timeout_ms)
        self._audience[sock] = address
        if session is not None:
            self._sessions[sock] = session
        if answered:
            self._unanswered[sock] = _Unanswered()
        return sock

    # --- driver link ---------------------------------------------------------------------------

    def handshake(self, timeout_s: float | None = 120.0) -> Message:
        """Say hello with our address (every second, until the driver answers); return the driver's
        ``start`` message, with this session bound to its job from then on. ``timeout_s`` None: wait
        for a job as long as it takes (a server that serves job after job)."""
        hello = {"role": self.role, "rank": self.rank, "address": self.address, "pid": os.getpid()}
        deadline = None if timeout_s is None else time.monotonic() + scaled(timeout_s)
        every = scaled(HELLO_EVERY_S)
        said = -every
        while deadline is None or time.monotonic() < deadline:
            if time.monotonic() - said >= every:
                said = time.monotonic()
                try:
                    self.driver.send_multipart(self.session.encode(Message("hello", hello), self.driver_address),
                                               zmq.NOBLOCK)
                except zmq.Again:
                    pass  # no driver there yet: the next hello goes when it is
            if self.driver.poll(200):
                msg = self._from_driver()
                if msg is not None and msg.op == "start":
                    try:
                        job = hex16(msg.get("job"), "start: the job nonce")
                    except ProtocolError as e:
                        self.rejections.add("invalid", e)
                        continue
                    self.session = self.session.for_job(job)
                    return msg
                if msg is not None and msg.op == "stop":
                    raise Stopped()
            self.check_parent()
        raise DorylusError(f"{self.role} {self.rank}: no start from the driver within {timeout_s:.0f} s")

    def to_driver(self, msg: Message) -> None:
        self.send(self.driver, msg)

    def send(self, sock: zmq.Socket, msg: Message) -> None:
        """Send ``msg`` on one of this process's DEALERs (tensor frames without copies); a peer that has
        not taken it within the send timeout, or leaves too many bytes unanswered, is :class:`PeerStuck`."""
        out = self._unanswered.get(sock)
        if out is not None:
            size = sum(t.nbytes for t in msg.tensors.values())
            if out.sizes and out.total + size > PEER_CAP_BYTES:
                raise PeerStuck(f"{self.role} {self.rank}: {self._audience[sock]} has not answered {len(out.sizes)} "
                                f"messages of {out.total} bytes")
            out.sent(size)
        try:
            sock.send_multipart(self._sessions.get(sock, self.session).encode(msg, self._audience[sock]), copy=False)
        except zmq.Again:
            raise PeerStuck(f"{self.role} {self.rank}: {self._audience[sock]} has not read a {msg.op} for "
                            f"{self.send_timeout_ms / 1000:.0f} s") from None

    def receive(self, sock: zmq.Socket) -> Message | None:
        """The next message on one of this process's DEALERs, checked; None (counted) if it is refused."""
        session = self._sessions.get(sock, self.session)
        try:
            return session.decode(receive(sock, session.limits), session.id)
        except ProtocolError as e:  # over the cap (read and let go as it came), forged, or malformed
            self.rejections.add("unauthenticated" if isinstance(e, AuthError) else "invalid", e)
            return None
        finally:
            if sock in self._unanswered:  # an answer to the oldest message out (an answer refused too)
                self._unanswered[sock].answered()

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

    def handled(self, handle, msg: Message, *args, answer=None) -> None:
        """Run ``handle(*args, msg)`` for an authentic message: a refusal (:data:`REJECTED`) is counted and
        answered through ``answer(reason)``; anything else is a bug (:meth:`Rejections.bug`), answered
        with "internal error" so that the requester stops waiting."""
        try:
            handle(*args, msg)
        except REJECTED as e:
            self.rejections.add("invalid", e)
            if answer is not None:
                answer(str(e)[:300])
        except Exception as e:  # noqa: BLE001  (a bug: logged, the message dropped, the loop goes on)
            self.rejections.bug(msg.op, msg.sender, e)
            if answer is not None:
                answer("internal error")

    def serve_once(self, handle, timeout_ms: int = 100) -> bool:
        """Poll once; dispatch requests to ``handle(identity, msg)``. Returns True if anything came.

        A message that fails its MAC or sequence is dropped unanswered; an authentic one that is
        malformed, or that ``handle`` rejects, gets an ``error`` reply; both are counted, and the
        server keeps running.
        """
        self.turns += 1
        events = dict(self.poller.poll(timeout_ms))
        if self.driver in events:
            msg = self._from_driver()
            if msg is not None and msg.op == "stop":
                raise Stopped()
            if msg is not None:  # an authentic but malformed driver message: nobody to answer
                self.handled(lambda m: self.on_driver(m), msg)
        if self.router not in events:
            self.check_parent()
            return bool(events)
        for _ in range(256):  # drain what is queued, bounded so the driver link stays responsive
            try:
                frames = self.inbox.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            except AuthError as e:  # over the cap, or from a peer dropped for that
                self.rejections.add("unauthenticated", e)
                continue
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
            peer, req = Peer(route, msg.sender), msg.get("req")
            req = req if isinstance(req, str) else None  # the requester stops waiting at once
            self.handled(handle, msg, peer, answer=lambda why: self.reply(peer, Message("error", {"reason": why,
                                                                                                  "req": req})))
        return True

    def on_driver(self, msg: Message) -> None:
        """Messages from the driver other than stop; servers override."""

    def close(self) -> None:
        self.rejections.report()
        self.router.close(0)
        self.driver.close(1000)


class _Unanswered:
    """The tensor bytes of each message sent on a request/reply link and not answered yet, oldest first."""

    def __init__(self):
        self.sizes: collections.deque[int] = collections.deque()
        self.total = 0

    def sent(self, size: int) -> None:
        self.sizes.append(size)
        self.total += size

    def answered(self) -> None:
        if self.sizes:
            self.total -= self.sizes.popleft()


class PeerStuck(DorylusError):
    """A peer has not taken what this process sends it for the send timeout: this process cannot go on."""


def hex16(value, name: str) -> bytes:
    """16 bytes the driver drew, sent as 32 hex digits (a job nonce, a sender id), checked."""
    if not (isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)):
        raise ProtocolError(f"{name} must be 16 bytes as 32 hex digits")
    return bytes.fromhex(value)
