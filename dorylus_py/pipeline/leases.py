"""Which warm worker runs which copy of a task: a graph server's leases, as plain bookkeeping.

A worker is invoked for a *lease* (``worker/event.py``): it connects, says its lease id, and runs the
tasks the graph server sends it until it is released, waits too long for one, or runs out of time. So a
task costs the server two messages (the task with its rows out, its result in) and no invocation, where
an invocation per task cost it an event, a pull and its reply, a push and its acknowledgement, and the
platform's dispatch: about 1.5 ms of a server's CPU a task, more than the ``cpu`` backend spent doing
the task's work itself (issue 53).

The :class:`Dispatcher` decides, without sockets or clocks (the server's shell gives it the time):

- copies wait in launch order until a lease has room: at most ``depth`` copies out on one lease, so the
  next task's rows travel while the worker computes the current one;
- a copy goes to the lease with the fewest copies out and, among those, to one that holds its chunk's
  static rows (``token``: the rows' name, ``graph_servers/task_io.py``): an idle worker that must be
  sent the rows starts sooner than a busy one that has them, and keeps them for the next time;
- a lease is started for every copy waiting or out beyond the leases alive, up to the pool's size;
- a lease that ends (it left, or its invocation returned or failed) hands back the copies it held,
  which the scheduler then relaunches (they failed); a lease beyond a shrunk pool is released when idle;
- copies of tasks that are better done where the rows are (``--offload auto``: too little work for the
  bytes they would move) wait for the server's own threads instead, a lease of its own that is in no
  pool and never ends (the ``cpu``/``gpu`` backends send every copy there).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from dorylus_py.pipeline.events import TaskKey

Copy = tuple[TaskKey, int]  # a task's key and the copy's attempt number


@dataclass
class Lease:
    id: str
    started: float  # when it was invoked
    peer: object = None  # whom its tasks go to, once it said hello (None: invoked, not connected yet)
    held: frozenset[str] = frozenset()  # the static rows' tokens it says it holds
    out: list[Copy] = field(default_factory=list)  # copies sent to it, oldest first
    idle_since: float | None = None  # connected and nothing out since then
    here: bool = False  # the graph server's own threads: no invocation, in no pool, never ends


@dataclass
class Dispatcher:
    size: int  # leases at most (the pool)
    depth: int = 2  # copies out on one lease at most
    here_depth: int = 0  # copies out on the server's own threads at most (their count)
    leases: dict[str, Lease] = field(default_factory=dict)
    queue: deque = field(default_factory=deque)  # copies waiting for a lease, in launch order
    queue_here: deque = field(default_factory=deque)  # copies waiting for the server's own threads

    def submit(self, copy: Copy, here: bool = False) -> None:
        """A copy to run on a lease, or (``here``) on the server's own threads."""
        (self.queue_here if here else self.queue).append(copy)

    def own_threads(self, lease: str, peer, now: float) -> None:
        """The server's own threads, a lease that never ends (``here_depth`` copies out at once)."""
        self.leases[lease] = Lease(lease, now, peer, idle_since=now, here=True)

    def started(self, lease: str, now: float) -> None:
        """The platform was asked to run ``lease``."""
        self.leases[lease] = Lease(lease, now)

    def hello(self, lease: str, peer, held: frozenset[str], now: float) -> bool:
        """``lease``'s worker connected (``peer``: where its tasks go); False if it is no lease of ours, or
        one that is connected already (a platform's retry of an invocation runs it twice)."""
        one = self.leases.get(lease)
        if one is None or one.peer is not None:
            return False
        one.peer, one.held, one.idle_since = peer, held, now
        return True

    def assign(self, token_of, now: float) -> list[tuple[Lease, Copy]]:
        """Copies to send now, each with its lease, taken from the queues in order; ``token_of(key)``: the
        static rows' token of the key's task (None: it has none)."""
        out = []
        for queue, here, depth in ((self.queue, False, self.depth), (self.queue_here, True, self.here_depth)):
            while queue:
                room = [lease for lease in self.leases.values()
                        if lease.here == here and lease.peer is not None and len(lease.out) < depth]
                if not room:
                    break
                copy = queue.popleft()
                token = token_of(copy[0])
                lease = min(room, key=lambda l: (len(l.out), token is None or token not in l.held, l.started))
                lease.out.append(copy)
                lease.idle_since = None
                out.append((lease, copy))
        return out

    def finished(self, lease: str, copy: Copy, held: frozenset[str] | None, now: float) -> bool:
        """``copy``'s result came from ``lease`` (``held``: the tokens it says it holds now); False if that
        copy was not out on that lease (not ours to take from it)."""
        one = self.leases.get(lease)
        if one is None or copy not in one.out:
            return False
        one.out.remove(copy)
        if held is not None:
            one.held = held
        if not one.out:
            one.idle_since = now
        return True

    def ended(self, lease: str) -> list[Copy]:
        """``lease`` is over (it left, or its invocation ended): the copies it still held, which failed."""
        one = self.leases.pop(lease, None)
        return [] if one is None else one.out

    def forget(self, done) -> None:
        """Drop waiting copies of keys that ``done(key)`` says need no copy any more."""
        self.queue = deque(c for c in self.queue if not done(c[0]))
        self.queue_here = deque(c for c in self.queue_here if not done(c[0]))

    def _pool(self) -> list[Lease]:
        return [lease for lease in self.leases.values() if not lease.here]

    def to_start(self) -> int:
        """Leases to invoke now: one for every copy waiting or out (each runs one task at a time; ``depth``
        only lets the next one's rows travel meanwhile), within the pool's size."""
        pool = self._pool()
        wanted = len(self.queue) + sum(len(l.out) for l in pool)
        return max(0, min(self.size, wanted) - len(pool))

    def to_release(self) -> list[Lease]:
        """Idle connected leases beyond the pool's size (it shrank), the longest idle first."""
        pool = self._pool()
        idle = sorted((l for l in pool if l.peer is not None and not l.out), key=lambda l: l.idle_since)
        return idle[:max(0, len(pool) - self.size)]

    def load(self) -> tuple[int, int, int]:
        """``(ready, waiting, busy)`` of the pool: leases connected, copies waiting for one, leases with
        copies out."""
        connected = [l for l in self._pool() if l.peer is not None]
        return len(connected), len(self.queue), sum(bool(l.out) for l in connected)

    def validate(self) -> None:
        """Invariants, for tests."""
        sent = [c for l in self.leases.values() for c in l.out]
        waiting = [*self.queue, *self.queue_here]
        assert len(sent) == len(set(sent)) and not set(sent) & set(waiting)
        assert all(len(l.out) <= (self.here_depth if l.here else self.depth) and (l.peer is not None or not l.out)
                   for l in self.leases.values())
