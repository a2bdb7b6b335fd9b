"""Seconds this process was running: the clock of the liveness deadlines that a freeze of one's own would
break (a gossip peer's answer, ``--peer-timeout-s``; a server's heartbeats at its driver, and the
driver's answers at the server). Other waits (a Lambda's time limit, the driver's requests, the
store's) stay on the wall clock: they bound how long a job can wait, not who is alive.

A worker that was itself frozen (its VM paused, its process stopped, or starved of CPU for seconds) could
not read its peers' answers while frozen. Timed by the wall clock, every request out at the time expires
the moment it wakes, and it declares those peers dead; two live workers frozen together (threads of one
process, or two VMs on one busy host) declare each other dead and the job ends with no record. Timed
by this clock, a freeze counts as :data:`MAX_GAP_S` at most: a peer is declared dead only after about
``--peer-timeout-s`` of this worker's own running time without its answer.

A freeze is seen as a gap between ticks: a thread ticks every :data:`TICK_S` (a reading of
:func:`awake_now` is a tick too), and a gap counts in full up to :data:`MAX_GAP_S`. So a process that is
merely slow (starved of the CPU or of the GIL: tens of busy threads, a CPU quota) still counts its time
in full, and a peer that is really dead is still found within the timeout; only a stall of over half a
second is cut short. Without a ticker (its thread could not start), every gap counts in full.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

TICK_S = 0.05
MAX_GAP_S = 0.5  # the most one gap between ticks counts: longer, the process was not running


class AwakeClock:
    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        """``monotonic``: the wall clock it leaves the freezes out of (tests give their own)."""
        self._monotonic = monotonic
        self._frozen = 0.0  # seconds not counted, so far
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked child has no ticker, maybe a held lock

    def _reset(self) -> None:
        """A fresh lock and no ticker (also in a forked child, which keeps what was not counted, so its
        clock goes on from its parent's)."""
        self._lock = threading.Lock()
        self._last = self._monotonic()  # the latest tick
        self._ticking = False

    def now(self) -> float:
        """Monotonic seconds, less the freezes seen so far (this reading is a tick too)."""
        with self._lock:
            if not self._ticking:  # started at the first reading, not at import
                self._last = self._monotonic()
                try:
                    threading.Thread(target=self._tick, name="awake-clock", daemon=True).start()
                    self._ticking = True
                except RuntimeError:  # no thread to be had (a limit, or shutdown): gaps count in full
                    pass
            return self._tick_now()

    def frozen_s(self) -> float:
        """Seconds not counted so far."""
        self.now()
        return self._frozen

    def _tick_now(self) -> float:
        t = self._monotonic()
        if self._ticking:
            self._frozen += max(0.0, t - self._last - MAX_GAP_S)
        self._last = t
        return t - self._frozen

    def _tick(self) -> None:
        while True:
            time.sleep(TICK_S)
            with self._lock:
                self._tick_now()


_clock = AwakeClock()


def awake_now() -> float:
    """This process's running seconds (monotonic, less its freezes): the liveness deadlines' clock."""
    return _clock.now()
