"""The coordinator of decentralised training: work pool, gossip pairing and the end of each epoch.

One ZeroMQ ROUTER served by one thread, so every decision is taken in one place, in one order. Workers
ask; a request that cannot be answered yet is *held* and re-examined after every event:

- ``hello``: a worker is set up. All are answered together, so every worker starts at once and the
  clock of the run starts then (``on_start``), not counting process start-up.
- ``claim``: the next batch of the epoch's pool, carrying the batch just trained (``finished``), which
  leaves the pool for good. Held while the pool is empty but another worker still holds a batch (it may
  die and give it back); answered ``drained`` once every batch is finished. Also held while clearly
  faster workers would finish the rest of the pool sooner (:meth:`Coordinator._worth_a_batch`): a
  straggler taking one of the last batches would keep everyone waiting at the epoch's end.
- ``pair``: a worker reached a gossip point. Two waiting workers are paired at random (seeded); a lone
  waiter is told "no partner" as soon as no other live worker is running, i.e. could still ask. A pair
  request may carry ``finished`` like a claim; its answer then also leases the worker's next batch when
  the pool has one for it (``batch``; None: claim next), which saves a round trip per batch and lets the
  worker build that batch while it exchanges gradients. Once the pool is empty, a pair or drained
  answer names the worker's first batch of the next epoch (``ahead``): it builds it while the epoch
  ends, and the next ``model`` answer leases it to it (``batch``), which the worker must train first.
- ``epoch_end``: a worker's parameters and epoch statistics. Once every live worker has sent them, the
  parameters are averaged (weighted by the batches each trained) and all get the average back at once,
  to go on with the next epoch, while ``on_epoch`` evaluates and records it on an evaluator thread.
  Workers do not wait for that evaluation, so an early stop it asks for (``--target-acc``) takes effect
  at the next epoch's end: always exactly one epoch late, since an epoch's end first waits for the
  previous epoch's evaluation (normally long finished).

Why this cannot deadlock (docs/gossip.md): a held request only waits for a worker that is *running*
(between two requests), and a running worker always sends its next request after finite work, or dies
and is removed. Pairs are formed only among workers already waiting, each in at most one pair, and the
two exchange in rank order, so no cycle of waits can form. A dead worker (``alive(rank)`` false, or
silent while running for ``wait_timeout_s``) gives its batch back to the pool and leaves the job.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import numpy as np
import zmq

from dorylus_py.cluster.node import REJECTED, bind
from dorylus_py.errors import DorylusError
from dorylus_py.protocol import AuthError, Message, ProtocolError, Session, require

log = logging.getLogger(__name__)

RUNNING, HELLO, CLAIM, PAIR, EPOCH, DEAD = "running", "hello", "claim", "pair", "epoch", "dead"
AUDIENCE = "coordinator"  # what requests are signed for (workers reach it by more than one address)


class Coordinator:
    def __init__(self, world: int, batches_per_epoch: int, key: bytes, epochs: int, on_epoch, alive=None,
                 seed: int = 0, wait_timeout_s: float = 300.0, host: str = "127.0.0.1", port: int = 0, on_start=None):
        """``on_epoch(epoch, params, stats, tasks) -> bool`` records an epoch; False stops the job early.

        ``batches_per_epoch`` = 0: no work pool (all-reduce deals batches out itself).
        """
        self.world, self.batches_per_epoch, self.session = world, batches_per_epoch, Session(key)
        self.on_epoch, self.on_start, self.alive, self.wait_timeout_s = on_epoch, on_start, alive, wait_timeout_s
        self.started = False
        self.epochs = epochs
        self.stop_requested = False
        self.evaluated = threading.Condition()
        self.evaluated_epoch = 0  # the last epoch on_epoch has finished with
        self._evaluations: queue.Queue = queue.Queue()
        self._evaluator = threading.Thread(target=self._evaluate, name="evaluator", daemon=True)
        self.rng = np.random.default_rng(seed)
        self.router = zmq.Context.instance().socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        port = bind(self.router, "*" if host == "0.0.0.0" else host, port, "coordinator")
        self.address = f"tcp://{'127.0.0.1' if host in ('*', '0.0.0.0') else host}:{port}"
        self.state = [RUNNING] * world
        self.ident: list[tuple[bytes, bytes] | None] = [None] * world  # ROUTER identity, session id
        self.last_heard = [time.monotonic()] * world
        self.epoch = 1
        self.last_epoch = 0  # set once the job's final epoch is known
        self.pending: deque[int] = deque(range(batches_per_epoch))
        self.leased: dict[int, int] = {}  # batch -> worker
        self.lease_start: dict[int, float] = {}  # worker -> when it got the batch it holds
        self.cycle: list[float | None] = [None] * world  # each worker's recent seconds per batch (moving average)
        self.wants_next = [False] * world  # a waiting pair request finished a batch: lease the next with the answer
        self.ahead: dict[int, int] = {}  # worker -> its first batch of the next epoch, told once this pool is empty
        self.finished: set[int] = set()
        self.reports: dict[int, Message] = {}
        self.rounds = 0
        self.deaths: list[int] = []
        self.rejected = 0
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="coordinator", daemon=True)

    # --- life cycle --------------------------------------------------------------------------------

    def start(self) -> Coordinator:
        self._thread.start()
        self._evaluator.start()
        return self

    def close(self) -> None:
        self._stop = True
        self._evaluations.put(None)
        self._thread.join(timeout=10)
        self._evaluator.join(timeout=60)
        self.router.close(0)

    def _evaluate(self) -> None:
        """Run ``on_epoch`` for each ended epoch in order; set ``done`` after the last."""
        while (item := self._evaluations.get()) is not None:
            try:
                if not self.on_epoch(*item):
                    self.stop_requested = True
                with self.evaluated:
                    self.evaluated_epoch = item[0]
                    self.evaluated.notify_all()
                if item[0] == self.last_epoch:
                    self.done.set()
            except BaseException as e:
                self.error = e
                self.done.set()
                with self.evaluated:
                    self.evaluated.notify_all()

    def stats(self) -> dict:
        """What the run's summary records of the coordination."""
        return {"gossip_rounds": self.rounds, "worker_deaths": list(self.deaths), "rejected_messages": self.rejected}

    def live(self) -> list[int]:
        return [r for r in range(self.world) if self.state[r] != DEAD]

    def _run(self) -> None:
        try:
            while not self._stop and not self.done.is_set() and not self.last_epoch:
                if self.router.poll(100):
                    frames = self.router.recv_multipart(copy=False)
                    self._receive(frames[0].bytes, frames[1:])
                self._check_liveness()
                self._resolve()
        except BaseException as e:  # surfaced to the launcher, which stops the job
            self.error = e
            self.done.set()

    def _receive(self, identity: bytes, body) -> None:
        try:
            msg = self.session.decode(body, AUDIENCE)
        except AuthError as e:  # not from the job: dropped unanswered
            self.rejected += 1
            log.warning("coordinator dropped a message: %s", e)
            return
        except ProtocolError as e:
            msg = Message("error", {}, {}, e.sender)  # authentic, but not parsed: answered below
            self._refuse(identity, msg, e)
            return
        try:
            require(msg, "rank")
            rank = msg["rank"]
            if not isinstance(rank, int) or not 0 <= rank < self.world:
                raise ProtocolError(f"op {msg.op}: rank {rank!r} out of range")
            if self.state[rank] == DEAD:
                raise ProtocolError(f"worker {rank} was declared dead; its work went back to the pool")
            if self.state[rank] != RUNNING:
                raise ProtocolError(f"worker {rank} sent {msg.op} while its {self.state[rank]} request is pending")
            self.ident[rank], self.last_heard[rank] = (identity, msg.sender), time.monotonic()
            handlers = {"hello": self._on_hello, "claim": self._on_claim, "pair": self._on_pair,
                        "epoch_end": self._on_epoch_end}
            if msg.op not in handlers:
                raise ProtocolError(f"op {msg.op} is not for the coordinator")
            if (msg.op == "hello") == self.started:
                raise ProtocolError(f"worker {rank}: {msg.op} " + ("after the start" if self.started else "before the start"))
            handlers[msg.op](rank, msg)
        except REJECTED as e:
            self._refuse(identity, msg, e)

    def _refuse(self, identity: bytes, msg: Message, error: Exception) -> None:
        self.rejected += 1
        log.warning("coordinator rejected a message: %s", error)
        self._send((identity, msg.sender), Message("error", {"reason": str(error)[:300]}))

    # --- requests ----------------------------------------------------------------------------------

    def _on_hello(self, rank: int, msg: Message) -> None:
        self.state[rank] = HELLO

    def _on_claim(self, rank: int, msg: Message) -> None:
        self._finish(rank, msg)
        self.state[rank] = CLAIM

    def _on_pair(self, rank: int, msg: Message) -> None:
        self.wants_next[rank] = self._finish(rank, msg)
        self.state[rank] = PAIR

    def _finish(self, rank: int, msg: Message) -> bool:
        """Take the batch a claim or pair request says ``rank`` finished out of the pool; whether there was one."""
        self._same_epoch(msg)
        b = msg.get("finished")
        if b is None:
            return False
        if self.leased.get(b) != rank:
            raise ProtocolError(f"worker {rank} finished batch {b!r} it does not hold")
        del self.leased[b]
        self.finished.add(b)
        took = time.monotonic() - self.lease_start.pop(rank)
        self.cycle[rank] = took if self.cycle[rank] is None else 0.5 * (self.cycle[rank] + took)
        return True

    def _on_epoch_end(self, rank: int, msg: Message) -> None:
        self._same_epoch(msg)
        require(msg, "loss_sum", "count", "tasks", shapes={"params": (None,)})
        if any(b == rank for b in self.leased.values()):
            raise ProtocolError(f"worker {rank} ended the epoch while holding a batch")
        self.reports[rank] = Message(msg.op, dict(msg.fields), {"params": np.array(msg.tensors["params"])})
        self.state[rank] = EPOCH

    def _same_epoch(self, msg: Message) -> None:
        require(msg, "epoch")
        if msg["epoch"] != self.epoch:
            raise ProtocolError(f"op {msg.op} for epoch {msg['epoch']!r}, but the job is in epoch {self.epoch}")

    # --- decisions ---------------------------------------------------------------------------------

    def _resolve(self) -> None:
        live = self.live()
        if not live:
            raise DorylusError("every worker died")
        if not self.started:
            if all(self.state[r] == HELLO for r in live):
                self.started = True
                if self.on_start is not None:
                    self.on_start()
                for r in live:
                    self._reply(r, Message("ok"))
            return
        for r in [r for r in live if self.state[r] == CLAIM]:
            if (b := self._lease(r)) is not None:
                self._reply(r, Message("batch", {"batch": b}))
            elif not self.leased and not self.pending:
                self._reply(r, Message("drained", {"ahead": self._reserve(r)}))
        waiting = [r for r in live if self.state[r] == PAIR]
        self.rng.shuffle(waiting)
        while len(waiting) >= 2:
            a, b = waiting.pop(), waiting.pop()
            self.rounds += 1
            for me, other in ((a, b), (b, a)):
                self._answer_pair(me, other, self.rounds)
        if waiting and not any(self.state[r] == RUNNING for r in live):
            self._answer_pair(waiting[0], -1, 0)
        if all(self.state[r] == EPOCH for r in live):
            self._end_epoch(live)

    def _lease(self, rank: int) -> int | None:
        """The pool's next batch, now leased to ``rank``; None if empty or better left to faster workers."""
        if not self.pending or not self._worth_a_batch(rank):
            return None
        b = self.pending.popleft()
        self.leased[b], self.lease_start[rank] = rank, time.monotonic()
        return b

    def _answer_pair(self, rank: int, partner: int, round_: int) -> None:
        nxt = self._lease(rank) if self.wants_next[rank] else None
        ahead = self._reserve(rank) if self.wants_next[rank] and nxt is None and not self.pending else None
        self._reply(rank, Message("partner", {"partner": partner, "round": round_, "batch": nxt, "ahead": ahead}))

    def _reserve(self, rank: int) -> int | None:
        """Once this epoch's pool is empty: ``rank``'s first batch of the next epoch, so it can build it
        while the epoch ends (leased to it when the next epoch starts). None if the pool has no more."""
        if rank not in self.ahead and len(self.ahead) < self.batches_per_epoch:
            self.ahead[rank] = len(self.ahead)
        return self.ahead.get(rank)

    def _worth_a_batch(self, rank: int) -> bool:
        """Whether ``rank`` gets one of the pool's batches if each goes to whoever would finish it first.

        Earliest-finish list scheduling over the workers' measured seconds per batch. Only workers at
        least 1.5x faster than ``rank``, and not overdue on the batch they hold, are counted on, so
        workers of about equal speed never hold each other up, and a held claim is released once those
        workers take the pool or fall behind (or die).
        """
        mine = self.cycle[rank]
        if mine is None:
            return True
        now = time.monotonic()
        free, cycle = {rank: now}, {rank: mine}
        for j in self.live():
            c = self.cycle[j]
            if j == rank or self.state[j] == EPOCH or c is None or c * 1.5 > mine:
                continue
            start = self.lease_start.get(j)
            if start is not None and now > start + 2 * c:
                continue
            free[j], cycle[j] = now if start is None else max(now, start + c), c
        for _ in range(len(self.pending)):
            j = min(free, key=lambda w: (free[w] + cycle[w], w != rank))
            if j == rank:
                return True
            free[j] += cycle[j]
        return False

    def _end_epoch(self, live: list[int]) -> None:
        # Weighted by the batches each trained this epoch: a straggler's less-trained model counts less.
        weights = np.array([max(self.reports[r].get("batches", 1), 1) for r in live], dtype=np.float64)
        stack = np.stack([self.reports[r].tensors["params"] for r in live]).astype(np.float64)
        params = (weights @ stack / weights.sum()).astype(np.float32)
        if len(self.finished) != self.batches_per_epoch:  # cannot happen: drained needs every batch finished
            raise DorylusError(f"epoch {self.epoch} ended with {len(self.finished)} of {self.batches_per_epoch} batches")
        stats = {"loss_sum": sum(self.reports[r]["loss_sum"] for r in live), "finished": len(self.finished),
                 "ended_at": time.perf_counter(),
                 "count": sum(self.reports[r]["count"] for r in live), "workers": len(live)}
        tasks = [t for r in live for t in self.reports[r]["tasks"]]
        with self.evaluated:  # the previous epoch's verdict (target reached?) is in: stops are one epoch late, always
            self.evaluated.wait_for(lambda: self.evaluated_epoch >= self.epoch - 1 or self.error is not None,
                                    timeout=self.wait_timeout_s)
        final = self.stop_requested or self.epoch >= self.epochs
        if final:
            self.last_epoch = self.epoch
        self._evaluations.put((self.epoch, params, stats, tasks))
        self.epoch += 1
        ahead = {r: b for r, b in self.ahead.items() if r in live}
        self.pending = deque(b for b in range(self.batches_per_epoch) if b not in ahead.values())
        self.leased, self.finished, self.reports, self.ahead = {b: r for r, b in ahead.items()}, set(), {}, {}
        self.lease_start = dict.fromkeys(ahead, time.monotonic())
        for r in live:
            self._reply(r, Message("model", {"next": 0 if final else self.epoch, "batch": ahead.get(r)}, {"params": params}))

    def _check_liveness(self) -> None:
        now = time.monotonic()
        for r in self.live():
            silent = self.state[r] == RUNNING and now - self.last_heard[r] > self.wait_timeout_s
            if silent or (self.alive is not None and not self.alive(r)):
                self._declare_dead(r, "silent" if silent else "exited")

    def _declare_dead(self, rank: int, why: str) -> None:
        self.state[rank] = DEAD
        self.deaths.append(rank)
        back = sorted(b for b, r in self.leased.items() if r == rank)
        for b in back:
            del self.leased[b]
            self.pending.appendleft(b)
        self.lease_start.pop(rank, None)
        self.reports.pop(rank, None)
        log.warning("worker %d %s; %s back to the pool", rank, why, f"batch {back[0]}" if back else "no batch")

    # --- replies -----------------------------------------------------------------------------------

    def _reply(self, rank: int, msg: Message) -> None:
        self.state[rank] = RUNNING
        self.last_heard[rank] = time.monotonic()
        self._send(self.ident[rank], msg)

    def _send(self, to: tuple[bytes, bytes], msg: Message) -> None:
        try:
            self.router.send_multipart([to[0], *self.session.encode(msg, to[1])], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as e:
            log.debug("reply to a gone worker dropped: %s", e)


class CoordinatorClient:
    """A worker's side: one DEALER, one request at a time, every wait bounded."""

    def __init__(self, address: str, key: bytes, rank: int, wait_timeout_s: float = 300.0):
        self.session, self.rank, self.wait_timeout_s = Session(key), rank, wait_timeout_s
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def ask(self, op: str, fields: dict | None = None, tensors: dict | None = None) -> Message:
        msg = Message(op, {"rank": self.rank, **(fields or {})}, tensors or {})
        self.sock.send_multipart(self.session.encode(msg, AUDIENCE), copy=False)
        if not self.sock.poll(int(self.wait_timeout_s * 1000)):
            raise DorylusError(f"worker {self.rank}: no answer from the coordinator to {op} within {self.wait_timeout_s:.0f} s")
        reply = self.session.decode(self.sock.recv_multipart(copy=False), self.session.id)
        if reply.op == "error":
            raise DorylusError(f"worker {self.rank}: coordinator refused {op}: {reply.get('reason')}")
        return reply

    def close(self) -> None:
        self.sock.close(0)
