"""CurveZMQ sockets: a CURVE client reaches a CURVE server; a plain one gets nothing through."""

import zmq

from dorylus_py.protocol import Message, Session
from dorylus_py.protocol.transport import Curve, dealer, router

KEY = b"transport test key of 32 bytes.."


def test_curve_server_talks_only_to_curve_clients():
    public, secret = zmq.curve_keypair()
    ctx = zmq.Context.instance()
    server = router(ctx, Curve(public, secret))
    port = server.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    plain, encrypted = dealer(ctx, address), dealer(ctx, address, Curve(public))
    session, peer = Session(KEY), Session(KEY)
    try:
        plain.send_multipart(session.encode(Message("ping"), address))
        assert not server.poll(1000)  # the plain client never completes the handshake: nothing arrives
        encrypted.send_multipart(session.encode(Message("ping", {"n": 1}), address))
        assert server.poll(10_000)
        route, *frames = server.recv_multipart()
        assert peer.decode(frames, address)["n"] == 1
        assert server.getsockopt(zmq.MAXMSGSIZE) == 2**31 - 1  # oversized frames are cut off at the socket
    finally:
        for s in (plain, encrypted, server):
            s.close(0)
