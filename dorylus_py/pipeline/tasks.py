"""Tensor-task bookkeeping, without sockets: what is running, what is overdue, what already finished.

A task is identified by a key ``(kind, train, epoch, layer, chunk)``. It is *at least once*: a task
still running after ``max(min_timeout_s, factor x moving average of its kind)``, or reported failed,
is launched again. Effects are *exactly once*: the first result completes the key, every later one
is refused (:meth:`complete` returns False), and the weight server drops repeated gradients by key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TaskKey = tuple  # (kind, train, epoch, layer, chunk)


@dataclass
class _Running:
    launched: float
    attempts: int = 1
    failed: bool = False


@dataclass
class TaskTracker:
    min_timeout_s: float = 5.0
    factor: float = 3.0
    smoothing: float = 0.2  # weight of the newest duration in the moving average
    running: dict = field(default_factory=dict)  # key -> _Running
    done: set = field(default_factory=set)
    average_s: dict = field(default_factory=dict)  # kind -> moving average of durations
    relaunches: int = 0
    refused: int = 0

    def launch(self, key: TaskKey, now: float) -> None:
        if key in self.done or key in self.running:
            raise ValueError(f"task {key} launched twice")
        self.running[key] = _Running(now)

    def is_running(self, key: TaskKey) -> bool:
        return key in self.running

    def complete(self, key: TaskKey, now: float) -> bool:
        """Record the first result of ``key``; False (refuse it) if it is not running."""
        r = self.running.pop(key, None)
        if r is None:
            self.refused += 1
            return False
        self.done.add(key)
        kind = key[0]
        took = now - r.launched
        prev = self.average_s.get(kind)
        self.average_s[kind] = took if prev is None else (1 - self.smoothing) * prev + self.smoothing * took
        return True

    def failed(self, key: TaskKey) -> None:
        """An attempt reported failure: relaunch at the next :meth:`due` without waiting out the timeout."""
        r = self.running.get(key)
        if r is not None:
            r.failed = True

    def timeout_s(self, kind: str) -> float:
        avg = self.average_s.get(kind)
        return self.min_timeout_s if avg is None else max(self.min_timeout_s, self.factor * avg)

    def due(self, now: float) -> list[TaskKey]:
        """Keys to launch again now (failed, or overdue); their clocks restart."""
        out = []
        for key, r in self.running.items():
            if r.failed or now - r.launched > self.timeout_s(key[0]):
                r.launched, r.failed = now, False
                r.attempts += 1
                self.relaunches += 1
                out.append(key)
        return out

    def attempts(self, key: TaskKey) -> int:
        r = self.running.get(key)
        return r.attempts if r else 0

    def forget_before(self, epoch: int) -> None:
        """Drop completed keys of epochs before ``epoch`` (their late results are refused anyway)."""
        self.done = {k for k in self.done if k[2] >= epoch}
