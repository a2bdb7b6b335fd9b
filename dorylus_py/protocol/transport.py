"""The sockets every process uses: bounded inbound sizes, and CurveZMQ when the job has keys.

A ROUTER (a server, the driver) refuses frames larger than the codec's limit at the transport
(``MAXMSGSIZE``: the peer is disconnected before its bytes pile up). With :class:`Curve` keys the
ROUTER is a CURVE server with the cluster's secret key and admits only the job's client key
(``zap.py``: a host without the job key is disconnected during the handshake, before its first
frame); every DEALER is a CURVE client that knows the servers' public key and shows the job's client
key, derived from the job key (``zap.client_keys``; a :class:`Curve` carries it).
The traffic is encrypted, the server authenticated, and so is the client; who may *act* is still
decided by the job key's MAC on every message (``session.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from dorylus_py.protocol import zap
from dorylus_py.protocol.session import ENVELOPE_BYTES, Limits


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

    def client(self) -> tuple[bytes, bytes]:
        """The client key pair this process shows, and a server admits."""
        if not (self.client_public and self.client_secret):
            raise ValueError("a CURVE client needs the job's client keys (Curve.of_job)")
        return self.client_public, self.client_secret


def router(ctx: zmq.Context, curve: Curve | None = None, limits: Limits = Limits()) -> zmq.Socket:
    """An unbound ROUTER for a server or the driver."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max(limits.max_frame_bytes, ENVELOPE_BYTES))
    if curve is not None:
        if curve.server_secret is None:
            sock.close(0)
            raise ValueError("a CURVE server needs the secret key")
        sock.zap_domain = zap.admit(ctx, [curve.client()[0]])
        sock.curve_secretkey = curve.server_secret
        sock.curve_publickey = curve.server_public
        sock.curve_server = True
    return sock


def dealer(ctx: zmq.Context, address: str, curve: Curve | None = None, limits: Limits = Limits(),
           linger_ms: int = 0, queue: int = 1000) -> zmq.Socket:
    """A DEALER connected to ``address``: a tensor worker, a peer, or a server's link to the driver.
    ``queue``: messages it holds for the peer before a send waits (ZeroMQ's SNDHWM)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.SNDHWM, queue)
    sock.setsockopt(zmq.MAXMSGSIZE, max(limits.max_frame_bytes, ENVELOPE_BYTES))
    if curve is not None:
        sock.curve_publickey, sock.curve_secretkey = curve.client()
        sock.curve_serverkey = curve.server_public
    sock.connect(address)
    return sock
