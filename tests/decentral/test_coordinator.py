"""The coordinator with real worker processes: pairing never hangs, a dead worker's batch goes back
to the pool, every batch is finished exactly once per epoch, bad messages are rejected."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import socket
import time
from collections import deque
from datetime import timedelta

import numpy as np
import pytest
import zmq

from dorylus_py.decentral.coordinator import AUDIENCE, Coordinator, CoordinatorClient
from dorylus_py.protocol import Message, Session

TOKEN = b"t" * 32  # the job key
BATCHES = 7
EPOCHS = 3


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, init: str, addresses: list[str], seed: int, die_in_epoch: int) -> None:
    """A worker with no model: random delays, real gloo exchanges with whoever it is paired with."""
    import torch
    import torch.distributed as dist

    from dorylus_py.decentral.worker import exchange

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    rng = random.Random(seed * 1000 + rank)
    for address in addresses:
        client = CoordinatorClient(address, TOKEN, rank, wait_timeout_s=60)
        client.ask("hello")
        epoch, first = 1, None
        while epoch:
            tasks, finished, leased = [], None, first  # the model answer leases the first batch named ahead
            while True:
                if leased is None:
                    reply = client.ask("claim", {"epoch": epoch, "finished": finished})
                    if reply.op == "drained":
                        break
                    leased = reply["batch"]
                batch, leased, finished = leased, None, None
                if epoch == die_in_epoch:
                    os._exit(1)  # dies holding a batch
                time.sleep(rng.uniform(0, 0.01) * (1 + rank))  # uneven speeds, random delays
                # Half the time the pair request reports the batch (and its answer may lease the next one),
                # half the time the next claim does: both paths of the protocol, interleaved.
                with_pair = rng.random() < 0.5
                pair = client.ask("pair", {"epoch": epoch, "finished": batch if with_pair else None})
                if pair["partner"] >= 0:
                    got = exchange(torch.full((1000,), float(rank)), pair["partner"], pair["round"] % (1 << 20))
                    assert torch.all(got == pair["partner"]), "received a tensor from someone other than the partner"
                if with_pair:
                    leased = pair["batch"]
                else:
                    assert pair["batch"] is None, "a pair request that finished nothing was leased a batch"
                    finished = batch
                tasks.append({"epoch": epoch, "batch": batch, "rank": rank, "partner": pair["partner"]})
            reply = client.ask("epoch_end", {"epoch": epoch, "loss_sum": 0.0, "count": 0, "tasks": tasks},
                               {"params": np.full(3, float(rank), np.float32)})
            assert np.allclose(reply.tensors["params"], reply.tensors["params"][0])
            epoch, first = reply["next"], reply["batch"]
        client.close()
    dist.destroy_process_group()


def _job(world: int, seed: int, alive=None):
    epochs = []

    def on_epoch(epoch, params, stats, tasks):
        epochs.append((epoch, params.copy(), stats, tasks))
        return True

    return Coordinator(world, BATCHES, TOKEN, EPOCHS, on_epoch, alive=alive, seed=seed, wait_timeout_s=60).start(), epochs


def _spawn(world: int, addresses: list[str], seed: int, die: dict[int, int]) -> list:
    ctx = mp.get_context("spawn")
    init = f"tcp://127.0.0.1:{_port()}"
    procs = [ctx.Process(target=_worker, args=(r, world, init, addresses, seed, die.get(r, 0))) for r in range(world)]
    for p in procs:
        p.start()
    return procs


@pytest.mark.parametrize("world", [3, 5])
def test_pairing_never_hangs_twenty_jobs_in_a_row(world):
    """10 jobs per worker count (20 in all), odd counts, random delays: all end, every batch once."""
    jobs = [_job(world, seed) for seed in range(10)]
    procs = _spawn(world, [c.address for c, _ in jobs], seed=world, die={})
    try:
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0] * world, "a worker hung or failed"
        for coord, epochs in jobs:
            assert coord.done.is_set() and coord.error is None
            assert [e for e, *_ in epochs] == list(range(1, EPOCHS + 1))
            for epoch, params, stats, tasks in epochs:
                assert stats["finished"] == BATCHES
                assert sorted(t["batch"] for t in tasks) == list(range(BATCHES))  # exactly once
                assert np.allclose(params, np.mean(range(world)))
            assert coord.rounds > 0
    finally:
        for p in procs:
            p.kill()
        for c, _ in jobs:
            c.close()


def test_dead_worker_gives_its_batch_back():
    procs: list = []
    coord, epochs = _job(3, seed=1, alive=lambda r: procs[r].is_alive())
    procs += _spawn(3, [coord.address], seed=1, die={2: 2})
    try:
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0, 0, 1]
        assert coord.done.is_set() and coord.error is None and coord.deaths == [2]
        for epoch, params, stats, tasks in epochs:
            assert stats["finished"] == BATCHES  # the batch worker 2 held was trained by someone else
            assert sorted(t["batch"] for t in tasks) == list(range(BATCHES))
        assert epochs[1][2]["workers"] == 2 and np.allclose(epochs[1][1], 0.5)  # averaged over the living
    finally:
        for p in procs:
            p.kill()
        coord.close()


def test_bad_messages_are_rejected_and_the_coordinator_keeps_serving():
    coord, _ = _job(1, seed=0)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(coord.address)

    session = Session(TOKEN)

    def encode(msg, key=TOKEN):
        return (session if key == TOKEN else Session(key)).encode(msg, AUDIENCE)

    def ask(frames):
        sock.send_multipart(frames)
        assert sock.poll(5000)
        return session.decode(sock.recv_multipart(), session.id)

    try:
        assert ask(encode(Message("claim", {"rank": 0, "epoch": 1}))).op == "error"  # before hello
        assert ask(encode(Message("hello", {"rank": 0}))).op == "ok"
        for frames in [[b"not json"], encode(Message("claim", {"rank": 0, "epoch": 1}), b"another key, 32 bytes long......")]:
            sock.send_multipart(frames)  # not from the job: dropped, unanswered
            assert not sock.poll(300)
        bad = [
            encode(Message("stop", {"rank": 0})),  # known op, not the coordinator's
            encode(Message("claim", {"rank": 9, "epoch": 1})),  # rank out of range
            encode(Message("claim", {"rank": 0, "epoch": 5})),  # wrong epoch
            encode(Message("claim", {"rank": 0, "epoch": 1, "finished": 3})),  # not held
            encode(Message("epoch_end", {"rank": 0, "epoch": 1})),  # no params
        ]
        for frames in bad:
            assert ask(frames).op == "error"
        assert coord.rejected == len(bad) + 3
        reply = ask(encode(Message("claim", {"rank": 0, "epoch": 1})))
        assert reply.op == "batch" and reply["batch"] == 0
        alone = ask(encode(Message("pair", {"rank": 0, "epoch": 1, "finished": 0})))  # told at once: no partner
        assert alone.op == "partner" and alone["partner"] == -1 and alone["batch"] == 1  # and leased the next batch
    finally:
        sock.close(0)
        coord.close()


def test_pair_answers_lease_the_next_batch():
    coord, _ = _job(2, seed=0)
    socks = [zmq.Context.instance().socket(zmq.DEALER) for _ in range(2)]
    for sock in socks:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(coord.address)

    sessions = [Session(TOKEN) for _ in socks]

    def both(*fields):
        for rank, (sock, f) in enumerate(zip(socks, fields)):
            sock.send_multipart(sessions[rank].encode(Message(f.pop("op"), {"rank": rank, **f}), AUDIENCE))
        replies = []
        for sock, session in zip(socks, sessions):
            assert sock.poll(5000)
            replies.append(session.decode(sock.recv_multipart(), session.id))
        return replies

    try:
        assert [r.op for r in both({"op": "hello"}, {"op": "hello"})] == ["ok", "ok"]
        claims = both({"op": "claim", "epoch": 1}, {"op": "claim", "epoch": 1})
        held = [r["batch"] for r in claims]
        assert sorted(held) == [0, 1]
        pairs = both({"op": "pair", "epoch": 1, "finished": held[0]}, {"op": "pair", "epoch": 1, "finished": held[1]})
        assert [p["partner"] for p in pairs] == [1, 0] and pairs[0]["round"] == pairs[1]["round"] == 1
        assert sorted(p["batch"] for p in pairs) == [2, 3] and coord.finished == {0, 1}
        assert coord.leased == {pairs[0]["batch"]: 0, pairs[1]["batch"]: 1}
        # Without ``finished`` a pair request leases nothing: that worker still holds its batch.
        pairs = both({"op": "pair", "epoch": 1}, {"op": "pair", "epoch": 1, "finished": pairs[1]["batch"]})
        assert pairs[0]["batch"] is None and pairs[1]["batch"] == 4
    finally:
        for sock in socks:
            sock.close(0)
        coord.close()


def test_the_next_epochs_first_batch_is_named_once_the_pool_is_empty():
    coord, epochs = _job(1, seed=0)
    client = CoordinatorClient(coord.address, TOKEN, 0, wait_timeout_s=10)
    try:
        client.ask("hello")
        batch, trained = client.ask("claim", {"epoch": 1})["batch"], []
        while batch is not None:
            trained.append(batch)
            pair = client.ask("pair", {"epoch": 1, "finished": batch})
            assert pair["partner"] == -1 and (pair["ahead"] is None) == (pair["batch"] is not None)
            batch = pair["batch"]
        assert trained == list(range(BATCHES)) and pair["ahead"] == 0
        assert client.ask("claim", {"epoch": 1}).fields == {"ahead": 0}  # drained, and the same batch named
        model = client.ask("epoch_end", {"epoch": 1, "loss_sum": 0.0, "count": 0, "tasks": []},
                           {"params": np.zeros(3, np.float32)})
        assert model["next"] == 2 and model["batch"] == 0 and coord.leased == {0: 0}
        assert client.ask("claim", {"epoch": 2, "finished": 0})["batch"] == 1  # it was leased with the model
    finally:
        client.close()
        coord.close()


def test_a_much_slower_worker_is_not_leased_the_pools_last_batches():
    """Earliest finish: a batch waits for a worker 20x faster rather than keep the epoch's end waiting."""
    coord = Coordinator(3, BATCHES, TOKEN, EPOCHS, lambda *a: True)
    try:
        now = time.monotonic()
        coord.started, coord.cycle = True, [0.01, 0.2, 0.01]
        coord.leased, coord.lease_start = {0: 0, 2: 2}, {0: now, 2: now}
        coord.pending = deque([3, 4, 5])
        assert not coord._worth_a_batch(1)  # the two fast workers finish all three in 0.02 s
        coord.pending = deque(range(3, 3 + 40))
        assert coord._worth_a_batch(1)  # 40 batches: the slow worker's one (0.2 s) ends before the rest
        coord.pending = deque([3, 4, 5])
        coord.cycle[1] = 0.012
        assert coord._worth_a_batch(1)  # about as fast: never held
        coord.cycle[1], coord.lease_start = 0.2, {0: now - 1.0, 2: now - 1.0}
        assert coord._worth_a_batch(1)  # the fast workers are long overdue: not counted on
        coord.cycle = [0.01, None, 0.01]
        assert coord._worth_a_batch(1)  # speed not measured yet
    finally:
        coord.router.close(0)


def test_client_gives_up_after_its_timeout():
    ctx = zmq.Context.instance()
    silent = ctx.socket(zmq.ROUTER)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    client = CoordinatorClient(f"tcp://127.0.0.1:{port}", TOKEN, 0, wait_timeout_s=0.3)
    try:
        with pytest.raises(Exception, match="no answer from the coordinator"):
            client.ask("claim", {"epoch": 1})
    finally:
        client.close()
        silent.close(0)
