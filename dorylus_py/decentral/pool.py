"""One gossip worker's share of the work pool, as a pure state machine: events in, instructions out.

No sockets, clocks or threads: the worker's shell (``node.py``) calls it under one lock and carries out
what :meth:`WorkPool.next_action` returns; ``tests/decentral/test_stress.py`` runs whole workers against
each other on an in-memory network, with random delays and deaths.

Epoch ``e``'s batches ``0 .. B-1`` (already shuffled from the shared seed by ``ClusterBatches.epoch_plan``)
are dealt round-robin among the workers alive, as this worker knows them, when it first touches the
epoch. A worker trains its share from the head. When it takes its last batch, it asks a random peer
that may still have work (:class:`Steal`, answered while that batch trains; :meth:`WorkPool.steal_ahead`),
and if that peer had nothing, all the others at once, training its share of the next epoch while the
answers come; a peer's receive thread answers at once from the *tail* of its queue
(:meth:`WorkPool.serve_steal`), with as many batches as make the two finish soonest given their speeds
(:func:`steal_count`). When no live peer has anything for it, the worker reports the epoch
(:class:`Report`: the batches it trained) and starts the next: nobody waits for anybody. A batch of an
epoch the worker already left (stolen late, or adopted from a dead worker by the recorder) is trained
first and reported on its own.

Without deaths every batch is trained exactly once per epoch: dealt once, then only moved. A dead
worker's share is found missing by the recorder (``ledger.py``) and trained again, so with deaths
every batch is trained at least once per epoch.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Train:
    epoch: int
    batch: int


@dataclass(frozen=True)
class Steal:
    """Ask ``peers`` (all at once) for batches of ``epoch``; sent without waiting for the answers."""

    peers: tuple[int, ...]
    epoch: int


@dataclass(frozen=True)
class AwaitSteal:
    """Nothing to train until an answer to the steals already out comes (or does not)."""


@dataclass(frozen=True)
class Report:
    """Broadcast to every live peer: the batches of ``epoch`` this worker trained since its last report."""

    epoch: int
    batches: tuple[int, ...]
    left: bool  # this worker has just left the epoch (False: late batches of an epoch it left before)


@dataclass(frozen=True)
class Idle:
    """Every epoch left: wait for the recorder's stop, or for adopted work."""


@dataclass(frozen=True)
class Stop:
    pass


def deal(epoch_batches: int, live: list[int], rank: int) -> deque[int]:
    """``rank``'s share of an epoch: every ``len(live)``-th batch, from its place among the live ranks."""
    if rank not in live:
        return deque()
    return deque(range(live.index(rank), epoch_batches, len(live)))


def watched(rank: int, live: list[int]) -> list[int]:
    """Whom ``rank`` pings to notice deaths: the next live rank (a ring, so every worker is watched), and
    all of them if ``rank`` is the recorder (the lowest live rank), which must not wait on a dead one."""
    others = [r for r in live if r != rank]
    if not others or rank not in live:
        return []
    if rank == live[0]:
        return others
    return [next((r for r in others if r > rank), others[0])]


def steal_count(remaining: int, victim_s: float | None, thief_s: float | None) -> int:
    """How many of a victim's ``remaining`` queued batches a thief takes: the split after which both are
    done soonest, the victim being halfway through the batch it is training. Unknown speeds (seconds per
    batch) count as equal, so equal workers split evenly and a much slower thief gets nothing."""
    if remaining <= 0:
        return 0
    v = victim_s or thief_s or 1.0
    t = thief_s or v
    return min(range(remaining + 1), key=lambda k: (max((remaining - k) * v + v / 2, k * t), k))


