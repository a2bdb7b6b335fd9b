"""A graph server's leases: the copies of its tensor tasks sent to warm workers, and the workers' lifetimes.

A part of :class:`~graph_servers.server.GraphServer` (it uses the server's ``spec``, ``state``,
``scheduler``, ``platform``, ``node``, ``direct``, ``staging``, ``usage``, ``stats``, ``task_rows`` and
``feed``). The decisions are the pure :class:`~dorylus_py.pipeline.leases.Dispatcher`'s (which lease
runs which copy, when to start or release one); this is its shell: a copy the scheduler launches
(``Invoke``) waits for a lease; a copy sent (``Serve``) is one ``task`` message with its rows (a
streamed task: one per part); leases are invoked on the platform (``lease_event``), their results come
in through ``requests.py``, and the end of a lease's invocation (a platform completion) fails the copies
it still held. Each lease is a row of ``leases.jsonl``: what AWS bills, its waiting included.
"""

from __future__ import annotations

import os
import time

from dorylus_py.pipeline import events as ev
from dorylus_py.pipeline.leases import Lease
from dorylus_py.platforms.base import PoolLoad
from dorylus_py.protocol import Message
from dorylus_py.protocol.quantize import narrowed
from dorylus_py.timescale import scaled
from dorylus_py.worker.event import TaskRef
from graph_servers.direct import DIRECT
from graph_servers.task_io import STATIC, has_static, task_parts, task_rows
from graph_servers.wire import lease_event

LEASE_DEPTH = 2  # tasks out on one lease at once: the next one's rows travel while it computes
FLUSH_S = 5.0  # at the end, how long the server waits for its leases to end (their billing rows)
LEASES_REMEMBERED = 4096  # leases over whose late messages are dropped quietly (each a few bytes)


