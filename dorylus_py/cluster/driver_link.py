"""The driver's end of a job: its ROUTER socket, the server processes it started, and their heartbeats.

Each start of the job draws a nonce (:meth:`DriverLink.begin`) that every message of that start is
bound to (``protocol/session.py``); only a server's ``hello`` comes unbound, since the server learns
the nonce from its ``start``. Servers bind any free port and say ``hello`` with their address (again
every second until started); every message after that comes from an identity the driver knows, and
a message from any other (a process of an earlier start of the job, or a stranger) is dropped.
Servers beat every second on a socket of their own, with the turns their serving loop has made, and
the driver answers each beat; a server not heard from for ``SILENCE_S``, one whose loop has not turned
for the hang timeout, or a started process that exited, is :class:`ServerLost` within seconds.
Nothing a peer sends can raise past :meth:`DriverLink.recv`: messages that fail the job key's MAC or
replay earlier ones are dropped and counted, and so is anything from an identity that is not a
server of this start.

The job key: a one-machine job makes a fresh one (or takes ``DORYLUS_KEY``) and hands it to the
processes it starts in their environment; a ``--cluster`` job reads the one its servers read
(``DORYLUS_KEY``, or the cluster file's ``key_secret``). In a ``--cluster`` job the driver binds the
address the cluster file gives it, and uses CurveZMQ when the file names keys.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import threading
import time
from pathlib import Path

import zmq

from dorylus_py import children
from dorylus_py.awake import awake_now
from dorylus_py.errors import DorylusError
from dorylus_py.jobkey import KEY_ENV, load_job_key, new_key
from dorylus_py.protocol import AuthError, Message, ProtocolError, Session
from dorylus_py.protocol.transport import Inbox, dealer, gate_of, receive, router
from dorylus_py.serving.cluster_spec import ClusterSpec, cluster_curve
from dorylus_py.serving.heartbeat import SILENCE_S
from dorylus_py.serving.node import PARENT_ENV
from dorylus_py.serving.rejections import Rejections
from dorylus_py.scale_model import preexec_for
from dorylus_py.timescale import scaled

log = logging.getLogger(__name__)


class ServerLost(DorylusError):
    """A server process died or went silent; ``deliberate``: it stopped itself with an error line."""

    def __init__(self, message: str, deliberate: bool = False):
        super().__init__(message)
        self.deliberate = deliberate


class DriverLink:
    def __init__(self, run_dir: Path, cluster: ClusterSpec | None = None, hang_timeout_s: float = 60.0):
        self.run_dir, self.cluster, self.hang_timeout_s = run_dir, cluster, hang_timeout_s
        self.ctx = zmq.Context()  # its own: stop() ends it, which is what makes the last stops go out
        if cluster is None:  # everything on this machine
            self._key = load_job_key() if os.environ.get(KEY_ENV) else new_key()
        else:  # servers started elsewhere, from the same cluster file and key
            self._key = load_job_key(cluster.key_secret, cluster.region)
        self.gate = gate_of(self._key, cluster_curve(cluster, self._key))
        self.session = Session(self._key)
        self.rejections = Rejections("driver")
        self.router = router(self.ctx, self.gate)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.inbox = Inbox(self.router, self.session.limits)
        if cluster is None:
            port = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.address = f"tcp://127.0.0.1:{port}"
        else:
            self.address = cluster.driver
            try:
                self.router.bind(cluster.driver)  # its own address, not every interface
            except zmq.ZMQError as e:
                raise DorylusError(f"cannot listen on {cluster.driver} ({e}; is it this machine's address?)") from None
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.identities: dict[str, bytes] = {}  # server name -> identity, of this start of the job
        self.names: dict[bytes, str] = {}
        self.senders: dict[bytes, bytes] = {}  # identity -> the session id it speaks with (replies are signed for it)
        self.heard: dict[str, float] = {}  # server name -> when its last heartbeat came (awake_now())
        self.turned: dict[str, tuple[int, float]] = {}  # server name -> its loop's turns, and when they last moved
        self.expected: set[str] = set()  # names of the servers of this start
        self.retired: set[str] = set()  # servers whose work is done: their deaths no longer matter
        self._held: list = []  # messages that came while the driver waited on a request
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)

    # --- processes -------------------------------------------------------------------------------

    def spawn(self, name: str, module: str, rank: int) -> None:
        log_path = self.run_dir / "logs" / f"{name}.log"
        env = children.env(PYTHONUNBUFFERED="1", **{KEY_ENV: self._key.hex(), PARENT_ENV: str(os.getpid())})
        with open_log(log_path) as out:
            proc = subprocess.Popen(
                children.module(module, "--driver", self.address, "--rank", rank),
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=preexec_for(name),
            )
        self.procs[name] = (proc, log_path)
        self.expected.add(name)

    def check_children(self) -> None:
        for name, (proc, log_path) in self.procs.items():
            code = None if name in self.retired else proc.poll()
            if code is not None:
                tail = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()][-1:]
                why = f": {tail[0].strip()}" if tail else ""
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                raise ServerLost(f"{name} {how}{why} (log: {log_path})", deliberate=code == 2)

    def begin(self) -> str:
        """A new start of the job: a fresh nonce, which every message of this start is bound to from
        now on (the servers learn it from ``start``); returned as hex for the ``start`` messages."""
        nonce = secrets.token_bytes(16)
        self.session = self.session.for_job(nonce)
        return nonce.hex()

    def check_heartbeats(self) -> None:
        self.serve_heartbeats()  # beats queued while this process was starved of CPU are not silence
        now = awake_now()  # nor is the time this process was frozen (dorylus_py/awake.py)
        for name, when in self.heard.items():
            if name not in self.expected or name in self.retired:
                continue
            where = f" at {self.cluster.address(*_role_rank(name))}" if self.cluster else ""
            if now - when > scaled(SILENCE_S):
                raise ServerLost(f"{name}{where} has not been heard from for {scaled(SILENCE_S):.0f} s (presumed dead)")
            turns, moved = self.turned.get(name, (0, now))
            if turns and now - moved > self.hang_timeout_s:
                raise ServerLost(f"{name}{where} is hung: its serving loop has not turned for "
                                 f"{self.hang_timeout_s:.0f} s (--hang-timeout-s)")

    def retire(self, names: list[str]) -> None:
        """Stop watching ``names`` (graph servers once training is over: the weights come from the weight
        servers alone); they are still stopped with the rest."""
        self.retired.update(names)

    def kill_servers(self) -> None:
        """Stop every server of this start at once (a restart follows): whole process groups, so their
        emulated Lambda workers go too; messages still queued from them are dropped."""
        for proc, _ in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc, _ in self.procs.values():
            proc.wait(timeout=30)
        self.procs.clear()
        self._forget_servers()

    def release_servers(self) -> None:
        """Tell every server of this start to drop the job (remote servers go on to wait for the next
        start and say hello again) and forget them; messages still queued from them are dropped."""
        self._stop_all()
        self._forget_servers()

    def _stop_all(self) -> None:
        for ident in self.identities.values():
            try:
                self.router.send_multipart([ident, *self.session.encode(Message("stop"), self.senders[ident])],
                                           zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def stop(self) -> None:
        self.rejections.report()
        self._stop_all()
        deadline = time.monotonic() + 10
        for proc, _ in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()
                proc.wait(timeout=10)
        self.procs.clear()
        # Ending the context waits (up to 2 s: the linger) until the stops still queued have left: a process
        # that exits first loses them, and a server then waits out its 6 s of silence instead of serving the
        # next job. term(), not destroy(): the ZAP handler's thread closes its own socket when told (ETERM).
        self.router.close(2000)
        ending = threading.Thread(target=self.ctx.term, name="driver-context", daemon=True)
        ending.start()
        ending.join(timeout=5)

    def _forget_servers(self) -> None:
        self.identities.clear()
        self.names.clear()
        self.senders.clear()
        self.heard.clear()
        self.turned.clear()
        self.expected.clear()
        self.retired.clear()
        self._held.clear()

    # --- messages --------------------------------------------------------------------------------

    def expect(self, names: list[str]) -> None:
        """The servers of this start (a --cluster job starts none itself)."""
        self.expected.update(names)

    def recv(self, timeout_s: float) -> tuple[str | None, Message]:
        """The next message of a server of this start, as ``(name, message)`` (``hello``: name None
        until known). Answers heartbeats and watches for dead or silent servers meanwhile."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._held:
                return self._held.pop(0)
            if self.router.poll(200):
                got = self._one()
                if got is not None:
                    return got
            self.check_children()
            self.check_heartbeats()
        raise DorylusError(f"no word from the servers for {timeout_s:.0f} s (logs: {self.run_dir / 'logs'})")

    def serve_heartbeats(self) -> None:
        """Answer what has queued up while the driver does something else (a request, a checkpoint); a
        bounded number per call, so that a peer flooding the port cannot keep the driver here."""
        for _ in range(256):
            if not self.router.poll(0):
                return
            got = self._one()
            if got is not None:
                self._held.append(got)

    def _one(self) -> tuple[str | None, Message] | None:
        try:
            frames = self.inbox.recv()
            ident = frames[0].bytes
            msg = self.session.decode(frames[1:], self.address, unbound=frozenset({"hello"}))
        except ProtocolError as e:
            self.rejections.add("unauthenticated" if isinstance(e, AuthError) else "invalid", e)
            return None
        if msg.op == "heartbeat":
            name = f"{msg.get('role')}-{msg.get('rank')}"
            turns = msg.get("turns")
            if name in self.expected and type(turns) is int:
                now = awake_now()
                self.heard[name] = now
                if self.turned.get(name, (None,))[0] != turns:
                    self.turned[name] = (turns, now)
                self._to(ident, Message("heartbeat"), msg.sender)
                return None
        elif msg.op == "hello":
            name = f"{msg.get('role')}-{msg.get('rank')}"
            if self.identities.get(name) == ident and self.senders.get(ident) == msg.sender:
                return None  # it says hello every second until started
            if name in self.expected and name not in self.identities and isinstance(msg.get("address"), str):
                self.identities[name], self.names[ident], self.senders[ident] = ident, name, msg.sender
                return name, msg
        else:
            name = self.names.get(ident)
            if name is not None and msg.sender == self.senders.get(ident):
                return name, msg
        # a stranger, a server of an earlier start, or a second hello for a server (not believed)
        self.rejections.add("invalid", ProtocolError(f"{msg.op} from no server of this start"))
        return None

    def send(self, name: str, msg: Message) -> None:
        ident = self.identities[name]
        self._to(ident, msg, self.senders[ident])

    def _to(self, ident: bytes, msg: Message, sender: bytes) -> None:
        try:
            self.router.send_multipart([ident, *self.session.encode(msg, sender)], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as e:  # the peer is gone: its death is noticed by the checks above
            log.debug("message to a gone peer dropped: %s", e)

    def ask(self, address: str, msg: Message, what: str, timeout_s: float = 30.0) -> Message:
        """A request to a server's ROUTER (weights, state, statistics), answering heartbeats meanwhile."""
        sock = dealer(self.ctx, address, self.gate)
        try:
            msg.fields["req"] = req = secrets.token_hex(8)
            sock.send_multipart(self.session.encode(msg, address), copy=False)
            deadline = time.monotonic() + scaled(timeout_s)
            while time.monotonic() < deadline:
                self.check_children()
                self.check_heartbeats()  # answers what has queued up first
                if not sock.poll(100):
                    continue
                try:
                    reply = self.session.decode(receive(sock, self.session.limits), self.session.id)
                except ProtocolError as e:
                    self.rejections.add("unauthenticated" if isinstance(e, AuthError) else "invalid", e)
                    continue
                if reply.get("req") != req:
                    continue
                if reply.op == "error":
                    raise DorylusError(f"{address} refused the request for {what}: {reply.get('reason')}")
                return reply
            raise DorylusError(f"no reply from {address} for {what} within {timeout_s:.0f} s")
        finally:
            sock.close(0)


def _role_rank(name: str) -> tuple[str, int]:
    role, _, rank = name.rpartition("-")
    return role, int(rank)


def open_log(path: Path):
    """A server's log, for appending, readable by this user alone (0600, also when an earlier start or a
    resumed run made it): what a server logs is no one else's to read (issue 52)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "a")
