"""Who may connect to a server: the job's own CURVE client key, or its PLAIN password, checked by a ZAP handler.

CurveZMQ encrypts and authenticates the *server*; which clients may finish the handshake is left to
a ZAP handler (RFC 27) in the server's zmq context, asked once per connection after the client has
proved that it holds the secret key of the public key it shows. Without one, any client key is let in.

Every process of a job derives the same client key pair from the job key (:func:`client_keys`: the
secret is an HMAC of the job key under a label of its own, so it reveals nothing of the key): the
driver, the servers, and every Lambda, which has the job key from its environment or Secrets
Manager anyway. :func:`admit` starts one handler per context (``inproc://zeromq.zap.01``) and registers
the keys a server socket lets in under a ZAP domain named after them; the handler answers 200 for
those keys and 400 for every other, so a host without the job key is disconnected before its first
frame (its socket sees ``EVENT_HANDSHAKE_FAILED_AUTH``). Refusals are counted; the first few are
logged with the peer's address. A request the handler cannot parse is refused too; nothing a peer
shows it can raise past its loop.

Where CURVE is off (one-machine jobs, a cluster file without ``curve_public_key``) every server socket is
a ZMTP PLAIN server instead: a client shows a password derived from the job key (:func:`plain_password`,
an HMAC under a label of its own), checked here, so a peer without the job key is again refused in the
handshake, before its first frame. Nothing is encrypted (no cost per byte); the password crosses the wire
in clear, so on a network it keeps out only those who cannot read the traffic, and it reveals nothing of
the job key (messages are still signed with the key itself).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading

import zmq
from zmq.utils import z85

log = logging.getLogger(__name__)
ENDPOINT = "inproc://zeromq.zap.01"
LABEL = b"dorylus CurveZMQ client key v1"
PEER_LABEL = b"dorylus CurveZMQ peer server key v1"
PLAIN_LABEL = b"dorylus ZMTP PLAIN password v1"
PLAIN_USER = b"dorylus"


def client_keys(job_key: bytes) -> tuple[bytes, bytes]:
    """The job's CurveZMQ client key pair ``(public, secret)``, Z85: the same for every key holder."""
    return _pair(job_key, LABEL)


def peer_server_keys(job_key: bytes) -> tuple[bytes, bytes]:
    """The server key pair of a job whose every process is a server (the decentralised workers, whose
    addresses are not in a cluster file with a public key): the same for every key holder, so the wire
    between them is encrypted and only the job's key holders get through the handshake."""
    return _pair(job_key, PEER_LABEL)


def plain_password(job_key: bytes) -> bytes:
    """The job's ZMTP PLAIN password (Z85, 40 characters): the same for every key holder."""
    return _derived(job_key, PLAIN_LABEL)


def _pair(job_key: bytes, label: bytes) -> tuple[bytes, bytes]:
    secret = _derived(job_key, label)
    return zmq.curve_public(secret), secret


def _derived(job_key: bytes, label: bytes) -> bytes:
    """An HMAC of the job key under ``label``, Z85: a secret of its own that reveals nothing of the key."""
    return z85.encode(hmac.digest(job_key, label, "sha256"))


class ZapHandler:
    """Answers the ZAP requests of one zmq context on a thread of its own."""

    def __init__(self, ctx: zmq.Context):
        self.allowed: dict[bytes, tuple[bytes, frozenset[bytes]]] = {}  # ZAP domain -> (mechanism, what it admits)
        self.admitted = self.refused = 0
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ENDPOINT)
        self._thread = threading.Thread(target=self._run, name="zap", daemon=True)
        self._thread.start()

    def register(self, keys, mechanism: bytes = b"CURVE") -> bytes:
        """Admit ``keys`` (Z85 CURVE public keys, or PLAIN passwords) to sockets of the returned ZAP domain."""
        keys = frozenset(keys)
        domain = b"dorylus-" + hashlib.sha256(mechanism + b"".join(sorted(keys))).hexdigest()[:16].encode()
        self.allowed[domain] = (mechanism, keys)
        return domain

    def _run(self) -> None:
        try:
            while True:
                frames = self._sock.recv_multipart()
                self._sock.send_multipart(self.answer(frames))
        except zmq.ContextTerminated:
            pass
        finally:
            self._sock.close(0)
            with _lock:
                if _handlers.get(id(self._sock.context)) is self:
                    del _handlers[id(self._sock.context)]

    def answer(self, frames: list[bytes]) -> list[bytes]:
        """The reply to one ZAP request: ``[version, request id, status, text, user id, metadata]``."""
        request_id = frames[1] if len(frames) > 1 else b""
        if len(frames) < 6 or frames[0] != b"1.0":
            return self._refuse(request_id, "malformed ZAP request", b"?")
        _, _, domain, address, _identity, mechanism, *credentials = frames
        if domain not in self.allowed:  # a NULL socket is not this handler's to gate; any other must be registered
            return [b"1.0", request_id, b"200", b"OK", b"", b""] if mechanism == b"NULL" else \
                self._refuse(request_id, "unknown ZAP domain", address)
        gated, admitted = self.allowed[domain]
        if mechanism != gated:
            return self._refuse(request_id, f"{mechanism.decode(errors='replace')} where {gated.decode()} is required",
                                address)
        if mechanism == b"CURVE":
            shown = z85.encode(credentials[0]) if credentials and len(credentials[0]) == 32 else b""
        else:  # PLAIN: [username, password]
            shown = credentials[1] if len(credentials) == 2 and credentials[0] == PLAIN_USER else b""
        if shown and any(hmac.compare_digest(shown, k) for k in admitted):
            self.admitted += 1
            return [b"1.0", request_id, b"200", b"OK", b"", b""]
        return self._refuse(request_id, "client key not admitted" if mechanism == b"CURVE" else "wrong password",
                            address)

    def _refuse(self, request_id: bytes, why: str, address: bytes) -> list[bytes]:
        self.refused += 1
        if self.refused <= 5 or self.refused % 1000 == 0:
            log.warning("refused a connection from %s (%s; %d refused so far)", address.decode(errors="replace"),
                        why, self.refused)
        return [b"1.0", request_id, b"400", why.encode(), b"", b""]


_handlers: dict[int, ZapHandler] = {}
_lock = threading.Lock()


def admit(ctx: zmq.Context, keys, mechanism: bytes = b"CURVE") -> bytes:
    """Make sure ``ctx`` has a ZAP handler; admit ``keys`` (CURVE public keys or PLAIN passwords) there;
    return the ZAP domain to give a socket."""
    with _lock:
        handler = _handlers.get(id(ctx))
        if handler is None:
            handler = _handlers[id(ctx)] = ZapHandler(ctx)
        return handler.register(keys, mechanism)


def handler_of(ctx: zmq.Context) -> ZapHandler | None:
    return _handlers.get(id(ctx))
