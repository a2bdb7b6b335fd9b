"""Sizing a graph server's pool of tensor workers from what it measures (``--lambdas auto``).

Pure: no clocks, sockets or processes. The graph server tells it, at every tick, how the pool stands
(workers ready, the size asked for, tasks waiting for a worker, workers busy) and whether a graph
stage is running, and, for every finished task, its kind and run time. It answers with a
:class:`Resize` or nothing.

Time is cut into windows (at least ``window_s`` long and ``min_tasks`` finished tasks). At the end of
each window, with time-weighted averages over it:

- **grow** while tasks wait for a worker and the graph stages idle (the tensor side is the
  bottleneck): to the smallest size that takes the most tasks wanted at once through the pool in one
  round fewer (tasks come in waves: a sync stage launches every chunk's task at once, and 6 workers
  take 8 tasks no faster than 4 do);
- **keep a growth only if it paid**: the next window's throughput (tasks finished per second, each
  counted at its kind's run time before the growth, so windows with other mixes of kinds compare) is
  set against the window's before. A growth that raised it by less than ``min_gain`` bought billed
  seconds and little else (tasks only got slower, sharing the same cores, the same graph server or the
  same network): the pool goes back, and that size is not tried again for ``hold`` windows (doubling
  each time it fails again);
- **shrink** while workers idle: down to the most workers that were ever wanted at once (busy plus
  waiting) in the window;
- a rule acts only after it held for ``patience`` windows in a row (hysteresis), and nothing is
  decided while a resize is still under way (new workers starting).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TunerPolicy:
    low: int = 1  # fewest workers
    high: int = 16  # most workers
    window_s: float = 0.5  # a window lasts at least this long ...
    min_tasks: int = 8  # ... and sees at least this many tasks finish
    patience: int = 2  # windows in a row a rule must hold before it acts
    wait_threshold: float = 0.1  # tasks waiting for a worker, on average, that call for more workers
    graph_idle: float = 0.5  # ... while graph stages run less than this fraction of the time
    min_gain: float = 0.1  # a growth is kept if throughput rose by at least this fraction
    hold: int = 10  # windows during which a size that did not pay is not tried again (doubling per failure)


@dataclass(frozen=True)
class Resize:
    size: int
    reason: str


@dataclass
class _Window:
    start: float
    wait: float = 0.0  # integral of tasks waiting for a worker over time
    idle: float = 0.0  # integral of idle workers
    graph: float = 0.0  # time a graph stage ran
    wanted: int = 0  # most workers wanted at once (busy + waiting)
    runs: dict = field(default_factory=lambda: defaultdict(list))  # kind -> run seconds

    def tasks(self) -> int:
        return sum(len(v) for v in self.runs.values())


@dataclass
class PoolTuner:
    size: int  # the size asked for
    policy: TunerPolicy = field(default_factory=TunerPolicy)

    def __post_init__(self):
        self.size = min(self.policy.high, max(self.policy.low, self.size))
        self.window: _Window | None = None
        self.last: tuple | None = None  # (now, ready, waiting, busy, graph_running) of the previous sample
        self.grow_votes = self.shrink_votes = 0
        self.trial: tuple[int, int, dict] | None = None  # a growth on probation: (from, to, run times before)
        self.ceiling = self.policy.high
        self.ceiling_windows = 0
        self.failed_trials = 0  # in a row: each doubles how long a size that did not pay is left alone
        self.decisions: list[Resize] = []

    # --- what the graph server reports --------------------------------------------------------------

    def finished(self, kind: str, run_s: float) -> None:
        """A task of ``kind`` ran ``run_s`` seconds (from its start on a worker to its result)."""
        if self.window is not None:
            self.window.runs[kind].append(run_s)

    def sample(self, now: float, ready: int, waiting: int, busy: int, graph_running: bool) -> Resize | None:
        """The pool now: ``ready`` workers (of ``size`` asked for), ``waiting`` tasks without a worker,
        ``busy`` workers running one; ``graph_running``: a graph stage runs on the server."""
        if self.window is None:
            self.window = _Window(now)
        elif self.last is not None:
            t, r, w, b, g = self.last
            dt = max(0.0, now - t)
            self.window.wait += w * dt
            self.window.idle += max(0, r - b) * dt
            self.window.graph += dt if g else 0.0
        self.window.wanted = max(self.window.wanted, busy + waiting)
        self.last = (now, ready, waiting, busy, graph_running)
        if ready != self.size:  # workers still starting (or stopping): measure nothing yet
            self.window = _Window(now)
            return None
        span = now - self.window.start
        if span < self.policy.window_s or self.window.tasks() < self.policy.min_tasks:
            return None
        decision = self._decide(self.window, span)
        self.window = _Window(now)
        if decision is not None:
            self.size = decision.size
            self.decisions.append(decision)
        return decision

    # --- the rules ----------------------------------------------------------------------------------

    def _decide(self, w: _Window, span: float) -> Resize | None:
        p = self.policy
        limit = min(p.high, self.ceiling)
        if self.ceiling_windows:  # this window still counts against the hold
            self.ceiling_windows -= 1
            if not self.ceiling_windows:
                self.ceiling = p.high
        means = {k: sum(v) / len(v) for k, v in w.runs.items()}
        if self.trial is not None:
            before_size, after_size, before_means, before_rate = self.trial
            self.trial = None
            gain = _work_rate(w.runs, before_means, span) / before_rate if before_rate > 0 else None
            if gain is not None and gain < 1 + p.min_gain:
                self.ceiling, self.ceiling_windows = before_size, p.hold * 2 ** min(self.failed_trials, 3)
                self.failed_trials += 1
                self.grow_votes = self.shrink_votes = 0
                return Resize(before_size, f"growing to {after_size} raised throughput only {gain:.2f}x")
            self.failed_trials = 0
        waiting, idle, graph = w.wait / span, w.idle / span, w.graph / span
        self.grow_votes = self.grow_votes + 1 if waiting >= p.wait_threshold and graph < p.graph_idle else 0
        self.shrink_votes = self.shrink_votes + 1 if idle >= 1.0 and w.wanted < self.size else 0
        if self.grow_votes >= p.patience and self.size < limit:
            self.grow_votes = 0
            rounds = math.ceil(w.wanted / self.size)  # tasks wanted at once go through the pool in rounds
            size = min(limit, math.ceil(w.wanted / max(1, rounds - 1)))  # never more than doubles
            self.trial = (self.size, size, means, _work_rate(w.runs, means, span))
            return Resize(size, f"{waiting:.1f} tasks waited for a worker, graph busy {graph:.0%}")
        if self.shrink_votes >= p.patience and self.size > p.low:
            self.shrink_votes = 0
            size = max(p.low, w.wanted)
            return Resize(size, f"{idle:.1f} workers idle, at most {w.wanted} wanted at once")
        return None


def _work_rate(runs: dict[str, list[float]], means: dict[str, float], span: float) -> float:
    """Work done per second, each finished task counted at the mean run time its kind had in the
    reference window (``means``), so that windows with other mixes of kinds compare; kinds the reference
    did not see count at their own run time."""
    return sum(len(v) * means.get(k, sum(v) / len(v)) for k, v in runs.items()) / span