class WorkPool:
    def __init__(self, rank: int, world: int, epochs: int, per_epoch: int, seed: int = 0):
        self.rank, self.world, self.epochs, self.per_epoch = rank, world, epochs, per_epoch
        self.rng = random.Random(seed * 1_000_003 + rank)  # whom to rob: different in every worker
        self.dead: set[int] = set()
        self.queues: dict[int, deque[int]] = {}  # epoch -> batches this worker holds, untrained
        self.epoch = 1  # the epoch this worker is in
        self.finished = False  # the last epoch left
        self.nothing_for_me: set[int] = set()  # peers with no batch for this worker in this epoch
        self.stealing_from: set[int] = set()  # the peers a steal request is out to
        self.unreported: dict[int, list[int]] = {}  # epoch -> batches trained, not yet reported
        self.stopped = False

    # --- membership --------------------------------------------------------------------------------

    def live(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.dead]

    def on_peer_dead(self, rank: int) -> bool:
        """``rank`` is gone (noticed here, or told); whether this is news. This worker itself: it stops."""
        if rank in self.dead or not 0 <= rank < self.world:
            return False
        self.dead.add(rank)
        if rank == self.rank:
            self.stopped = True
        self.stealing_from.discard(rank)  # its answer will not come
        return True

    def stop(self) -> None:
        self.stopped = True

    # --- the main thread ---------------------------------------------------------------------------

    def next_action(self) -> Train | Steal | AwaitSteal | Report | Idle | Stop:
        """What to do next. A :class:`Steal` is sent without waiting for its answer (which
        :meth:`on_steal_reply` takes); :class:`AwaitSteal` then says to wait for it."""
        if self.stopped:
            return Stop()
        for e in sorted(self.unreported):
            if self._has_left(e):  # late batches of an epoch already left: report them on their own
                return Report(e, tuple(self.unreported.pop(e)), left=False)
        if (item := self._take(ahead=False)) is not None:
            return Train(*item)
        if self.finished:
            return Idle()
        if self.stealing_from:  # while the answers come, train ahead: this worker's share of the next epoch
            item = self._take(ahead=True)
            return AwaitSteal() if item is None else Train(*item)
        if (steal := self._steal(everyone=True)) is not None:
            return steal
        report = Report(self.epoch, tuple(self.unreported.pop(self.epoch, ())), left=True)
        if self.epoch < self.epochs:
            self.epoch += 1
            self.nothing_for_me = set()
        else:
            self.finished = True
        return report

    def steal_ahead(self) -> Steal | None:
        """Once this worker holds no batch beyond the one it trains: a steal from one random peer to send
        now, so that its answer comes while that batch trains (None: one is out already, or no peer has
        work). Should that peer have nothing, :meth:`next_action` asks all the others at once."""
        if self.stopped or self.finished or self.stealing_from or self._head(ahead=False) is not None:
            return None
        return self._steal(everyone=False)

    def _steal(self, everyone: bool) -> Steal | None:
        candidates = [p for p in self.live() if p != self.rank and p not in self.nothing_for_me]
        if not candidates:
            return None
        peers = candidates if everyone else [self.rng.choice(candidates)]
        self.stealing_from.update(peers)
        return Steal(tuple(peers), self.epoch)

    def peek(self) -> tuple[int, int] | None:
        """The batch :meth:`next_action` would train next, if any (to build it ahead)."""
        return self._head(ahead=False) or (self._head(ahead=True) if self.stealing_from else None)

    def trained(self, epoch: int, batch: int) -> None:
        self.unreported.setdefault(epoch, []).append(batch)

    def on_steal_reply(self, peer: int, epoch: int, items: list[tuple[int, int]]) -> None:
        """A peer's answer to :class:`Steal` (``items``: (epoch, batch) pairs, maybe none). Batches are
        taken even from an answer that came too late: they left the peer's queue."""
        self.stealing_from.discard(peer)
        if not items:
            if epoch == self.epoch:
                self.nothing_for_me.add(peer)
            return
        for e, b in items:
            self.queues.setdefault(e, deque()).append(b)


    def adopt(self, epoch: int, batches: list[int]) -> None:
        """Batches the recorder found missing (a dead worker's): trained here, before new work."""
        queue = self.queues.setdefault(epoch, deque())
        queue.extend(b for b in batches if b not in queue)

    # --- the receive thread ------------------------------------------------------------------------

    def serve_steal(self, thief: int, epoch: int, thief_s: float | None, my_s: float | None) -> list[tuple[int, int]]:
        """A peer with no work left in ``epoch`` asks for some: batches of that epoch from the tail of this
        worker's queue, as many as :func:`steal_count` says. Only of that epoch, which the thief cannot
        leave before it has trained and reported them: so an epoch every live worker has left has no
        batch in flight."""
        if epoch >= self.epoch:
            self.nothing_for_me.add(thief)  # it has nothing up to its epoch, so nothing for this one
        if not 1 <= epoch <= self.epochs:
            return []
        queue = self._queue(epoch)  # a slower worker's share of an epoch it has not reached yet can go too
        return [(epoch, queue.pop()) for _ in range(steal_count(len(queue), my_s, thief_s))][::-1]

    # --- helpers -----------------------------------------------------------------------------------

    def _has_left(self, epoch: int) -> bool:
        return epoch < self.epoch or self.finished

    def _queue(self, epoch: int) -> deque[int]:
        """This worker's queue of ``epoch``, its share dealt on first touch (never for an epoch it left)."""
        if epoch not in self.queues:
            self.queues[epoch] = deque() if self._has_left(epoch) else deal(self.per_epoch, self.live(), self.rank)
        return self.queues[epoch]

    def _head(self, ahead: bool) -> tuple[int, int] | None:
        """The oldest batch held up to this epoch (``ahead``: up to the next one, so long as this one is
        not over for want of work elsewhere), its share dealt on first touch."""
        if self.finished:
            upto = self.epochs
        else:
            upto = min(self.epoch + ahead, self.epochs)
            for e in range(self.epoch, upto + 1):
                self._queue(e)
        for e in sorted(self.queues):
            if e <= upto and self.queues[e]:
                return e, self.queues[e][0]
        return None

    def _take(self, ahead: bool) -> tuple[int, int] | None:
        item = self._head(ahead)
        if item is not None:
            self.queues[item[0]].popleft()
        return item
