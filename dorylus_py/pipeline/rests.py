"""Leases that rest between stages (``--lease-rest predict``): what the graph server's pool does when its
tensor tasks run out, as plain bookkeeping (the shell gives it the time; ``graph_servers/leasing.py``).

AWS bills a Lambda for every second of its invocation, waiting included. In a synchronous epoch a graph
server's Lambdas wait through every Gather and ghost exchange: on Dorylus's Reddit shape a task is out
only 44-49 % of the time, and gaps longer than 100 ms make 38-44 % of it (``benchmarks/lease_gaps.py``).
A lease that waits ``--lease-idle-ms`` before it leaves rarely leaves at all, and a short idle time makes
every stage wait for its invocations (docs/performance.md, the sixth measurement).

So the pool rests by prediction: a stage's gaps repeat from epoch to epoch. When the pool runs out of
copies after a task of kind ``(kind, layer, train)``, the gap after that task in an earlier epoch
predicts this one. If the prediction leaves time for an invocation twice over, the idle leases are
released at once, and as many are invoked again one invocation latency (measured: invoked to connected)
before :data:`WAKE_SHARE` of the predicted gap is over. A gap shorter than predicted only costs the
copies that come early an invocation's wait (the dispatcher starts leases for them as for any copy); an
unknown stage (the first epoch) keeps its leases.
"""

from __future__ import annotations

from dataclasses import dataclass, field

StageKey = tuple[str, int, bool]  # the (kind, layer, train) of the task after which the pool ran out of copies

WAKE_SHARE = 0.75  # invoke again to be connected when this share of the predicted gap is over: a margin for drift
LATENCY_WEIGHT = 0.3  # the weight of the latest invocation in the latency's moving average


@dataclass
class RestPlanner:
    gaps: dict[StageKey, float] = field(default_factory=dict)  # the latest gap after each stage, seconds
    latency: float | None = None  # seconds from invoking a lease to its worker connecting (moving average)
    idle_at: float | None = None  # when the pool ran out of copies (None: it has copies)
    after: StageKey | None = None  # the task after which it did
    wake_at: float | None = None  # when to invoke the resting leases again
    resting: int = 0  # leases released at this gap, to invoke again

    def connected(self, seconds: float) -> None:
        """A lease's worker connected ``seconds`` after its invocation."""
        self.latency = seconds if self.latency is None else (1 - LATENCY_WEIGHT) * self.latency + LATENCY_WEIGHT * seconds

    def idle(self, now: float, after: StageKey, idle_leases: int) -> int:
        """The pool ran out of copies after a task of ``after``, with ``idle_leases`` connected and idle:
        how many of them to release now (all or none)."""
        self.idle_at, self.after = now, after
        gap = self.gaps.get(after)
        if gap is None or self.latency is None or gap * WAKE_SHARE < 2 * self.latency or not idle_leases:
            return 0
        self.wake_at, self.resting = now + gap * WAKE_SHARE - self.latency, idle_leases
        return idle_leases

    def busy(self, now: float) -> None:
        """A copy is waiting again: the gap is over (and remembered); leases still resting are the
        dispatcher's to start, for the copies."""
        if self.idle_at is not None and self.after is not None:
            self.gaps[self.after] = now - self.idle_at
        self.idle_at = self.after = self.wake_at = None
        self.resting = 0

    def due(self, now: float) -> int:
        """Leases to invoke now, ahead of the copies predicted (once a gap)."""
        if self.wake_at is None or now < self.wake_at:
            return 0
        count, self.wake_at, self.resting = self.resting, None, 0
        return count
