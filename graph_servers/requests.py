"""What others ask of a graph server: each request of a tensor worker, a peer or the driver, checked and
turned into an event for the scheduler.

Requests are dispatched by op to ``_on_<op>``. A worker's ``pull_rows`` and ``push_result`` are answered
by the instructions the scheduler gives back (``Serve``, ``Cancel``, ``Accept``: ``server.py``), through
:meth:`Requests._answer`; a ``push_block`` is staged and never answered (its task's ``push_result``
commits or fails for it); a peer's ``ghosts`` and ``progress`` are answered ``ok`` once stored. Every
field is checked before anything is written (``wire.py``, ``task_io.py``): a malformed request is
refused with a :class:`~dorylus_py.protocol.ProtocolError`, and the server keeps serving.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from dorylus_py.pipeline import events as ev
from dorylus_py.protocol import Message, ProtocolError, integer, require
from graph_servers.direct import DirectSlot
from graph_servers.received import ALL_CHUNKS
from graph_servers.task_io import check_result, chunk_rows, per_row_widths, streams, task_block
from graph_servers.wire import ghost_positions, held_tokens, peer_rows, run_id, task_of

OPS = ("pull_rows", "push_block", "push_result", "ghosts", "progress")  # each served by ``_on_<op>``


class Request(NamedTuple):
    """The request an event came from, for the instructions that answer it."""

    identity: object  # a socket's peer, or the DirectSlot of an in-process worker
    req: str | None  # the requester's id for the reply
    op: str


class Requests:
    """The graph server's request side (a part of :class:`~graph_servers.server.GraphServer`: it uses the
    server's ``state``, ``scheduler``, ``staging``, ``node``, ``peers``, ``usage``, ``stats`` and ``feed``)."""

    def __init__(self):
        self.serves = {op: getattr(self, f"_on_{op}") for op in OPS}

    def handle(self, identity, msg: Message) -> None:
        if not isinstance(identity, DirectSlot):  # in-process requests cross no socket
            self.usage.received(msg)
        serve = self.serves.get(msg.op)
        if serve is None:
            raise ProtocolError(f"op {msg.op} is not served by a graph server")
        req = msg.get("req")
        serve(Request(identity, req if isinstance(req, str) else None, msg.op), msg)

    def _on_pull_rows(self, request: Request, msg: Message) -> None:
        s = self.state
        require(msg, "task")
        key, attempt = task_of(msg["task"], s.layers, s.chunks, self.kinds)
        held_tokens(msg.get("have"))  # checked before the scheduler hears of the pull; Serve reads it
        task_block(s, key, msg)
        self.feed(ev.TaskPulled(key, attempt, time.time()), request, msg)

    def _on_push_block(self, request: Request, msg: Message) -> None:
        """Staged, unanswered: the task's push_result commits or fails for it."""
        s = self.state
        require(msg, "task")
        key, attempt = task_of(msg["task"], s.layers, s.chunks, self.kinds)
        lo, hi = task_block(s, key, msg, required=True)
        if self.scheduler.tracker.copy_running(key, attempt):  # else a late copy's: not kept
            self.staging.add((key, attempt, run_id(msg)), chunk_rows(s, key.chunk), lo, hi, msg.tensors,
                             per_row_widths(s, key))
            self.stats["blocks"] += 1

    def _on_push_result(self, request: Request, msg: Message) -> None:
        s = self.state
        require(msg, "task")
        key, attempt = task_of(msg["task"], s.layers, s.chunks, self.kinds)
        streamed, running = msg.get("streamed") is True and streams(s, key), self.scheduler.tracker.is_running(key)
        if streamed and running:
            msg.tensors.update(self.staging.take((key, attempt, run_id(msg)), per_row_widths(s, key)))
        if running or not streamed:  # a late streamed copy carries no rows: it is told it is a duplicate
            check_result(s, key, msg)
        self.feed(ev.TaskResult(key, attempt, time.time(), msg.get("version")), request, msg)
        if streamed:
            self.staging.forget(key)  # accepted, or done before: no copy's blocks are wanted now

    def _on_ghosts(self, request: Request, msg: Message) -> None:
        s = self.state
        phase, src, epoch, layer, src_chunk, min_epoch = peer_rows(msg, s.layers)
        self._check_peer_epoch(epoch, "ghosts")
        self._check_peer_progress(min_epoch)
        if not s.sync and phase in ("fwd", *s.phases):  # how stale async reads are, for the end log line
            self.stats["peer_rows_fresh" if self.scheduler.reads_ahead(phase, epoch, layer) else "peer_rows_late"] += 1
        s.store_peer_rows(phase, src, layer, src_chunk, msg.tensors | {"positions": ghost_positions(msg)})
        self.node.reply(request.identity, Message("ok", {}))
        covers = s.chunk_counts[src] if src_chunk == ALL_CHUNKS else 1  # a sync sum stands for all its chunks
        self.feed(ev.RowsArrived(phase, epoch, layer, src, covers))
        self.feed(ev.PeerProgress(src, min_epoch))

    def _on_progress(self, request: Request, msg: Message) -> None:
        require(msg, "src", "min_epoch")
        src = integer(msg["src"], "src")
        if src not in self.peers:
            raise ProtocolError(f"progress from unexpected source {src}")
        min_epoch = integer(msg["min_epoch"], "min_epoch", 1)
        self._check_peer_progress(min_epoch)
        self.node.reply(request.identity, Message("ok", {}))
        self.feed(ev.PeerProgress(src, min_epoch))

    def _check_peer_epoch(self, epoch: int, what: str) -> None:
        """A peer's rows must be of an epoch this server can be at: rows of another would overwrite live ones."""
        if not self.scheduler.expects_peer_epoch(epoch):
            raise ProtocolError(f"{what} of epoch {epoch}: not an epoch near this server's {self.scheduler.pipe.min_epoch()}")

    def _check_peer_progress(self, min_epoch: int) -> None:
        """A peer's slowest epoch cannot be past the end of the job, nor further ahead than staleness allows."""
        sched = self.scheduler
        if min_epoch > min(sched.epochs + 1, sched.pipe.min_epoch() + sched.staleness + 2):
            raise ProtocolError(f"a peer at epoch {min_epoch}: further ahead than this server's "
                                f"{sched.pipe.min_epoch()} allows")

    def on_driver(self, msg: Message) -> None:
        """``recorded``: the driver has recorded every epoch up to ``epoch`` (no epoch starts more than
        ``DRIVER_LAG`` past it). ``switch``: the switch back to sync mode, in two steps so that no server
        has started the switch epoch: freeze (start no epoch beyond those already started, and say how far
        that is); then the driver's ``at_epoch``, one past every server's frozen epoch, is where sync
        mode begins."""
        if msg.op == "recorded":
            require(msg, "epoch")
            self.feed(ev.DriverRecorded(integer(msg["epoch"], "epoch", 1)))
        elif msg.op == "switch":
            at = msg.get("at_epoch")
            self.feed(ev.Freeze() if at is None else ev.SwitchAt(integer(at, "at_epoch", 1)))

    def _answer(self, request: Request, reply: Message) -> None:
        reply.fields["req"] = request.req
        if isinstance(request.identity, DirectSlot):
            request.identity.answer(reply)
            return
        self.usage.sent(reply)
        self.node.reply(request.identity, reply)
