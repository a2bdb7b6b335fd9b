"""A graph server's own tensor threads (``cpu``/``gpu`` backends): one lease that never ends.

The server hands them ``task`` messages as it would send them to a Lambda's lease, on a queue, and gets
their ``result`` messages back on another, which wakes the loop's poll through an inproc socket; the
same scheduler, dispatcher and result checks serve both. Nothing leaves the process, so nothing is
signed, framed or copied through the kernel: at 10 M vertices a ``cpu`` graph server moved about 7 GB
of task rows an epoch through its own socket and spent most of its loop thread on them. The rows are
copied once, out of the server's arrays, by the thread that runs the task (off the loop thread), into
that thread's one reused buffer (``worker/scratch.py``: fresh arrays cost a page fault every 4 KiB): a
task's rows are not written while it runs (the scheduler's rule for every task), and the copy means no
later write can reach a thread that holds them longer. The threads are daemons: a server told to stop
exits at once, even while a task waits for a weight server that is gone.
"""

from __future__ import annotations

import queue
import threading

import zmq

from dorylus_py.protocol import Message, ProtocolError
from dorylus_py.protocol.header import carried_fields

DIRECT = "direct"  # the lease id of a server's own threads


class DirectWorkers:
    def __init__(self, ctx: zmq.Context, poller: zmq.Poller, threads: int, runner, on_thread=None):
        """``runner()``: a new :class:`~dorylus_py.worker.task_runner.TaskRunner` (one per thread: its
        sockets to the weight servers are its own); ``on_thread()``: called first on each thread (the
        server's CPU accounting, ``usage.py``)."""
        self.threads = max(1, threads)
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        address = f"inproc://direct-{id(self)}"
        self._wake_recv = ctx.socket(zmq.PULL)
        self._wake_recv.bind(address)
        self._wake_send = ctx.socket(zmq.PUSH)  # shared by the threads: sent under the lock
        self._wake_send.connect(address)
        self._lock = threading.Lock()
        self._closed = False
        self._poller = poller
        poller.register(self._wake_recv, zmq.POLLIN)  # a result wakes the loop's poll
        for i in range(self.threads):
            threading.Thread(target=self._work, args=(runner, on_thread), name=f"tensor_{i}", daemon=True).start()

    def send(self, task: Message) -> None:
        """From the loop thread: a task for the next free thread."""
        self._tasks.put(task)

    def _work(self, runner, on_thread) -> None:
        if on_thread is not None:
            on_thread()
        run = runner()
        while (task := self._tasks.get()) is not None and not self._closed:
            try:
                result = run.run(task, copy_rows=True)
            except Exception as e:  # noqa: BLE001  (reported as the copy's failure; the task is relaunched)
                result = Message("result", {"task": task.get("task"), "failed": f"{type(e).__name__}: {e}"[:300]})
            if result is None:  # a part that gives nothing back (its sums come with the last)
                continue
            try:  # as a socket would carry them: what a worker could not send fails its task
                result.fields = carried_fields("result", result.fields | {"lease": DIRECT})
            except ProtocolError as e:
                result = Message("result", {"task": task.get("task"), "failed": str(e)[:300], "lease": DIRECT})
            self._results.put(result)
            with self._lock:
                if self._closed:
                    return
                self._wake_send.send(b"", zmq.NOBLOCK)

    def serve(self, handle, rejected: tuple, on_rejected) -> None:
        """On the loop thread: ``handle(self, result)`` for every result in; a result the handler rejects is
        counted (``on_rejected(error)``), as on a socket."""
        while self._wake_recv.poll(0):
            self._wake_recv.recv()
        while True:
            try:
                result = self._results.get_nowait()
            except queue.Empty:
                return
            try:
                handle(self, result)
            except rejected as e:
                on_rejected(e)

    def close(self) -> None:
        with self._lock:  # no thread is sending on the socket being closed
            self._closed = True
            self._wake_send.close(0)
        for _ in range(self.threads):  # wakes every idle thread
            self._tasks.put(None)
        self._poller.unregister(self._wake_recv)
        self._wake_recv.close(0)

