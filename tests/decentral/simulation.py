"""A discrete-event simulation of gossip workers' protocol: the real pure state machines (``pool.py``,
``ledger.py``) wired together as ``node.py`` wires them, through a simulated network with random delays,
random worker speeds, a worker killed at a random moment and answers late enough to be taken for dead.

It checks what the real processes cannot check fifty times in a test run: every job ends (no hang),
every recorded epoch had all its batches trained, and without deaths each exactly once.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from dataclasses import dataclass, field

from dorylus_py.decentral.ledger import EpochLedger
from dorylus_py.decentral.pool import AwaitSteal, Idle, Report, Steal, Stop, Train, WorkPool, watched

TIMEOUT = 5.0  # a peer that does not answer within this is dead (peer_timeout_s)
PING_EVERY = 1.0


@dataclass
class SimWorker:
    pool: WorkPool
    ledger: EpochLedger
    speed: float
    alive: bool = True
    waiting: set = field(default_factory=set)  # ids of the steal requests out
    awaiting: bool = False  # the main thread waits for an answer
    idle: bool = False
    busy: bool = False  # the main thread has an event scheduled
    wrote_final: bool = False
    cycle: float | None = None


@dataclass
class Job:
    world: int
    epochs: int
    per_epoch: int
    seed: int
    kill_at: tuple[float, ...] = ()  # when a random worker is killed (one per entry)
    late_rate: float = 0.0  # chance that a steal answer comes after the timeout
    target_epoch: int = 0  # the recorder's validation accuracy reaches the target at this epoch (0: never)
    now: float = 0.0
    trained: Counter = field(default_factory=Counter)  # (epoch, batch) -> times trained, by anyone
    events: int = 0
    killed: list[int] = field(default_factory=list)  # workers that died before they stopped

    def run(self, limit_s: float = 100_000.0) -> list[SimWorker]:
        rng = random.Random(self.seed)
        self.rng = rng
        self.workers = [SimWorker(WorkPool(r, self.world, self.epochs, self.per_epoch, self.seed),
                                  EpochLedger(self.world, self.epochs, self.per_epoch),
                                  speed=rng.choice([1.0, 1.0, 2.0, 5.0])) for r in range(self.world)]
        self.queue: list = []
        self.ids = itertools.count(1)
        self.order = itertools.count()
        self.fifo: dict[tuple[int, int], float] = {}
        for r in range(self.world):
            self.at(0.0, self.main, r)
            self.at(rng.uniform(0, PING_EVERY), self.ping, r)
        for t in self.kill_at:
            self.at(t, self.kill, rng.randrange(self.world))
        while self.queue:
            self.now, _, fn, args = heapq.heappop(self.queue)
            if self.now > limit_s:
                raise AssertionError(f"job seed {self.seed} still running at {limit_s} s: a hang")
            self.events += 1
            fn(*args)
        return self.workers

    # --- plumbing ----------------------------------------------------------------------------------

    def at(self, t: float, fn, *args) -> None:
        heapq.heappush(self.queue, (t, next(self.order), fn, args))

    def send(self, src: int, dst: int, fn, *args) -> None:
        """Deliver ``fn(*args)`` at ``dst`` after a random delay, in order per pair (as ZeroMQ does)."""
        t = max(self.now + self.rng.expovariate(1 / 0.01), self.fifo.get((src, dst), 0.0))
        self.fifo[src, dst] = t
        self.at(t, self.deliver, src, dst, fn, args)

    def deliver(self, src: int, dst: int, fn, args) -> None:
        w = self.workers[dst]
        if not w.alive:
            return
        if src in w.pool.dead and fn != self.on_dead:  # refused; a request is answered "you were declared dead"
            if fn == self.on_steal:
                self.send(dst, src, self.on_dead, dst, src)
            return
        fn(dst, *args)
        self.after_event(dst)

    def broadcast(self, src: int, fn, *args) -> None:
        for p in self.workers[src].pool.live():
            if p != src:
                self.send(src, p, fn, src, *args)

    def wake(self, r: int) -> None:
        w = self.workers[r]
        if w.idle and not w.busy:
            w.idle = False
            w.busy = True
            self.at(self.now, self.main, r)

    # --- a worker's threads ------------------------------------------------------------------------

    def main(self, r: int) -> None:
        w = self.workers[r]
        w.busy = False
        if not w.alive:
            return
        action = w.pool.next_action()
        if isinstance(action, Train):
            w.busy = True
            took = w.speed * self.rng.uniform(0.5, 1.5)
            w.cycle = took if w.cycle is None else 0.5 * (w.cycle + took)
            self.at(self.now + took, self.trained_one, r, action.epoch, action.batch)
            if (ahead := w.pool.steal_ahead()) is not None:
                self.post_steal(r, ahead)
        elif isinstance(action, Steal):
            self.post_steal(r, action)
            w.busy = True
            self.at(self.now, self.main, r)
        elif isinstance(action, AwaitSteal):
            w.awaiting = True
        elif isinstance(action, Report):
            w.ledger.add(r, action.epoch, list(action.batches), action.left)
            self.broadcast(r, self.on_report, action.epoch, list(action.batches), action.left)
            self.after_event(r)
            w.busy = True
            self.at(self.now, self.main, r)
        elif isinstance(action, Idle):
            w.idle = True
        else:
            assert isinstance(action, Stop)
            self.at(self.now + 0.01, self.exit, r)

    def exit(self, r: int) -> None:
        self.workers[r].alive = False

    def post_steal(self, r: int, steal: Steal) -> None:
        w = self.workers[r]
        for peer in steal.peers:
            rid = next(self.ids)
            w.waiting.add(rid)
            self.send(r, peer, self.on_steal, r, steal.epoch, w.cycle, rid)
            self.at(self.now + TIMEOUT, self.steal_timeout, r, peer, steal.epoch, rid)

    def answered(self, r: int, rid: int | None) -> None:
        """A steal's answer came or timed out (None: all given up): a main thread that awaited one goes on."""
        w = self.workers[r]
        if rid is None:
            w.waiting.clear()
        w.waiting.discard(rid)
        if w.awaiting:
            w.awaiting = False
            self.main(r)

    def trained_one(self, r: int, epoch: int, batch: int) -> None:
        w = self.workers[r]
        if w.alive:
            self.trained[epoch, batch] += 1
            w.pool.trained(epoch, batch)
            self.main(r)

    def on_steal(self, victim: int, thief: int, epoch: int, thief_s, rid: int) -> None:
        items = self.workers[victim].pool.serve_steal(thief, epoch, thief_s, self.workers[victim].cycle)
        if self.rng.random() < self.late_rate:  # an answer so late the thief takes the victim for dead
            self.at(self.now + TIMEOUT * 2, self.deliver, victim, thief, self.on_steal_reply, (victim, epoch, items, rid))
        else:
            self.send(victim, thief, self.on_steal_reply, victim, epoch, items, rid)

    def on_steal_reply(self, thief: int, victim: int, epoch: int, items, rid: int) -> None:
        w = self.workers[thief]
        w.pool.on_steal_reply(victim, epoch, items)  # even a late answer's batches are taken (node.py)
        if rid in w.waiting:
            self.answered(thief, rid)

    def steal_timeout(self, thief: int, victim: int, epoch: int, rid: int) -> None:
        w = self.workers[thief]
        if w.alive and rid in w.waiting:
            if not w.pool.stopped:
                self.declare_dead(thief, victim)
            w.pool.on_steal_reply(victim, epoch, [])
            self.answered(thief, rid)

    def declare_dead(self, r: int, dead: int) -> None:
        w = self.workers[r]
        if w.pool.on_peer_dead(dead):
            self.broadcast(r, self.on_dead, dead)
            self.send(r, dead, self.on_dead, r, dead)  # if it is alive after all, it learns and leaves
            self.after_event(r)

    def on_dead(self, r: int, src: int, dead: int) -> None:
        if dead == r:
            self.workers[r].pool.on_peer_dead(r)
            self.workers[r].alive = False  # declared dead: it exits
        else:
            self.declare_dead(r, dead)  # news is passed on, so every live worker learns it

    def on_report(self, r: int, src: int, epoch: int, batches, left: bool) -> None:
        self.workers[r].ledger.add(src, epoch, batches, left)

    def on_row(self, r: int, src: int, row: dict) -> None:
        self.workers[r].ledger.add_row(row)

    def on_stop(self, r: int, src: int) -> None:
        w = self.workers[r]
        w.pool.stop()
        if w.waiting:  # a stopped worker gives up waiting at once
            self.answered(r, None)

    def ping(self, r: int) -> None:
        """The liveness monitor (node.py, ``watched``): each worker pings the next live rank; the recorder
        pings them all."""
        w = self.workers[r]
        if not w.alive or w.pool.stopped:
            return
        for peer in watched(r, w.pool.live()):
            if not self.workers[peer].alive:
                self.at(self.now + TIMEOUT, self.ping_timeout, r, peer)
        self.at(self.now + PING_EVERY, self.ping, r)

    def ping_timeout(self, r: int, succ: int) -> None:
        if self.workers[r].alive and not self.workers[r].pool.stopped and not self.workers[succ].alive:
            self.declare_dead(r, succ)
            self.after_event(r)

    def kill(self, r: int) -> None:
        w = self.workers[r]
        if w.alive and not w.pool.stopped:
            self.killed.append(r)
        w.alive = False

    def after_event(self, r: int) -> None:
        """What the recorder's duty loop does after anything changed (node.py, ``_recorder_duty``)."""
        w = self.workers[r]
        if w.alive and not w.pool.stopped and min(w.pool.live()) == r:
            for epoch, batches in w.ledger.repairs(w.pool.live()).items():
                w.pool.adopt(epoch, batches)
            while not w.ledger.finished(1.0) and (e := w.ledger.next_to_record()) is not None:
                row = {"epoch": e, "val_acc": 1.0 if e == self.target_epoch else 0.0}
                w.ledger.add_row(row)
                self.broadcast(r, self.on_row, row)
            if w.ledger.finished(1.0):
                w.wrote_final = True
                self.broadcast(r, self.on_stop)
                w.pool.stop()
        self.wake(r)
