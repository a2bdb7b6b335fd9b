"""Fuzzing a decentralised worker's inbox (the peer-to-peer replacement of the gossip coordinator):
10,000 hostile messages (tests/cluster/fuzz_corpus.py) at a real worker's handlers; its receive thread
survives, its state is untouched, it still answers, and no reply carries the key. (Gossip is not
deterministic, so unlike the Cora fuzz runs there is no final loss to compare.)"""

import time

import numpy as np
import zmq

from dorylus_py.config import TrainConfig
from dorylus_py.decentral.node import Node
from dorylus_py.decentral.peers import Links
from dorylus_py.protocol import Message, ProtocolError, Session
from dorylus_py.protocol.transport import Curve, dealer
from tests.cluster.fuzz_corpus import corpus

KEY = bytes(range(50, 82))
MESSAGES = 10_000


def test_a_workers_inbox_survives_hostile_messages():
    cfg = TrainConfig(mode="gossip", workers=3, epochs=2, clusters=12, clusters_per_batch=2)
    params = np.arange(4, dtype=np.float32)
    node = Node(cfg, rank=1, world=3, key=KEY, params=lambda: params.copy(),
                share=lambda: ({"params": params.copy()}, {}), make_recorder=lambda: None)
    node.inbox.start(node._handle)
    sock = dealer(zmq.Context.instance(), node.inbox.address, Curve.among_peers(KEY))  # an insider
    links = Links(0, KEY, [node.inbox.address] * 3)
    replies = []
    try:
        for frames in corpus("worker", KEY, node.inbox.address, MESSAGES, seed=17):
            sock.send_multipart(frames)
            while sock.poll(0):
                replies.append(sock.recv_multipart())
        # a real ping on the same connection is answered after everything sent before it (one connection's
        # messages are served in order; another connection's ping could overtake a backlog under load)
        me = Session(KEY)
        sock.send_multipart(me.encode(Message("ping", {"rank": 0, "id": 1}), node.inbox.address))
        deadline, answered = time.monotonic() + 120, None
        while answered is None and time.monotonic() < deadline:
            if sock.poll(100):
                frames = sock.recv_multipart()
                replies.append(frames)
                try:
                    answered = me.decode(frames, me.id)
                except ProtocolError:
                    pass  # an answer to one of the hostile messages
        assert answered is not None and answered.op == "ok" and answered["id"] == 1
        assert links.ask(1, "ping", timeout_s=120).op == "ok"  # and it answers a new peer too
        while sock.poll(500):
            replies.append(sock.recv_multipart())
    finally:
        sock.close(0)
        links.close()
        node.inbox.close()
    assert node.inbox.rejected >= 0.9 * MESSAGES
    assert not node.ledger.epoch and not node.mailbox and not node.pool.dead and not node.kept
    assert replies and not [r for r in replies if KEY in b"".join(r) or KEY.hex().encode() in b"".join(r)]
