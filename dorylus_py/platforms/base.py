"""How a tensor task is run. The pipeline only calls :meth:`Platform.invoke` with the event a Lambda
would get, and reads :meth:`Platform.completions`; where the handler runs is the platform's business.
"""

from __future__ import annotations

import math
import queue
import random
import time
from dataclasses import dataclass

from dorylus_py.worker.event import LeaseEvent


@dataclass
class Completion:
    """One finished invocation, successful or not (what ``tasks.jsonl`` records)."""

    task: dict  # what ran: ``{"lease": id}`` for a lease
    where: str  # e.g. "local-lambda", "inproc-cpu", "aws-lambda"
    start: float  # unix seconds
    end: float
    billed_ms: int  # Lambda billing: duration rounded up to 1 ms; 0 for in-process work
    memory_mb: int
    ok: bool
    error: str = ""
    output: dict | None = None  # what the handler returned, where the platform keeps it (the Lambda service answers it)


@dataclass(frozen=True)
class PoolLoad:
    """How a pool of tensor workers stands (what the autotuner measures)."""

    ready: int  # workers able to take a task
    waiting: int  # tasks invoked that no worker has taken yet
    busy: int  # workers running a task


class Platform:
    name = "abstract"
    startup_hint_s = 0.0  # what a task may take to start before the scheduler has measured it
    resizable = False  # whether resize() and load() work (--lambdas auto)

    def __init__(self):
        self._done: queue.Queue[Completion] = queue.Queue()

    @property
    def concurrency(self) -> int:
        """Tasks run at once; the rest wait for a worker (0: no limit known)."""
        return 0

    def invoke(self, event: LeaseEvent) -> None:
        """Start a worker for ``event``'s lease; its :class:`Completion` names the lease (``task``: ``{"lease": id}``)."""
        raise NotImplementedError

    def resize(self, size: int) -> None:
        """Run at most ``size`` tasks at once from now on."""
        raise NotImplementedError(f"{self.name} has a fixed pool")

    def load(self) -> PoolLoad:
        raise NotImplementedError(f"{self.name} does not measure its pool")

    def completions(self) -> list[Completion]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def wait_completions(self, timeout_s: float) -> list[Completion]:
        """:meth:`completions`, once at least one is there or ``timeout_s`` has passed (for a thread that
        has nothing else to do than hand completions on)."""
        try:
            first = self._done.get(timeout=timeout_s)
        except queue.Empty:
            return []
        return [first, *self.completions()]

    def close(self) -> None:
        pass


class LambdaContext:
    """The part of AWS's context object the handler uses and, for the emulator alone, injected failures and
    a cap on the worker's transfer rate (``bandwidth_mbps``, each way; 0: none). A failure runs the clock
    out: after ``expire_at_check`` more time checks the context reports no time left, which the handler
    notices as a Lambda running out of time; with ``fail_rate``, each task a lease starts
    (:meth:`task_started`) fails so, at once or part-way, with that probability."""

    def __init__(self, timeout_ms: int, expire_at_check: int | None = None, bandwidth_mbps: float = 0.0,
                 fail_rate: float = 0.0, seed: int = 0):
        self.deadline = time.monotonic() + timeout_ms / 1000
        self.expire_at_check = expire_at_check  # after this many time checks, report no time left
        self.checks = 0
        self.bandwidth_mbps = bandwidth_mbps
        self.fail_rate = fail_rate
        self._rng = random.Random(seed)

    def task_started(self) -> None:
        """A lease starts a task: with probability ``fail_rate`` the invocation dies during it."""
        if self.fail_rate and self.expire_at_check is None and self._rng.random() < self.fail_rate:
            self.expire_at_check = self.checks + self._rng.randrange(0, 4)  # 0: at once; 1-3: part-way

    def get_remaining_time_in_millis(self) -> int:
        self.checks += 1
        if self.expire_at_check is not None and self.checks > self.expire_at_check:
            return 0
        return max(0, int((self.deadline - time.monotonic()) * 1000))


def billed_ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))
