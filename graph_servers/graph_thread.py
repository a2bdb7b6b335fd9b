"""The graph server's graph jobs (Gather and the other graph stages) on one thread of their own.

Torch releases the GIL in the sparse products, so the loop thread keeps answering the tensor workers
while a job runs. A finished job wakes the loop's poll through an inproc socket; the loop then takes
its result (and re-raises its error) on its own thread, the only one that changes the scheduler.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import zmq

from dorylus_py.pipeline.events import RunGraph


class GraphThread:
    def __init__(self, ctx: zmq.Context, poller: zmq.Poller, work: Callable[[RunGraph], None]):
        """``work(inst)`` runs one job on the graph thread; ``poller`` is the loop's, which a finished
        job wakes."""
        self._work = work
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="graph")
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self.out = 0  # jobs submitted and not taken back as finished
        wake = f"inproc://graph-done-{id(self)}"
        self._wake_recv = ctx.socket(zmq.PULL)
        self._wake_recv.bind(wake)
        self._wake_send = ctx.socket(zmq.PUSH)
        self._wake_send.connect(wake)
        self._poller = poller
        poller.register(self._wake_recv, zmq.POLLIN)

    def submit(self, inst: RunGraph) -> None:
        self.out += 1
        self._pool.submit(self._run, inst)

    def _run(self, inst: RunGraph) -> None:
        t0 = time.time()
        try:
            self._work(inst)
            self._done.put((inst, t0, time.time(), None))
        except BaseException as e:  # noqa: BLE001  (re-raised on the loop's thread)
            self._done.put((inst, t0, time.time(), e))
        self._wake_send.send(b"", zmq.NOBLOCK)

    def finished(self) -> Iterator[tuple[RunGraph, float, float]]:
        """On the loop thread: each job done since the last call, with its start and end times; a job's
        error is raised here."""
        while self._wake_recv.poll(0):
            self._wake_recv.recv()
        while not self._done.empty():
            inst, t0, t1, error = self._done.get()
            self.out -= 1
            if error is not None:
                raise error
            yield inst, t0, t1

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._poller.unregister(self._wake_recv)  # the node serves the next job with its poller
        self._wake_send.close(0)
        self._wake_recv.close(0)
