"""The driver's end of a job: its ROUTER socket, the server processes it started, and their heartbeats.

Servers bind any free port and say ``hello`` with their address; every message after that comes from
an identity the driver knows, and a message from any other (a process of an earlier start of the
job, or a stranger) is dropped. Servers beat every second on a socket of their own and the driver
answers each beat; a server not heard from for ``SILENCE_S``, or a started process that exited, is
:class:`ServerLost` within seconds. Nothing a peer sends can raise past :meth:`DriverLink.recv`.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import zmq

from dorylus_py.cluster.node import SILENCE_S
from dorylus_py.cluster.spec import ClusterSpec
from dorylus_py.errors import DorylusError
from dorylus_py.protocol import Message, ProtocolError, decode, encode

log = logging.getLogger(__name__)


class ServerLost(DorylusError):
    """A server process died or went silent; ``deliberate``: it stopped itself with an error line."""

    def __init__(self, message: str, deliberate: bool = False):
        super().__init__(message)
        self.deliberate = deliberate


class DriverLink:
    def __init__(self, run_dir: Path, cluster: ClusterSpec | None = None):
        self.run_dir, self.cluster = run_dir, cluster
        self.ctx = zmq.Context.instance()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if cluster is None:  # everything on this machine
            self.token = secrets.token_hex(16)
            port = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.address = f"tcp://127.0.0.1:{port}"
        else:  # servers started elsewhere from the same cluster file and token
            self.token = os.environ.get("DORYLUS_TOKEN", "")
            if not self.token:
                raise DorylusError("a --cluster job needs the shared job token in DORYLUS_TOKEN")
            self.address = cluster.driver
            try:
                self.router.bind(f"tcp://*:{ClusterSpec.host_port(cluster.driver)[1]}")
            except zmq.ZMQError as e:
                raise DorylusError(f"cannot listen on {cluster.driver} ({e})") from None
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.identities: dict[str, bytes] = {}  # server name -> identity, of this start of the job
        self.names: dict[bytes, str] = {}
        self.heard: dict[str, float] = {}  # server name -> when its last heartbeat came
        self.expected: set[str] = set()  # names of the servers of this start
        self._held: list = []  # messages that came while the driver waited on a request
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)

    # --- processes -------------------------------------------------------------------------------

    def spawn(self, name: str, module: str, rank: int) -> None:
        log_path = self.run_dir / "logs" / f"{name}.log"
        env = dict(os.environ, DORYLUS_TOKEN=self.token, PYTHONUNBUFFERED="1")
        with open(log_path, "a") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, "--driver", self.address, "--rank", str(rank)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        self.procs[name] = (proc, log_path)
        self.expected.add(name)

    def check_children(self) -> None:
        for name, (proc, log_path) in self.procs.items():
            code = proc.poll()
            if code is not None:
                tail = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()][-1:]
                why = f": {tail[0].strip()}" if tail else ""
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                raise ServerLost(f"{name} {how}{why} (log: {log_path})", deliberate=code == 2)

    def check_heartbeats(self) -> None:
        now = time.monotonic()
        for name, when in self.heard.items():
            if name in self.expected and now - when > SILENCE_S:
                where = f" at {self.cluster.address(*_role_rank(name))}" if self.cluster else ""
                raise ServerLost(f"{name}{where} has not been heard from for {SILENCE_S:.0f} s (presumed dead)")

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

    def stop(self) -> None:
        for ident in self.identities.values():
            try:
                self.router.send_multipart([ident, *encode(Message("stop"), self.token)], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
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
        self.router.close(0)

    def _forget_servers(self) -> None:
        self.identities.clear()
        self.names.clear()
        self.heard.clear()
        self.expected.clear()
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
        """Answer what has queued up while the driver does something else (a request, a checkpoint)."""
        while self.router.poll(0):
            got = self._one()
            if got is not None:
                self._held.append(got)

    def _one(self) -> tuple[str | None, Message] | None:
        frames = self.router.recv_multipart(copy=False)
        ident = frames[0].bytes
        try:
            msg = decode(frames[1:], self.token)
        except ProtocolError as e:
            log.debug("dropped a message the driver cannot accept: %s", e)
            return None
        if msg.op == "heartbeat":
            name = f"{msg.get('role')}-{msg.get('rank')}"
            if name in self.expected:
                self.heard[name] = time.monotonic()
                self._to(ident, Message("heartbeat"))
            return None
        if msg.op == "hello":
            name = f"{msg.get('role')}-{msg.get('rank')}"
            if name not in self.expected or not isinstance(msg.get("address"), str):
                return None
            self.identities[name], self.names[ident] = ident, name
            return name, msg
        name = self.names.get(ident)
        return None if name is None else (name, msg)

    def send(self, name: str, msg: Message) -> None:
        self._to(self.identities[name], msg)

    def _to(self, ident: bytes, msg: Message) -> None:
        try:
            self.router.send_multipart([ident, *encode(msg, self.token)], copy=False)
        except zmq.ZMQError as e:  # the peer is gone: its death is noticed by the checks above
            log.debug("message to a gone peer dropped: %s", e)

    def ask(self, address: str, msg: Message, what: str, timeout_s: float = 30.0) -> Message:
        """A request to a server's ROUTER (weights, state, statistics), answering heartbeats meanwhile."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        try:
            msg.fields["req"] = req = secrets.token_hex(8)
            sock.send_multipart(encode(msg, self.token))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                self.serve_heartbeats()
                self.check_children()
                self.check_heartbeats()
                if not sock.poll(100):
                    continue
                try:
                    reply = decode(sock.recv_multipart(), self.token)
                except ProtocolError:
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
