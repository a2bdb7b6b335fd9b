"""The sockets every process uses: bounded inbound sizes, and a handshake only the job's key holders pass.

A ROUTER (a server, the driver) refuses frames larger than the codec's limit at the transport
(``MAXMSGSIZE``: the peer is disconnected before its bytes pile up). With :class:`Curve` keys the
ROUTER is a CURVE server with the cluster's secret key and admits only the job's client key
(``zap.py``: a host without the job key is disconnected during the handshake, before its first
frame); every DEALER is a CURVE client that knows the servers' public key and shows the job's client
key, derived from the job key (``zap.client_keys``; a :class:`Curve` carries it).
The traffic is encrypted, the server authenticated, and so is the client; who may *act* is still
decided by the job key's MAC on every message (``session.py``). Without CURVE keys (one-machine jobs, a
cluster file without them) a :class:`Plain` gate does the admitting instead: ZMTP PLAIN with a password
derived from the job key (``zap.plain_password``), unencrypted, so it costs nothing per byte.

Every socket reads a message through :func:`receive`, one frame at a time, counting the frames and their
bytes: a message over the per-message cap (``Limits.max_message_bytes``, 512 MiB unless
``DORYLUS_MAX_MESSAGE_MB`` says otherwise) is dropped frame by frame as it is read, never gathered, and on
a ROUTER its peer is dropped too (:class:`Inbox`: what it sends later is discarded unread). ZeroMQ's own
``MAXMSGSIZE`` is set to the same cap: it is per frame, checked at each frame's header before the frame is
allocated, so one oversized frame costs nothing. What it cannot bound is a message that never ends: ZeroMQ
delivers a multipart message only once its last frame is in, and holds the frames before it, so a peer
that may connect can make a server hold frames (each under the cap) that it never completes. The gate
keeps such a peer out: its handshake comes before any frame (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from collections import OrderedDict

import zmq

from dorylus_py.protocol import zap
from dorylus_py.protocol.messages import AuthError
from dorylus_py.protocol.session import ENVELOPE_BYTES, Limits

DROPPED_PEERS = 4096  # ROUTER identities remembered as dropped (the oldest forgotten first)


@dataclass(frozen=True)
class Curve:
    server_public: bytes  # Z85, the cluster file's curve_public_key
    server_secret: bytes | None = None  # Z85; only processes that bind (servers, the driver) have it
    client_public: bytes = b""  # Z85, the job's client key pair (zap.client_keys of the job key)
    client_secret: bytes = b""

    @classmethod
    def of_job(cls, job_key: bytes, server_public: bytes, server_secret: bytes | None = None) -> "Curve":
        """The keys of a job whose servers have ``server_public``: the client pair derived from ``job_key``."""
        return cls(server_public, server_secret, *zap.client_keys(job_key))

    @classmethod
    def among_peers(cls, job_key: bytes) -> "Curve":
        """The keys of a job of peers, each a server and a client (``zap.peer_server_keys``)."""
        return cls.of_job(job_key, *zap.peer_server_keys(job_key))

    def __repr__(self) -> str:  # never the secrets
        return f"Curve(server_public={self.server_public.decode(errors='replace')})"

    def client(self) -> tuple[bytes, bytes]:
        """The client key pair this process shows, and a server admits."""
        if not (self.client_public and self.client_secret):
            raise ValueError("a CURVE client needs the job's client keys (Curve.of_job)")
        return self.client_public, self.client_secret


@dataclass(frozen=True)
class Plain:
    """The gate of a job without CURVE keys: ZMTP PLAIN, admitting the job's password only."""
    password: bytes  # Z85, zap.plain_password of the job key

    @classmethod
    def of_job(cls, job_key: bytes) -> "Plain":
        return cls(zap.plain_password(job_key))

    def __repr__(self) -> str:  # never the password
        return "Plain(<job password>)"


Gate = Curve | Plain


def gate_of(job_key: bytes, curve: Curve | None) -> Gate:
    """A job's gate: its CURVE keys where it has them, else the PLAIN password of its key."""
    return curve if curve is not None else Plain.of_job(job_key)


