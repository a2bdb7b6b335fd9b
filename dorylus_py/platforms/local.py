"""The local Lambda emulator: worker processes that run the real handler on the real event JSON.

``concurrency`` processes stay warm (like Lambda containers, they keep their sockets between
invocations); the first invocation on each waits ``cold_start_ms`` first, as a new container would.
An invocation is a lease (``worker/event.py``): it serves its graph server's tasks until released,
idle or out of time. ``bandwidth_mbps`` caps each worker's transfers, each way
(``dorylus_py/worker/link.py``). Each invocation can be delayed by ``latency_ms`` (invoke latency), and
each task it runs, with probability ``fail_rate``, makes it fail: at once or part-way through, by
running its clock out (``LambdaContext``), which exercises the relaunch path with partial effects.
Billed duration is the handler's run time rounded up to 1 ms, at ``memory_mb``: a lease is billed
while it waits for tasks, as AWS bills a function that waits.

Each worker gets the job key in its own environment (``DORYLUS_KEY``, passed with its start-up arguments,
not on a command line), where the handler reads it at its cold start, as a real Lambda reads its own.

A worker that dies (``kill -9``, out of memory) fails the invocation it was running and is replaced
by a new, cold one: like Lambda, the pool itself never breaks. As AWS kills a function at its timeout, a
worker still running an invocation ``KILL_GRACE_S`` after its time limit (frozen, stopped, stuck in a
call) is killed, the invocation fails with Lambda's ``Task timed out`` and a fresh worker takes its
place, so the task's relaunch finds a worker even in a pool of one. One dispatcher thread hands queued
invocations to idle workers and collects their answers; the graph server only sees completions.

The pool can be resized while it runs (``--lambdas auto``). Growing first takes back *parked* workers
(still warm), then starts new, cold ones; shrinking parks idle workers (a busy one finishes its task
first), and a worker parked for ``park_s`` is stopped, as AWS reclaims an idle container.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import random
import select
import threading
import time
from multiprocessing.connection import wait

from dorylus_py.platforms.base import (
    Completion,
    LambdaContext,
    Platform,
    PoolLoad,
    billed_ms,
)
from dorylus_py.timescale import scaled
from dorylus_py.worker.event import LeaseEvent

KILL_GRACE_S = 2.0  # past its time limit, a worker still running an invocation is killed (the handler stops itself before)


def _invoke(payload: str, latency_ms: float, fail_rate: float, timeout_ms: int, seed: int, bandwidth_mbps: float) -> tuple:
    """Runs in a worker process; returns (start, end, run_seconds, ok, error, what the handler returned)."""
    if latency_ms:
        time.sleep(latency_ms / 1000)
    start = time.time()
    event = json.loads(payload)  # exactly what AWS would hand the function
    t0 = time.perf_counter()
    try:
        from dorylus_py.worker.handler import handler

        output = handler(event, LambdaContext(timeout_ms, None, bandwidth_mbps, fail_rate, seed))
        ok, err = True, ""
    except Exception as e:  # noqa: BLE001  (a failed Lambda; the graph server relaunches its tasks)
        ok, err, output = False, f"{type(e).__name__}: {e}", None
    return start, time.time(), time.perf_counter() - t0, ok, err, output


def _worker_main(conn, cold_start_ms: float, key_hex: str) -> None:
    """A warm container: import once, then run invocations one at a time until the pipe closes."""
    import torch

    from dorylus_py.cgroups import join_own
    from dorylus_py.jobkey import KEY_ENV

    if key_hex:  # else the one this process inherited
        os.environ[KEY_ENV] = key_hex

    torch.set_num_threads(1)  # one vCPU-ish per emulated Lambda; many run at once
    join_own("lambda")  # a scale model's Lambda is a host of its own (cgroups.py); else nothing
    _exit_when_closed(conn)
    import dorylus_py.worker.handler  # noqa: F401  (import torch and the kernels once, as a warm container)

    conn.send("ready")
    cold = cold_start_ms > 0
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if cold:
            time.sleep(cold_start_ms / 1000)
            cold = False
        conn.send(_invoke(*job))


def _exit_when_closed(conn) -> None:
    """Exit as soon as the graph server's end of ``conn`` is gone (it died, even by ``kill -9``). Not by
    watching the parent: that is the fork server, which lives as long as any worker it forked holds
    its lifeline, so each would wait for the other."""
    def watch() -> None:
        p = select.poll()
        p.register(conn.fileno(), 0)  # no events asked for: poll reports only a hang-up or an error
        while not p.poll():
            pass
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-graph-server", daemon=True).start()


def _worker_context():
    """Workers fork from a server process that imported torch and the handler once (the first worker's
    start), not from this process: no zmq contexts or torch thread pools are forked, and a new worker is
    ready in milliseconds instead of the second of CPU an import of torch takes, which a growing pool
    (``--lambdas auto``) would take from the job on the same cores. A container's cold start is
    ``cold_start_ms``, not this machine's import time. The fork server starts with ``-c`` and the workers
    take this process's ``sys.path``: neither holds the working folder because this process was started
    through ``children.py`` (``-P`` and ``PYTHONSAFEPATH=1``, which multiprocessing passes on)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "dorylus_py.worker.handler"])
    return ctx


