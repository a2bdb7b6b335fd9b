"""Seconds this process was running: the clock of every "not heard from in time" (a gossip peer's answer,
``--peer-timeout-s``; a server's heartbeats at its driver, and the driver's answers at the server).

A worker that was itself frozen (its VM paused, its process stopped, or starved of CPU for seconds) could
not read its peers' answers while frozen. Timed by the wall clock, every request out at the time expires
the moment it wakes, and it declares those peers dead; two live workers frozen together (threads of one
process, or two VMs on one busy host) declare each other dead and the job ends with no record. Timed
by this clock, a freeze does not count: a peer is declared dead only after ``--peer-timeout-s`` of this
worker's own running time without its answer.

A freeze is seen as a gap between ticks: a thread ticks every :data:`TICK_S`, and any gap longer than
:data:`TICK_S` + :data:`GRACE_S` (the ticker's own tick, or any reading of :func:`awake_now`, which
counts as a tick) is not counted beyond one tick. A peer that is really dead is still found in the
timeout: a process that runs ticks on time.
"""

from __future__ import annotations

import os
import threading
import time

TICK_S = 0.05
GRACE_S = 0.25  # a tick this much later than due: the process was not running; the rest is not counted


class AwakeClock:
    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked child has no ticker, maybe a held lock

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._last = time.monotonic()  # the latest tick
        self._frozen = 0.0  # seconds not counted, so far
        self._ticking = False

    def now(self) -> float:
        """Monotonic seconds, less the freezes seen so far (this reading is a tick too)."""
        with self._lock:
            if not self._ticking:  # started at the first reading, not at import
                self._ticking, self._last = True, time.monotonic()
                threading.Thread(target=self._tick, name="awake-clock", daemon=True).start()
            return self._tick_now()

    def frozen_s(self) -> float:
        """Seconds not counted so far."""
        self.now()
        return self._frozen

    def _tick_now(self) -> float:
        t = time.monotonic()
        gap = t - self._last
        if gap > TICK_S + GRACE_S:
            self._frozen += gap - TICK_S
        self._last = t
        return t - self._frozen

    def _tick(self) -> None:
        while True:
            time.sleep(TICK_S)
            with self._lock:
                self._tick_now()


_clock = AwakeClock()


def awake_now() -> float:
    """This process's running seconds (monotonic, less its freezes): deadlines on a peer's answer."""
    return _clock.now()