def router(ctx: zmq.Context, gate: Gate | None = None, limits: Limits | None = None) -> zmq.Socket:
    """An unbound ROUTER for a server or the driver; ``gate``: who may connect (None: anyone, tests only)."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, frame_cap(limits or Limits()))
    if isinstance(gate, Plain):
        sock.zap_domain = zap.admit(ctx, [gate.password], b"PLAIN")
        sock.plain_server = True
    elif gate is not None:
        if gate.server_secret is None:
            sock.close(0)
            raise ValueError("a CURVE server needs the secret key")
        sock.zap_domain = zap.admit(ctx, [gate.client()[0]])
        sock.curve_secretkey = gate.server_secret
        sock.curve_publickey = gate.server_public
        sock.curve_server = True
    return sock


def dealer(ctx: zmq.Context, address: str, gate: Gate | None = None, limits: Limits | None = None,
           linger_ms: int = 0, queue: int = 1000) -> zmq.Socket:
    """A DEALER connected to ``address``: a tensor worker, a peer, or a server's link to the driver.
    ``queue``: messages it holds for the peer before a send waits (ZeroMQ's SNDHWM)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.SNDHWM, queue)
    sock.setsockopt(zmq.MAXMSGSIZE, frame_cap(limits or Limits()))
    if isinstance(gate, Plain):
        sock.plain_username, sock.plain_password = zap.PLAIN_USER, gate.password
    elif gate is not None:
        sock.curve_publickey, sock.curve_secretkey = gate.client()
        sock.curve_serverkey = gate.server_public
    sock.connect(address)
    return sock


def frame_cap(limits: Limits) -> int:
    """ZeroMQ's ``MAXMSGSIZE`` for ``limits``: no frame may be larger than a whole message may be."""
    return max(min(limits.max_frame_bytes, limits.max_message_bytes), ENVELOPE_BYTES)


class OverCap(AuthError):
    """A message over the per-message cap (bytes or frames): read and dropped frame by frame. ``peer``:
    its sender's ROUTER identity (empty on other sockets)."""

    def __init__(self, message: str, peer: bytes = b""):
        super().__init__(message)
        self.peer = peer


def receive(sock: zmq.Socket, limits: Limits, flags: int = 0, routed: bool = False) -> list:
    """The frames of the next message on ``sock`` (zmq Frames, not copied), read one at a time; raise
    :class:`OverCap` once their running total passes ``limits`` (the rest of the message is read and let
    go as it comes), and ``zmq.Again`` as ``recv`` does. ``routed``: a ROUTER's, whose first frame is the
    peer's identity (not counted)."""
    most_frames, most_bytes = 2 + limits.max_tensors + routed, limits.max_message_bytes
    frames: list | None = []
    total, peer = 0, b""
    frame = sock.recv(flags, copy=False)
    while True:
        if frames is not None:
            total += len(frame) if frames or not routed else 0
            frames.append(frame)
            if total > most_bytes or len(frames) > most_frames:
                peer, frames = (frames[0].bytes if routed else b""), None  # let go of what was read
        if not frame.more:
            break
        frame = sock.recv(copy=False)
    if frames is None:
        raise OverCap(f"a message of more than {most_bytes} bytes or {most_frames} frames (dropped as it came)", peer)
    return frames


class Inbox:
    """A ROUTER's incoming messages, by :func:`receive`, from peers not dropped: a peer that sends a
    message over the cap is remembered (its identity) and what it sends from then on is read and let go."""

    def __init__(self, sock: zmq.Socket, limits: Limits):
        self.sock, self.limits = sock, limits
        self.dropped: OrderedDict[bytes, None] = OrderedDict()

    def recv(self, flags: int = 0) -> list:
        """``[identity, *frames]`` of the next message; :class:`~dorylus_py.protocol.AuthError` (the
        caller counts it) for one over the cap or from a dropped peer; ``zmq.Again`` as ``recv``."""
        try:
            frames = receive(self.sock, self.limits, flags, routed=True)
        except OverCap as e:
            self.dropped[e.peer] = None
            if len(self.dropped) > DROPPED_PEERS:
                self.dropped.popitem(last=False)
            raise OverCap(f"{e}; its peer dropped", e.peer) from None
        if self.dropped and frames[0].bytes in self.dropped:
            raise AuthError("a message from a peer dropped for an earlier message over the cap")
        return frames
