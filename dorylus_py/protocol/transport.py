"""The sockets every process uses: bounded inbound sizes, and CurveZMQ encryption when the job has keys.

A ROUTER (a server, the driver) refuses frames larger than the codec's limit at the transport
(``MAXMSGSIZE``: the peer is disconnected before its bytes pile up). With :class:`Curve` keys the
ROUTER is a CURVE server with the cluster's secret key, and every DEALER a CURVE client that knows
the servers' public key and makes a throw-away key pair of its own: the traffic is encrypted and
the server authenticated. Who may *act* is still decided by the job key's MAC on every message
(``session.py``), so clients need no registered keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from dorylus_py.protocol.session import ENVELOPE_BYTES, Limits


@dataclass(frozen=True)
class Curve:
    server_public: bytes  # Z85, the cluster file's curve_public_key
    server_secret: bytes | None = None  # Z85; only processes that bind (servers, the driver) have it


def router(ctx: zmq.Context, curve: Curve | None = None, limits: Limits = Limits()) -> zmq.Socket:
    """An unbound ROUTER for a server or the driver."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max(limits.max_frame_bytes, ENVELOPE_BYTES))
    if curve is not None:
        if curve.server_secret is None:
            raise ValueError("a CURVE server needs the secret key")
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
        public, secret = zmq.curve_keypair()
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_serverkey = curve.server_public
    sock.connect(address)
    return sock