class Leasing:
    def _lease_event(self, lease: str, device: str = "cpu"):
        """The event a worker is invoked with for ``lease`` (this server's own threads: ``device``'s)."""
        return lease_event(self.spec, self.k, self.node.address, self.node.gate, self.node.session.job, lease,
                           max(1, round(self.spec.config.lease_idle_ms)), device)

    # --- leases: copies to workers ------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Send waiting copies to leases with room, start the leases the waiting copies need, release those
        beyond a shrunk pool (``pipeline/leases.py`` decides)."""
        d, now = self.dispatcher, time.time()
        d.forget(lambda key: not self.scheduler.tracker.is_running(key))
        tokens = self.static_tokens
        for lease, copy in d.assign(lambda key: tokens[key.chunk] if tokens and has_static(key) else None, now):
            self.feed(ev.TaskPulled(copy[0], copy[1], now), (lease, copy), None)
        for _ in range(d.to_start()):
            lease = os.urandom(8).hex()
            d.started(lease, now)
            self.leases_alive[lease] = now
            self.stats["leases"] += 1
            self.platform.invoke(self._lease_event(lease))
        for lease in d.to_release():
            self._send_lease(lease, Message("release", {"lease": lease.id, "reason": "the pool shrank"}))
            self._lease_ended(lease.id, "released")

    def _send_lease(self, lease: Lease, msg: Message) -> None:
        if lease.peer is self.direct:
            lease.peer.send(msg)
            return
        self.usage.sent(msg)
        self.node.reply(lease.peer, msg)

    def _lease_ended(self, lease: str, why: str) -> None:
        """A lease is over: the copies it still held failed (the scheduler relaunches them)."""
        now = time.time()
        for key, attempt in self._end_lease(lease):
            self._copy_ended(lease, (key, attempt), now, False, why)

    def _end_lease(self, lease: str) -> list[tuple]:
        """The copies ``lease`` held, as it ends; its worker is remembered (``leases_over``, the last
        :data:`LEASES_REMEMBERED`), so that what it sent before it knew is dropped, not refused."""
        one = self.dispatcher.leases.get(lease)
        if one is not None:
            self.leases_over[lease] = one.peer
            while len(self.leases_over) > LEASES_REMEMBERED:
                self.leases_over.popitem(last=False)
        return self.dispatcher.ended(lease)

    def _where(self, lease: str) -> str:
        """What ran a lease's copies, as tasks.jsonl names it (``--offload auto``: some ran in the server's
        own thread, as the ``cpu`` backend's do)."""
        return "inproc-cpu" if lease == DIRECT and self.own_direct else self.platform.name

    def _copy_ended(self, lease: str, copy: tuple, now: float, ok: bool, error: str) -> None:
        """A copy's result came (``ok``), or it failed: its row in tasks.jsonl, and the scheduler told."""
        key, attempt = copy
        if not ok:
            self.dispatcher.finished(lease, copy, None, now)
        self.copies.pop(copy, None)
        sent = self.sent_at.pop(copy, now)
        self.stats["completed"] += 1
        self.task_rows.append({"kind": key.kind, "train": key.train, "server": self.k, "chunk": key.chunk,
                               "epoch": key.epoch, "layer": key.layer, "attempt": attempt, "where": self._where(lease),
                               "start": sent, "end": now, "billed_ms": 0, "memory_mb": getattr(self.platform, "memory_mb", 0),
                               "ok": ok, "error": error,
                               "lease": lease})
        if ok and self.auto_pool is not None:
            self.auto_pool.finished(key, now - sent)
        self.feed(ev.TaskEnded(key, attempt, ok, now, error))
        self.staging.forget(key, attempt)

    # --- the pool as the autotuner sees it (--lambdas auto) -------------------------------------------

    resizable = property(lambda self: self.platform.resizable)

    def load(self) -> PoolLoad:
        return PoolLoad(*self.dispatcher.load())

    def resize(self, size: int) -> None:
        self.dispatcher.size = size
        self.platform.resize(size)

    def _on_Invoke(self, inst: ev.Invoke, to, msg) -> None:
        """A copy to run: it waits for a lease with room (``_dispatch``)."""
        self.stats["invoked"] += 1
        self.copies[(inst.key, inst.attempt)] = inst
        self.dispatcher.submit((inst.key, inst.attempt), here=(inst.key.kind, inst.key.layer) in self.here)
        self.epoch_start.setdefault(inst.key.epoch, time.perf_counter())

    def _on_Serve(self, inst: ev.Serve, to: tuple[Lease, tuple], msg) -> None:
        """Send a copy to its lease: the task and its rows in one message (a streamed task: one per part)."""
        lease, (key, attempt) = to
        copy = self.copies[(key, attempt)]
        weighted = self.by_task[(key.kind, key.train, key.layer)].weights is not None
        token = self.static_tokens[key.chunk] if self.static_tokens and has_static(key) else None
        (a, b), ((lo, _), (glo, _)) = self.state.chunk(key.chunk), self.state.edge_runs(key.chunk)
        fields = {"lease": lease.id, "task": TaskRef(key, self.k, copy.version, copy.hold, attempt).to_wire(),
                  "ws": list(self.layer_servers[key.layer]) if weighted else [], "start": a, "stop": b,
                  "id_start": self.spec.id_offsets[self.k] + a, "edge_start": self.state.edge_offset + lo,
                  "ghost_edge_start": self.state.edge_offset + glo} | ({"static": {STATIC: token}} if token else {})
        self.sent_at[(key, attempt)] = time.time()
        for span in task_parts(self.state, key, 0 if lease.here else self.spec.config.stream_rows):
            rows = task_rows(self.state, key, static_held=token is not None and token in lease.held, span=span)
            part = {"part": list(span), "rows": b - a} if span is not None else {}
            self._send_lease(lease, Message("task", fields | part | {"sent": time.time()}, rows,
                                            wire=narrowed(rows, self.spec.config.wire_dtype)))

    def _on_Cancel(self, inst: ev.Cancel, to: tuple[Lease, tuple] | None, msg) -> None:
        """A copy not wanted (its task is done, or not running): a waiting one is not sent; a result is
        refused (a duplicate), and nothing answers it."""
        if to is not None:  # not sent after all: its place on the lease is free again
            lease, copy = to
            self.dispatcher.finished(lease.id, copy, None, time.time())
            self.copies.pop(copy, None)

    def _collect(self) -> None:
        """Leases whose invocation ended: the copies they held failed, and each is a billing row."""
        for c in self.platform.completions():
            lease = c.task.get("lease", "")
            self.leases_alive.pop(lease, None)
            self._lease_ended(lease, c.error or "the lease's invocation ended")
            self.task_rows.append({"kind": "lease", "train": True, "server": self.k, "chunk": None,
                                   "epoch": self.scheduler.pipe.min_epoch(), "layer": None, "attempt": 1,
                                   "where": c.where, "start": c.start, "end": c.end, "billed_ms": c.billed_ms,
                                   "memory_mb": c.memory_mb, "ok": c.ok, "error": c.error, "id": lease,
                                   "tasks": (c.output or {}).get("tasks", 0),
                                   "peak_rss_mb": (c.output or {}).get("peak_rss_mb")})

    def _flush_tasks(self) -> None:
        """Release every lease and wait (bounded) for their invocations to end, so tasks.jsonl has every
        lease's billing row; then send the rows."""
        for lease in list(self.dispatcher.leases.values()):
            if lease.peer is not None and lease.peer is not self.direct:
                self._send_lease(lease, Message("release", {"lease": lease.id, "reason": "the job is done"}))
            self._end_lease(lease.id)
        deadline = time.monotonic() + scaled(FLUSH_S)
        while self.leases_alive and time.monotonic() < deadline:
            self._serve_once(10)
            self._collect()
        self._send_task_rows()