class _Worker:
    def __init__(self, ctx, cold_start_ms: float, key_hex: str):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, cold_start_ms, key_hex), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.task: dict | None = None  # the invocation it is running
        self.deadline = 0.0  # monotonic time by which that invocation must have answered
        self.cold = cold_start_ms > 0  # its first invocation waits the cold start
        self.parked_at: float | None = None  # parked (in no pool, no tasks) since; None: in the pool


class LocalLambdaPlatform(Platform):
    name = "local-lambda"
    resizable = True

    def __init__(self, concurrency: int, latency_ms: float = 0.0, fail_rate: float = 0.0, memory_mb: int = 3008,
                 timeout_s: float = 60.0, seed: int = 0, cold_start_ms: float = 0.0, warm_timeout_s: float = 180.0,
                 key: bytes = b"", park_s: float = 60.0, bandwidth_mbps: float = 0.0):
        super().__init__()
        self._key_hex = key.hex()  # the job key, for the workers' environment
        self.latency_ms, self.fail_rate, self.memory_mb = latency_ms, fail_rate, memory_mb
        self.cold_start_ms, self.park_s, self.bandwidth_mbps = cold_start_ms, park_s, bandwidth_mbps
        self.timeout_ms = int(timeout_s * 1000)
        self.rng = random.Random(seed)
        self.replaced = 0  # workers that died and were replaced
        self.timed_out = 0  # workers killed at their invocation's timeout (and replaced)
        self.size = max(1, concurrency)  # workers asked for
        self._ctx = _worker_context()
        self._pending: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_recv, self._wake_send = self._ctx.Pipe(duplex=False)
        self._closed = threading.Event()
        self._workers = [self._spawn() for _ in range(self.size)]
        self._parked: list[_Worker] = []
        deadline = time.monotonic() + scaled(warm_timeout_s)
        for w in self._workers:  # every container warm before the first task, as the pool promised
            if not w.conn.poll(max(0.0, deadline - time.monotonic())):
                self.close()
                raise RuntimeError(f"an emulated Lambda worker did not start within {warm_timeout_s:.0f} s")
            w.ready = w.conn.recv() == "ready"
        self._thread = threading.Thread(target=self._dispatch, name="local-lambda", daemon=True)
        self._thread.start()

    def _spawn(self) -> _Worker:
        return _Worker(self._ctx, self.cold_start_ms, self._key_hex)

    @property
    def startup_hint_s(self) -> float:
        """What the first invocations may take before they start: the cold start and the latency."""
        return (self.cold_start_ms + self.latency_ms) / 1000

    @property
    def concurrency(self) -> int:
        return self.size

    def invoke(self, event: LeaseEvent) -> None:
        self._pending.put(({"lease": event.lease}, (json.dumps(event.to_dict()), self.latency_ms, self.fail_rate,
                                                    self.timeout_ms, self.rng.getrandbits(32), self.bandwidth_mbps)))
        self._wake_send.send_bytes(b"")

    def resize(self, size: int) -> None:
        self.size = max(1, size)
        self._wake_send.send_bytes(b"")

    def load(self) -> PoolLoad:
        workers = list(self._workers)  # the dispatcher thread changes the list
        return PoolLoad(sum(w.ready for w in workers), self._pending.qsize(), sum(w.task is not None for w in workers))

    def _fit(self) -> None:
        """Bring the pool to ``size`` (dispatcher thread): unpark or start workers, park idle ones, and
        stop those parked too long."""
        if self._closed.is_set():
            return
        while len(self._workers) < self.size:
            w = self._parked.pop() if self._parked else self._spawn()
            w.parked_at = None
            self._workers.append(w)
        for w in [w for w in self._workers if w.task is None][: max(0, len(self._workers) - self.size)]:
            self._workers.remove(w)
            w.parked_at = time.monotonic()
            self._parked.append(w)
        for w in [w for w in self._parked if time.monotonic() - w.parked_at > scaled(self.park_s)]:
            self._parked.remove(w)
            self._stop(w)

    def _dispatch(self) -> None:
        while not self._closed.is_set():
            self._fit()
            self._expire_overdue()
            idle = [w for w in self._workers if w.ready and w.task is None]
            while idle and not self._pending.empty():
                task, job = self._pending.get()
                w = idle.pop()
                w.task, w.deadline, w.cold = task, time.monotonic() + self._allowed_s(w), False
                try:
                    w.conn.send(job)
                except (OSError, ValueError):  # it died just now: its sentinel says so below
                    pass
            everyone = self._workers + self._parked
            watched = {w.conn: w for w in everyone} | {w.proc.sentinel: w for w in everyone}
            busy = [w.deadline - time.monotonic() for w in self._workers if w.task is not None]
            for ready in wait([self._wake_recv, *watched], timeout=max(0.0, min([1.0, *busy]))):
                if ready is self._wake_recv:
                    self._drain_wake()
                    continue
                w = watched[ready]
                if ready is w.conn:
                    self._answer(w)
                elif not w.proc.is_alive():
                    self._replace(w)

    def _allowed_s(self, w: _Worker) -> float:
        """How long an invocation handed to ``w`` may take to answer: its emulated latency and cold start, the
        function's timeout, and the grace."""
        return (self.latency_ms + (self.cold_start_ms if w.cold else 0.0) + self.timeout_ms) / 1000 + scaled(KILL_GRACE_S)

    def _expire_overdue(self) -> None:
        """Kill each worker past its invocation's deadline (dispatcher thread)."""
        now = time.monotonic()
        for w in [w for w in self._workers if w.task is not None and now >= w.deadline and not w.conn.poll()]:
            self._expire(w)

    def _expire(self, w: _Worker) -> None:
        """What AWS does at a function's timeout: the invocation fails, billed in full, and its container
        (here: the worker process, even a stopped one) is killed; a fresh worker takes its place."""
        self._stop(w)
        self._workers[self._workers.index(w)] = self._spawn()
        self.timed_out += 1
        end = time.time()
        self._done.put(Completion(w.task, self.name, end - self.timeout_ms / 1000, end, self.timeout_ms, self.memory_mb,
                                  False, f"Sandbox.Timedout: Task timed out after {self.timeout_ms / 1000:.2f} seconds"))

    def _drain_wake(self) -> None:
        while self._wake_recv.poll():
            self._wake_recv.recv_bytes()

    def _answer(self, w: _Worker) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            return  # the process is gone; its sentinel fires too
        if msg == "ready":
            w.ready = True
            return
        task, w.task = w.task, None
        start, end, run_s, ok, err, output = msg
        self._done.put(Completion(task, self.name, start, end, billed_ms(run_s), self.memory_mb, ok, err, output))

    def _replace(self, w: _Worker) -> None:
        # (a worker's sentinel is its fork server's status pipe: were the fork server killed, every worker
        # would look dead and be replaced, each closing its pipe, so none is left behind)
        if w in self._parked:  # nothing to replace: a parked worker is in no pool
            self._parked.remove(w)
            w.conn.close()
            return
        if self._closed.is_set() or w not in self._workers:
            return
        if w.task is not None:
            now = time.time()
            self._done.put(Completion(w.task, self.name, now, now, 0, self.memory_mb, False,
                                      f"worker died (exit code {w.proc.exitcode})"))
        w.conn.close()
        self._workers[self._workers.index(w)] = self._spawn()
        self.replaced += 1

    @staticmethod
    def _stop(w: _Worker) -> None:
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(timeout=5)
        w.conn.close()

    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def close(self) -> None:
        """Stop at once: a graph server that ends must not wait on a task that is stuck."""
        self._closed.set()
        if hasattr(self, "_thread"):  # first the dispatcher, which changes the pool
            self._wake_send.send_bytes(b"")
            self._thread.join(timeout=5)
        everyone = getattr(self, "_workers", []) + getattr(self, "_parked", [])
        for w in everyone:  # all killed first, then each joined
            if w.proc.is_alive():
                w.proc.kill()
        for w in everyone:
            self._stop(w)

