"""``cpu`` and ``gpu`` backends: the handler runs in the graph server's own threads, on its device.

The threads are daemons: a server told to stop exits at once, even while a task waits for a reply from
a peer that is gone (a weight server that stopped first; the task's own request timeout is 30 s), as a
process whose Lambdas are abandoned would. A ``ThreadPoolExecutor`` would be joined at exit instead.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace

from dorylus_py.platforms.base import Completion, Platform
from dorylus_py.worker.event import TaskEvent


class InprocPlatform(Platform):
    def __init__(self, threads: int, device: str = "cpu", session=None, direct=None):
        super().__init__()
        self.device, self.session = device, session  # the handler signs with this (not from the event)
        self.direct = direct  # graph_servers/direct.py: the graph server without a socket
        self.name = f"inproc-{device.split(':')[0]}"
        self._tasks: queue.SimpleQueue[TaskEvent | None] = queue.SimpleQueue()
        self._closed, self._threads = False, max(1, threads)
        for i in range(self._threads):
            threading.Thread(target=self._work, name=f"tensor_{i}", daemon=True).start()

    @property
    def concurrency(self) -> int:
        return self._threads

    def invoke(self, event: TaskEvent) -> None:
        self._tasks.put(replace(event, device=self.device))

    def _work(self) -> None:
        while (event := self._tasks.get()) is not None and not self._closed:
            self._run(event)

    def _run(self, event: TaskEvent) -> None:
        from dorylus_py.worker.handler import handler

        start = time.time()
        try:
            handler(event, None, session=self.session, direct=self.direct)
            ok, err = True, ""
        except Exception as e:  # noqa: BLE001  (reported; the task is relaunched)
            ok, err = False, f"{type(e).__name__}: {e}"
        self._done.put(Completion(event.task.to_wire(), self.name, start, time.time(), 0, 0, ok, err))

    def close(self) -> None:
        """Drop the tasks not started; running ones are abandoned (the threads end with the process)."""
        self._closed = True
        for _ in range(self._threads):  # wakes every idle worker
            self._tasks.put(None)
