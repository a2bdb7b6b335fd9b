"""Tensor-task bookkeeping, without sockets or clocks: copies in flight, relaunch, exactly-once results.

A task (a :class:`~dorylus_py.pipeline.events.TaskKey`) is *at least once*: a copy that fails is
replaced at once; a copy that is overdue gets a second copy beside it. Effects are *exactly once*:
the first result completes the key and every later one is refused (:meth:`TaskTracker.complete`
returns False); the weight server also drops a repeated gradient key.

Relaunch cannot livelock: at most ``max_copies`` copies of a key run at once; a copy is overdue
only after ``max(min_s, factor x usual)`` of its current phase, where *usual* is learned per task kind
from every copy (start-up: launch to first pull, which includes queueing and cold starts; run: pull to
result), and before anything is learned the usual start-up is the platform's hint. Where the platform
runs at most ``workers`` tasks at once, a copy not started yet is also allowed the queue ahead of it (the
usual run times of the copies launched before it, spread over the workers): at 10 M vertices, 34
evaluation tasks queued behind each other on 2 tensor threads were otherwise all called overdue. Each overdue
relaunch of a key doubles its allowance (up to ``max_backoff``). A key that fails ``max_attempts``
times is reported, and the job stops with its last error instead of retrying forever.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from dorylus_py.pipeline.events import TaskKey


@dataclass(frozen=True)
class RelaunchPolicy:
    min_s: float = 5.0  # never call a copy overdue before this
    factor: float = 3.0  # ... nor before factor x the usual time of its kind
    startup_hint_s: float = 0.0  # expected start-up before anything is learned (cold starts)
    max_copies: int = 2  # copies of one key running at once
    max_backoff: float = 8.0  # cap of the per-key doubling of the allowance
    max_attempts: int = 20  # copies of one key launched in all, before the job gives up
    smoothing: float = 0.2  # weight of the newest duration in the moving averages


@dataclass
class _Task:
    launched: float  # when the newest copy was launched
    attempts: int = 1  # copies launched so far; the newest is attempt number `attempts`
    launch_times: dict = field(default_factory=dict)  # attempt -> when it was launched
    order: dict = field(default_factory=dict)  # attempt -> its place among all launches (ties in time)
    in_flight: set = field(default_factory=lambda: {1})  # attempts still running
    started: dict = field(default_factory=dict)  # attempt -> when it first pulled its rows
    failed: bool = False  # a copy failed and none replaced it yet
    overdue_relaunches: int = 0
    last_error: str = ""


@dataclass
class TaskTracker:
    policy: RelaunchPolicy = field(default_factory=RelaunchPolicy)
    running: dict = field(default_factory=dict)  # key -> _Task
    done: set = field(default_factory=set)
    startup_s: dict = field(default_factory=dict)  # kind -> moving average of launch -> first pull
    run_s: dict = field(default_factory=dict)  # kind -> moving average of first pull -> result
    relaunches: int = 0
    refused: int = 0
    workers: int = 0  # tasks the platform runs at once (the rest queue); 0: no queue to allow for
    launches: int = 0  # copies launched in all: the next copy's place in the queue

    def launch(self, key: TaskKey, now: float) -> None:
        if key in self.done or key in self.running:
            raise ValueError(f"task {key} launched twice")
        self.running[key] = _Task(now, launch_times={1: now}, order={1: self.launches})
        self.launches += 1

    def is_running(self, key: TaskKey) -> bool:
        return key in self.running

    def copy_running(self, key: TaskKey, attempt: int) -> bool:
        """Whether copy ``attempt`` of ``key`` may still bring the result (the key runs, the copy has not ended)."""
        t = self.running.get(key)
        return t is not None and attempt in t.in_flight

    def attempts(self, key: TaskKey) -> int:
        t = self.running.get(key)
        return t.attempts if t else 0

    def in_flight(self, key: TaskKey) -> int:
        t = self.running.get(key)
        return len(t.in_flight) if t else 0

    def pulled(self, key: TaskKey, attempt: int, now: float) -> bool:
        """A copy asked for its rows; False if the key is not running (the copy should stop)."""
        t = self.running.get(key)
        if t is None:
            return False
        if attempt not in t.started and attempt in t.launch_times:
            t.started[attempt] = now
            self._learn(self.startup_s, key.kind, now - t.launch_times[attempt])
        return True

    def complete(self, key: TaskKey, now: float, attempt: int | None = None) -> bool:
        """Record the first result of ``key``; False (refuse it) if it is not running."""
        t = self.running.pop(key, None)
        if t is None:
            self.refused += 1
            return False
        self.done.add(key)
        began = t.started.get(attempt) if attempt is not None else None
        if began is not None:
            self._learn(self.run_s, key.kind, now - began)
        return True

    def ended(self, key: TaskKey, attempt: int, ok: bool, error: str = "") -> None:
        """The platform says a copy stopped running. A copy that failed, or the last copy ending
        without a result (lost on the way), is replaced at the next :meth:`due`."""
        t = self.running.get(key)
        if t is None:
            return
        t.in_flight.discard(attempt)
        if not ok:
            t.last_error = error or t.last_error
        if not ok or not t.in_flight:  # it failed, or every copy ended and none brought a result
            t.failed = True

    def allowance_s(self, key: TaskKey, t: _Task, queued_s: float = 0.0) -> tuple[float, float]:
        """(time the newest copy's clock started, how long it may take from there); a copy not started
        yet may also take ``queued_s``, its expected wait for a worker."""
        p = self.policy
        backoff = min(p.max_backoff, 2.0 ** t.overdue_relaunches)
        began = t.started.get(t.attempts)
        if began is not None:
            usual = self.run_s.get(key.kind)
            return began, max(p.min_s, p.factor * usual if usual is not None else p.min_s) * backoff
        usual = self.startup_s.get(key.kind, p.startup_hint_s)
        return t.launched, max(p.min_s, p.factor * usual) * backoff + queued_s

    def _queue(self) -> tuple[list[int], list[float]]:
        """Launch order of the copies in flight, sorted, and the running sums of their kinds' usual run
        times spread over the workers: ``sums[i]`` is the wait of a copy with ``i`` copies ahead."""
        copies = sorted((t.order[a], self.run_s.get(key.kind, 0.0)) for key, t in self.running.items()
                        for a in t.in_flight)
        sums = [s / self.workers for s in itertools.accumulate((run for _, run in copies), initial=0.0)]
        return [order for order, _ in copies], sums

    def _queued_s(self, t: _Task, queue: tuple[list[int], list[float]]) -> float:
        if not self.workers or t.attempts in t.started:
            return 0.0
        orders, sums = queue
        return sums[bisect.bisect_left(orders, t.order[t.attempts])]

    def due(self, now: float) -> list[tuple[TaskKey, int]]:
        """``(key, attempt)`` of copies to launch now: for keys whose copies all failed, and for keys
        whose newest copy is overdue while fewer than ``max_copies`` run."""
        out = []
        waiting = self.workers and any(t.attempts not in t.started for t in self.running.values())
        queue = self._queue() if waiting else ([], [])
        for key, t in self.running.items():
            if len(t.in_flight) >= self.policy.max_copies or t.attempts >= self.policy.max_attempts:
                continue
            since, allowed = self.allowance_s(key, t, self._queued_s(t, queue))
            if not t.failed and now - since <= allowed:
                continue
            if not t.failed:
                t.overdue_relaunches += 1
            t.failed = False
            t.attempts += 1
            t.in_flight.add(t.attempts)
            t.launched = t.launch_times[t.attempts] = now
            t.order[t.attempts] = self.launches
            self.launches += 1
            self.relaunches += 1
            out.append((key, t.attempts))
        return out

    def exhausted(self) -> tuple[TaskKey, str] | None:
        """A key that has used up its attempts with no copy left running, and its last error."""
        for key, t in self.running.items():
            if t.attempts >= self.policy.max_attempts and not t.in_flight:
                return key, t.last_error or "no result"
        return None

    def forget_before(self, epoch: int) -> None:
        """Drop completed keys of epochs before ``epoch`` (their late results are refused anyway)."""
        self.done = {k for k in self.done if k.epoch >= epoch}

    def _learn(self, table: dict, kind: str, seconds: float) -> None:
        prev = table.get(kind)
        a = self.policy.smoothing
        table[kind] = seconds if prev is None else (1 - a) * prev + a * seconds
