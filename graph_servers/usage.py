"""What a graph server spends per epoch: bytes and messages through its sockets, and CPU seconds of the
whole process, of its loop thread (which signs, checks and copies every message) and of its graph thread.

The cost estimator calibrates on these (``cost/estimate.py``): on large graphs the loop thread's work
grows with the bytes moved, not with the Gather work or the tensor tasks' FLOPs.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from dorylus_py.protocol import Message

THREAD_CLOCKS = hasattr(time, "pthread_getcpuclockid")  # Linux and the BSDs; not macOS


class Usage:
    def __init__(self):
        self.totals = {"bytes_sent": 0, "bytes_received": 0, "messages": 0}
        self.ops: Counter = Counter()  # messages by direction and op ("out:task", "in:result"): the end log's
        self._graph_clock: int | None = None
        self._tensor_clocks: list[int] = []  # the cpu/gpu backends' tensor threads (graph_servers/direct.py)
        self.start()

    def start(self) -> None:
        """Count from now, with the calling thread as the loop thread (set-up is not an epoch's)."""
        self._loop = threading.get_ident()
        self._last = self._now()

    def sent(self, msg: Message) -> None:
        """Its tensors' bytes as they travel (``--wire-dtype``'s narrower forms counted as such)."""
        self.totals["bytes_sent"] += msg.tensor_bytes()
        self.totals["messages"] += 1
        self.ops["out:" + msg.op] += 1

    def received(self, msg: Message) -> None:
        self.totals["bytes_received"] += msg.tensor_bytes()
        self.totals["messages"] += 1
        self.ops["in:" + msg.op] += 1

    def on_graph_thread(self) -> None:
        """Called from the graph thread: from then on its CPU time is counted."""
        if self._graph_clock is None and THREAD_CLOCKS:
            self._graph_clock = time.pthread_getcpuclockid(threading.get_ident())

    def on_tensor_thread(self) -> None:
        """Called from a tensor thread of the server's own (``cpu``/``gpu``): its CPU time is counted from
        then on, as ``tensor_cpu_s``: the work a Lambda would take off the server."""
        if THREAD_CLOCKS:
            self._tensor_clocks.append(time.pthread_getcpuclockid(threading.get_ident()))

    def epoch(self) -> dict:
        """What was spent since the last call (on the loop thread, at each epoch's report: in async mode
        the epochs overlap, so this is since the previous report). Requests of in-process workers
        (``direct.py``) and messages to the driver cross no counted socket."""
        now = self._now()
        out = {k: round(v - self._last.get(k, 0), 4) for k, v in now.items()}
        self._last = now
        return out

    def _now(self) -> dict:
        cpu = {"cpu_s": time.process_time()}
        if THREAD_CLOCKS:
            cpu["loop_cpu_s"] = time.clock_gettime(time.pthread_getcpuclockid(self._loop))
        if self._graph_clock is not None:
            cpu["graph_cpu_s"] = time.clock_gettime(self._graph_clock)
        if self._tensor_clocks:
            cpu["tensor_cpu_s"] = sum(time.clock_gettime(c) for c in list(self._tensor_clocks))
        return {"bytes": self.totals["bytes_sent"] + self.totals["bytes_received"],
                "messages": self.totals["messages"]} | cpu
