"""Sizing a graph server's pool of tensor workers from what it measures (``--lambdas auto``).

Pure: no clocks, sockets or processes. The graph server tells it, at every tick, how the pool stands
(workers ready, tasks waiting for a worker, workers busy), whether a graph stage is running and which
epoch its pipeline is in, and, for every finished task, its kind and run time. It answers with a
:class:`Resize` or nothing.

Time is cut into windows of whole epochs (a window ends at the first epoch boundary after ``min_tasks``
tasks finished), so that windows hold the same work and their lengths compare. The first ``warmup``
windows decide nothing (a job's first 2-3 epochs take 1.2-1.7x a steady one: set against them, any
growth looked like a gain), nor does one in which the pool spent more than a tenth of the time
away from the size asked for (workers starting or stopping). At the end of each other window, with
time-weighted averages over it:

- **grow** while tasks wait for a worker and the graph stages idle (the tensor side is the
  bottleneck): to twice the size, but never past the most tasks wanted at once (busy plus waiting).
  Doubling, not a step at a time: tasks come in waves (a sync stage launches every chunk's task at
  once), and 3 workers take a wave of 4 no faster than 2 do, so a single step can look useless where
  two would pay;
- **keep a growth only if it paid**: the work rate (tasks finished per second, each counted at its
  kind's run time before the growth) of the windows after it is set against that of up to
  ``before_windows`` windows at the old size just before it (pooled: work over time); the first window
  after is left out, as new workers' first tasks fill their caches (at 200 k vertices, 20 ms of latency,
  2 -> 4 workers a server: the first epoch after was no faster, the ones after 15 % faster). A growth
  that raised it by less than ``min_gain`` bought billed seconds and little else (tasks only got
  slower, sharing the same cores, the same graph server or the same network): the pool goes back, and
  that size is not tried again for ``hold`` windows (doubling each time it fails again). An epoch's
  time varies by 3-4 % on a busy machine, and the two mistakes cost differently (a useless growth
  kept bills its workers for the rest of the run, a useful one undone is tried again after the hold),
  so a growth is undone after one window if it is clearly short of ``min_gain`` (by ``margin``), and
  kept only on ``judge_windows`` windows pooled;
- **shrink** while workers idle: down to the most workers that were ever wanted at once (busy plus
  waiting) in the window, after ``patience`` windows in a row (hysteresis: a growth needs one window,
  as it is on probation anyway).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TunerPolicy:
    low: int = 1  # fewest workers
    high: int = 16  # most workers
    min_tasks: int = 8  # a window ends at the first epoch boundary after this many tasks finished
    patience: int = 2  # windows in a row workers must idle before the pool shrinks
    wait_threshold: float = 0.1  # tasks waiting for a worker, on average, that call for more workers
    graph_idle: float = 0.5  # ... while graph stages run less than this fraction of the time
    min_gain: float = 0.06  # a growth is kept if the work rate rose by at least this fraction
    margin: float = 0.03  # ... undone after one window if short of min_gain by this much
    judge_windows: int = 2  # ... else judged on this many windows after the first one at the new size
    before_windows: int = 3  # windows at the old size, before a growth, whose work rate it is set against
    hold: int = 20  # windows during which a size that did not pay is not tried again (doubling per failure)
    unsettled: float = 0.1  # a window decides nothing if the pool was off its size this fraction of it
    warmup: int = 2  # the job's first windows decide nothing (nor are they set against a growth)


@dataclass(frozen=True)
class Resize:
    size: int
    reason: str


@dataclass
class _Window:
    start: float
    epoch: int
    wait: float = 0.0  # integral of tasks waiting for a worker over time
    idle: float = 0.0  # integral of idle workers
    graph: float = 0.0  # time a graph stage ran
    off_size: float = 0.0  # time the pool had fewer or more workers ready than asked for
    wanted: int = 0  # most workers wanted at once (busy + waiting)
    runs: dict = field(default_factory=lambda: defaultdict(list))  # kind -> run seconds

    def tasks(self) -> int:
        return sum(len(v) for v in self.runs.values())


@dataclass
class _Trial:
    """A growth on probation."""

    before: int  # the size it grew from ...
    after: int  # ... and to
    means: dict  # kind -> mean run time in the windows before it
    rate: float  # those windows' work rate
    settled: bool = False  # the first window after it (new workers warming) is over
    work: float = 0.0  # work (counted at ``means``) and time of the windows judged so far
    time: float = 0.0
    judged: int = 0


@dataclass
class PoolTuner:
    size: int  # the size asked for
    policy: TunerPolicy = field(default_factory=TunerPolicy)

    def __post_init__(self):
        self.size = min(self.policy.high, max(self.policy.low, self.size))
        self.window: _Window | None = None
        self.windows = 0  # windows ended so far
        self.last: tuple | None = None  # (now, ready, waiting, busy, graph_running) of the previous sample
        self.shrink_votes = 0
        self.trial: _Trial | None = None
        self.ceiling = self.policy.high
        self.ceiling_windows = 0
        self.failed_trials = 0  # in a row: each doubles how long a size that did not pay is left alone
        self.recent: list[tuple[dict, float]] = []  # (runs, span) of the latest windows at this size
        self.decisions: list[Resize] = []

    # --- what the graph server reports --------------------------------------------------------------

    def finished(self, kind: str, run_s: float) -> None:
        """A task of ``kind`` ran ``run_s`` seconds (from its start on a worker to its result)."""
        if self.window is not None:
            self.window.runs[kind].append(run_s)

    def sample(self, now: float, ready: int, waiting: int, busy: int, graph_running: bool,
               epoch: int) -> Resize | None:
        """The pool now: ``ready`` workers (of ``size`` asked for), ``waiting`` tasks without a worker,
        ``busy`` workers running one; ``graph_running``: a graph stage runs on the server; ``epoch``:
        the oldest epoch the server's pipeline is still in."""
        if self.window is None:
            self.window = _Window(now, epoch)
        elif self.last is not None:
            t, r, w, b, g = self.last
            dt = max(0.0, now - t)
            self.window.wait += w * dt
            self.window.idle += max(0, r - b) * dt
            self.window.graph += dt if g else 0.0
            self.window.off_size += dt if r != self.size else 0.0
        self.window.wanted = max(self.window.wanted, busy + waiting)
        self.last = (now, ready, waiting, busy, graph_running)
        if epoch <= self.window.epoch or self.window.tasks() < self.policy.min_tasks:
            return None
        w, self.window = self.window, _Window(now, epoch)
        span = now - w.start
        self.windows += 1
        if self.windows <= self.policy.warmup or span <= 0 or w.off_size > self.policy.unsettled * span:
            return None  # the warm-up, or workers starting: nothing to compare
        settling = self.trial is not None and not self.trial.settled  # new workers warming: not a usual window
        decision = self._decide(w, span)
        self.recent = [] if decision is not None or settling else [*self.recent, (w.runs, span)][-self.policy.before_windows:]
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
        if (trial := self.trial) is not None:
            if not trial.settled:  # the new workers' first tasks fill their caches: the next window says
                trial.settled = True
                return None
            trial.work, trial.time, trial.judged = trial.work + _work(w.runs, trial.means), trial.time + span, trial.judged + 1
            gain = trial.work / trial.time / trial.rate if trial.rate > 0 else None
            if gain is not None and gain >= 1 + p.min_gain - p.margin and trial.judged < p.judge_windows:
                return None  # not clearly useless: a growth is kept only on judge_windows windows
            self.trial = None
            if gain is not None and gain < 1 + p.min_gain:
                self.ceiling, self.ceiling_windows = trial.before, p.hold * 2 ** min(self.failed_trials, 3)
                self.failed_trials += 1
                self.shrink_votes = 0
                return Resize(trial.before, f"growing to {trial.after} raised throughput only {gain:.2f}x "
                                            f"(over {trial.judged} window{'s' if trial.judged > 1 else ''})")
            self.failed_trials = 0
        waiting, idle, graph = w.wait / span, w.idle / span, w.graph / span
        self.shrink_votes = self.shrink_votes + 1 if idle >= 1.0 and w.wanted < self.size else 0
        if waiting >= p.wait_threshold and graph < p.graph_idle and self.size < limit:
            size = min(limit, w.wanted, 2 * self.size)
            if size > self.size:
                self.trial = _Trial(self.size, size, *_pooled([*self.recent, (w.runs, span)][-p.before_windows:]))
                return Resize(size, f"{waiting:.1f} tasks waited for a worker (at most {w.wanted} wanted at once), "
                                    f"graph busy {graph:.0%}")
        if self.shrink_votes >= p.patience and self.size > p.low:
            self.shrink_votes = 0
            size = max(p.low, w.wanted)
            return Resize(size, f"{idle:.1f} workers idle, at most {w.wanted} wanted at once")
        return None


def _pooled(windows: list[tuple[dict, float]]) -> tuple[dict[str, float], float]:
    """Of ``(runs, span)`` windows taken together: each kind's mean run time, and the work rate at those means."""
    pooled = defaultdict(list)
    for runs, _ in windows:
        for kind, times in runs.items():
            pooled[kind] += times
    means = {k: sum(v) / len(v) for k, v in pooled.items()}
    return means, sum(_work(runs, means) for runs, _ in windows) / sum(span for _, span in windows)


def _work(runs: dict[str, list[float]], means: dict[str, float]) -> float:
    """Work done, each finished task counted at the mean run time its kind had in the reference
    windows (``means``), so that windows with other mixes of kinds compare; kinds the reference did not
    see count at their own run time."""
    return sum(len(v) * means.get(k, sum(v) / len(v)) for k, v in runs.items())
