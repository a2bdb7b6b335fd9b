"""Peer messages: the receive thread answers, rejects what is bad and keeps serving; a silent peer costs
one bounded wait; a worker's handlers check every field before they touch its state."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import zmq

from dorylus_py.config import TrainConfig
from dorylus_py.decentral.node import Node
from dorylus_py.decentral.peers import Inbox, Links
from dorylus_py.protocol import Message, ProtocolError, Session
from dorylus_py.protocol.transport import Curve, dealer, router

TOKEN = b"t" * 32  # the job key


def test_the_inbox_answers_rejects_and_keeps_serving(monkeypatch):
    monkeypatch.delenv("DORYLUS_STRICT")  # as in production: a bug is logged, the message dropped
    inbox = Inbox(rank=0, world=3, key=TOKEN)
    seen = []

    def handle(sender, msg):
        seen.append((sender, msg.op))
        if msg.op == "steal":
            raise ProtocolError("bad steal")
        if msg.op == "mix":
            raise RuntimeError("a bug in a handler")
        return Message("ok") if msg.op == "ping" else None

    inbox.start(handle)
    links = Links(1, TOKEN, [inbox.address] * 3)
    raw = dealer(zmq.Context.instance(), inbox.address, Curve.among_peers(TOKEN))  # an insider: through CURVE
    session = Session(TOKEN)
    try:
        assert links.ask(0, "ping").op == "ok"
        assert links.ask(0, "steal", {"epoch": 1}).get("reason") == "bad steal"
        assert links.ask(0, "mix").get("reason") == "internal error"  # the receive thread survived a bug
        links.tell(0, "report", {"epoch": 1})  # a notice: handled, not answered
        other_key = Session(b"another key, 32 bytes long......")
        for frames in ([b"not json"], other_key.encode(Message("ping", {"rank": 1, "id": 5}), inbox.address)):
            raw.send_multipart(frames)  # unauthenticated: dropped without a word
        for rank in (7, 0, True, None):  # out of range, the inbox's own rank, not an integer, missing
            raw.send_multipart(session.encode(Message("ping", {"rank": rank, "id": 9}), inbox.address))
            assert raw.poll(5000)
            reply = session.decode(raw.recv_multipart(), session.id)
            assert reply.op == "error" and reply["id"] == 9 and "not a peer" in reply["reason"]
        assert links.ask(0, "ping").op == "ok"
        assert inbox.rejected == 2 + 2 + 4
        assert seen.count((1, "report")) == 1 and not raw.poll(200)
    finally:
        raw.close(0)
        links.close()
        inbox.close()


def test_a_message_over_the_cap_in_frames_under_it_is_dropped_with_its_peer(monkeypatch):
    """The gossip inbox reads frame by frame (transport.receive): 3 frames of 0.6 MiB under a 1 MiB cap
    are dropped as they come, the peer with them; another peer is served. (It read whole multipart
    messages, so only the per-frame MAXMSGSIZE bounded them.)"""
    monkeypatch.setenv("DORYLUS_MAX_MESSAGE_MB", "1")
    inbox = Inbox(rank=0, world=3, key=TOKEN)
    seen = []
    inbox.start(lambda sender, msg: seen.append(msg.op) or Message("ok"))
    big = dealer(zmq.Context.instance(), inbox.address, Curve.among_peers(TOKEN))
    links = Links(1, TOKEN, [inbox.address] * 3)
    try:
        big.send_multipart([b"h", *[b"x" * (600 << 10)] * 3])
        deadline = time.monotonic() + 10
        while inbox.rejected < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert inbox.rejected == 1 and seen == []
        big.send_multipart(Session(TOKEN).encode(Message("ping", {"rank": 2, "id": 1}), inbox.address))
        assert links.ask(0, "ping").op == "ok" and seen == ["ping"]  # the dropped peer's ping was let go
        assert inbox.rejected == 2
    finally:
        big.close(0)
        links.close()
        inbox.close()


def test_a_silent_peer_costs_one_bounded_wait_and_its_late_answer_is_dropped():
    silent = router(zmq.Context.instance(), Curve.among_peers(TOKEN))
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    links = Links(1, TOKEN, [address] * 2)
    server = Session(TOKEN)
    try:
        assert links.ask(0, "ping", timeout_s=0.3) is None
        identity, *body = silent.recv_multipart()
        late = server.decode(body, address)
        silent.send_multipart([identity, *server.encode(Message("ok", {"id": late["id"], "late": True}), late.sender)])
        second_id = links.post(0, "ping")
        identity, *body = silent.recv_multipart()
        silent.send_multipart([identity, *server.encode(Message("ok", {"id": second_id}), late.sender)])
        answers = []
        while len(answers) < 2:
            answers += links.collect(5.0)
        assert [a.get("late", False) for _, a in answers] == [True, False]  # collect brings all; ask_all matches ids
        assert links.ask_all([], "ping") == {}
        stopping = Links(1, TOKEN, [f"tcp://127.0.0.1:{port}"], give_up=lambda: True)
        assert stopping.ask(0, "ping", timeout_s=60) is None  # a stopping job does not wait
        stopping.close()
    finally:
        links.close()
        silent.close(0)


@pytest.fixture()
def node():
    cfg = TrainConfig(mode="gossip", workers=3, epochs=2, clusters=12, clusters_per_batch=2)
    params = np.arange(4, dtype=np.float32)
    n = Node(cfg, rank=1, world=3, key=TOKEN, params=lambda: params.copy(),
             share=lambda: ({"params": params.copy()}, {}), make_recorder=lambda: None)
    yield n
    n.inbox.close()


def test_a_workers_handlers_check_fields_before_touching_state(node):
    bad = [
        Message("steal", {"epoch": "1"}),
        Message("steal", {"epoch": 1, "cycle": -2.0}),
        Message("mix", {}, {"params": np.zeros(5, np.float32)}),  # wrong length
        Message("mix", {}, {"params": np.zeros(4, np.float64)}),  # wrong dtype
        Message("report", {"epoch": 1, "batches": [9], "left": True, "loss_sum": 0.0, "count": 0, "exchanges": 0},
                {"tasks": np.frombuffer(b"[]", np.uint8)}),  # batch 9 of 6
        Message("report", {"epoch": 1, "batches": [0], "left": True, "loss_sum": 0.0, "count": 0, "exchanges": 0},
                {"tasks": np.frombuffer(b"{not json", np.uint8)}),
        Message("row", {"row": [1, 2]}),
        Message("claim", {}),  # a known op, not a worker's
    ]
    for msg in bad:
        with pytest.raises(ProtocolError):  # a named check, never a KeyError or TypeError that a bug would raise too
            node._handle(0, msg)
    assert not node.ledger.epoch and not node.mailbox and not node.pool.queues


def test_a_workers_handlers_answer_from_its_state(node):
    answer = node._handle(0, Message("steal", {"epoch": 1, "cycle": 0.01}))
    assert answer.op == "batches" and answer["items"] == [[1, 4]]  # half of its share 1, 4: the tail
    answer = node._handle(2, Message("mix", {"grad_step": 3}, {"params": np.full(4, 2.0, np.float32),
                                                                "grad": np.ones(4, np.float32)}))
    assert answer.op == "params" and np.array_equal(answer.tensors["params"], np.arange(4))
    (kind, shift), (kind2, grad) = node.mailbox
    assert kind == "shift" and np.allclose(shift, 0.5 * (2.0 - np.arange(4))) and kind2 == "grad"
    node._handle(2, Message("mix", {"grad_step": 3}, {"params": np.zeros(4, np.float32), "grad": np.ones(4, np.float32)}))
    assert [k for k, _ in node.mailbox] == ["shift", "grad", "shift"]  # the same gradient is taken once
    tasks = np.frombuffer(json.dumps([{"kind": "batch"}]).encode(), np.uint8)
    node._handle(0, Message("report", {"epoch": 1, "batches": [0, 3], "left": True, "loss_sum": 2.0, "count": 4,
                                       "exchanges": 2}, {"tasks": tasks}))
    assert node.ledger.epoch[1].trained == {0, 3} and node.ledger.batches_per_worker == [2, 0, 0]
    node.mailbox.clear()
    snap = node._handle(0, Message("snapshot", {"epoch": 2, "keep": True}))  # --average-every: kept ...
    node._handle(0, Message("average", {"epoch": 2}, {"params": np.full(4, 5.0, np.float32)}))
    node._handle(0, Message("average", {"epoch": 3}, {"params": np.zeros(4, np.float32)}))  # ... no snapshot: ignored
    assert len(node.mailbox) == 1 and np.allclose(node.mailbox[0][1], 5.0 - snap.tensors["params"])
    node._handle(0, Message("dead", {"dead": 2, "why": "test"}))
    assert node.pool.dead == {2}
    refused = node._handle(2, Message("ping", {}))
    assert refused.op == "error" and refused["declared_dead"]
    node._handle(0, Message("dead", {"dead": 1, "why": "test"}))  # this worker itself
    assert node.pool.stopped and "declared dead by worker 0" in node.error


def test_the_peers_wire_is_encrypted_and_only_key_holders_get_through():
    """Workers of a gossip job (under torchrun, across machines) talk CurveZMQ with keys every key holder
    derives (``zap.peer_server_keys``): a stranger's handshake fails (plaintext, or CURVE with another job's
    keys) and what it sent never arrives."""
    inbox = Inbox(rank=0, world=2, key=TOKEN)
    seen = []
    inbox.start(lambda sender, msg: seen.append(msg.op) or Message("ok"))
    ctx = zmq.Context.instance()
    strangers = [dealer(ctx, inbox.address), dealer(ctx, inbox.address, Curve.among_peers(b"another key, 32 bytes long......"))]
    links = Links(1, TOKEN, [inbox.address] * 2)
    try:
        for sock in strangers:  # plaintext, or CURVE with keys of another job
            try:
                sock.send_multipart(Session(TOKEN).encode(Message("ping", {"rank": 1, "id": 1}), inbox.address), zmq.NOBLOCK)
            except zmq.Again:
                pass
        assert links.ask(0, "ping").op == "ok"  # the job's own peer gets through
        assert not any(sock.poll(300) for sock in strangers) and seen == ["ping"]
    finally:
        for sock in strangers:
            sock.close(0)
        links.close()
        inbox.close()

