"""Gated sockets: a CURVE client with the job's client key reaches a CURVE server; a plain client, or a
CURVE client with any other key, gets nothing through (refused in the handshake, by ZAP). Without CURVE,
a PLAIN server admits the job's password only."""

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from dorylus_py.protocol import AuthError, Limits, Message, Session, zap
from dorylus_py.protocol.transport import Curve, Inbox, OverCap, Plain, dealer, router

KEY = b"transport test key of 32 bytes.."


def job_curve(key: bytes = KEY, server: bool = True) -> Curve:
    """The server keys of a test cluster, and the client keys of job ``key``."""
    public, secret = job_curve.server
    return Curve(public, secret if server else None, *zap.client_keys(key))


job_curve.server = zmq.curve_keypair()


def serve():
    ctx = zmq.Context.instance()
    server = router(ctx, job_curve())
    return server, f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"


def watched_client(ctx, address: str, keys: tuple[bytes, bytes]):
    """A CURVE DEALER with ``keys``, and a monitor attached before it connects."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_publickey, sock.curve_secretkey = keys
    sock.curve_serverkey = job_curve.server[0]
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                      | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    sock.connect(address)
    return sock, monitor


def handshake_of(monitor: zmq.Socket, timeout_s: float = 30) -> int:
    """The first handshake outcome a client's monitor reports (an event number)."""
    assert monitor.poll(timeout_s * 1000), "no handshake within the deadline"
    return recv_monitor_message(monitor)["event"]


def test_curve_server_talks_only_to_curve_clients():
    server, address = serve()
    plain, encrypted = dealer(server.context, address), dealer(server.context, address, job_curve(server=False))
    session, peer = Session(KEY), Session(KEY)
    try:
        plain.send_multipart(session.encode(Message("ping"), address))
        assert not server.poll(1000)  # the plain client never completes the handshake: nothing arrives
        encrypted.send_multipart(session.encode(Message("ping", {"n": 1}), address))
        assert server.poll(10_000)
        route, *frames = server.recv_multipart()
        assert peer.decode(frames, address)["n"] == 1
        assert server.getsockopt(zmq.MAXMSGSIZE) == Limits().max_message_bytes  # frames over the message cap: cut off
    finally:
        for s in (plain, encrypted, server):
            s.close(0)


def test_a_client_key_the_job_did_not_derive_is_refused_before_its_first_frame():
    """ZAP: a host that knows the servers' public key (it is in the cluster file) but not the job key
    cannot make up an admitted client key; its handshake fails and what it queued never arrives."""
    server, address = serve()
    ctx = server.context
    refused_before = zap.handler_of(ctx).refused
    stranger, stranger_events = watched_client(ctx, address, zmq.curve_keypair())  # a random key pair
    other_job, other_events = watched_client(ctx, address, zap.client_keys(b"another job's key, 32 bytes...."))
    member = dealer(ctx, address, job_curve(server=False))
    try:
        assert handshake_of(stranger_events) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        assert handshake_of(other_events) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        for sock in (stranger, other_job):  # queued: it would go the moment a handshake succeeded
            try:
                sock.send_multipart([b"first frame of a refused client"], zmq.NOBLOCK)
            except zmq.Again:  # no pipe just now (libzmq dropped the refused one): nothing queued at all
                pass
        member.send_multipart([b"from the job"])
        assert server.poll(10_000)
        assert server.recv_multipart()[1:] == [b"from the job"]
        assert not server.poll(200)
        assert zap.handler_of(ctx).refused >= refused_before + 2
    finally:
        for s in (stranger, other_job, member, server, stranger_events, other_events):
            s.close(0)


def test_every_key_holder_derives_the_same_client_key():
    from dorylus_py.protocol import Session

    assert zap.client_keys(KEY) == zap.client_keys(bytes(KEY))
    assert zap.client_keys(KEY)[0] != zap.client_keys(KEY[::-1])[0]
    with pytest.raises(ValueError, match="needs the job's client keys"):
        Curve(job_curve.server[0]).client()
    assert Curve.of_job(KEY, job_curve.server[0]).client() == zap.client_keys(KEY)
    assert Session(KEY).curve_client_keys() == zap.client_keys(KEY)  # what a Lambda shows, from its session


def test_the_zap_handler_refuses_what_it_cannot_parse():
    handler = zap.handler_of(zmq.Context.instance()) or zap.ZapHandler(zmq.Context.instance())
    for frames in ([], [b"1.0"], [b"2.0", b"id", b"d", b"a", b"i", b"CURVE", b"k" * 32],
                   [b"1.0", b"id", b"d", b"a", b"i", b"CURVE"], [b"1.0", b"id", b"unknown", b"a", b"i", b"CURVE", b"k" * 32]):
        assert handler.answer(frames)[2] == b"400"


def test_a_message_over_the_cap_is_let_go_frame_by_frame_and_its_peer_dropped():
    """ZeroMQ's MAXMSGSIZE is per frame: frames each under the cap but over it together are counted as
    they are read; the message is let go, and so is whatever that peer sends later. Another peer is served."""
    limits = Limits(max_message_bytes=2**20)
    ctx = zmq.Context.instance()
    server = router(ctx, limits=limits)
    address = f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"
    inbox, greedy, other = Inbox(server, limits), dealer(ctx, address), dealer(ctx, address)
    try:
        assert server.getsockopt(zmq.MAXMSGSIZE) == 2**20
        greedy.send_multipart([bytes(600_000)] * 3)
        greedy.send_multipart([b"after"])
        assert server.poll(10_000)
        with pytest.raises(OverCap, match="its peer dropped"):
            inbox.recv()
        assert server.poll(10_000)
        with pytest.raises(AuthError, match="peer dropped"):
            inbox.recv()
        other.send_multipart([b"a", bytes(600_000)])
        assert server.poll(10_000) and [f.bytes[:1] for f in inbox.recv()[1:]] == [b"a", b"\0"]
    finally:
        for s in (greedy, other, server):
            s.close(0)


def plain_server(key: bytes = KEY):
    server = router(zmq.Context.instance(), Plain.of_job(key))
    return server, f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"


def test_without_curve_only_the_jobs_password_gets_through_the_handshake():
    """The gate of jobs without CURVE keys (issue 40): ZMTP PLAIN with a password derived from the job key.
    A NULL client (no credentials at all), a PLAIN client with another job's password and a CURVE client
    get nothing through; the job's own password does, unencrypted."""
    server, address = plain_server()
    ctx = server.context
    refused_before = zap.handler_of(ctx).refused
    keyless, other_job = dealer(ctx, address), dealer(ctx, address, Plain.of_job(b"another job's key, 32 bytes...."))
    curved = dealer(ctx, address, job_curve(server=False))
    member = dealer(ctx, address, Plain.of_job(KEY))
    try:
        for sock in (keyless, other_job, curved):
            try:
                sock.send_multipart([b"from outside"], zmq.NOBLOCK)
            except zmq.Again:
                pass
        member.send_multipart([b"from the job"])
        assert server.poll(10_000)
        assert server.recv_multipart()[1:] == [b"from the job"]
        assert not server.poll(500)
        assert zap.handler_of(ctx).refused >= refused_before + 1  # the PLAIN stranger, by ZAP
        assert Session(KEY).plain_password() == zap.plain_password(KEY) != zap.plain_password(KEY[::-1])
        assert zap.plain_password(KEY) not in repr(Plain.of_job(KEY)).encode()
        assert job_curve.server[1] not in repr(job_curve()).encode()  # no secret in a repr (a log line)
    finally:
        for s in (keyless, other_job, curved, member, server):
            s.close(0)
