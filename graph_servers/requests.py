"""What others ask of a graph server: each message of a tensor worker, a peer or the driver, checked and
turned into an event for the scheduler.

Messages are dispatched by op to ``_on_<op>``. A worker's lease says hello (``lease``), sends a
``result`` for each task it was sent (a streamed task: one per part) and says when it stops
(``leave``); none of these is answered, except a hello from no lease of ours, which is told to stop
(``release``). A peer's ``ghosts`` and ``progress`` are answered ``ok`` once stored. Every field is
checked before anything is written (``wire.py``, ``task_io.py``): a malformed message is refused with a
:class:`~dorylus_py.protocol.ProtocolError`, and the server keeps serving. A result is taken only from
the lease its task was sent to, and only for a copy still out there.
"""

from __future__ import annotations

import time

from dorylus_py.pipeline import events as ev
from dorylus_py.protocol import Message, ProtocolError, integer, require
from dorylus_py.serving.node import Peer
from graph_servers.received import ALL_CHUNKS
from graph_servers.task_io import check_result, chunk_rows, per_row_widths, streams
from graph_servers.wire import held_tokens, lease_of, part_of, peer_rows, ghost_positions, task_of

OPS = ("lease", "result", "leave", "ghosts", "progress")  # each served by ``_on_<op>``


class Requests:
    """The graph server's request side (a part of :class:`~graph_servers.server.GraphServer`: it uses the
    server's ``state``, ``scheduler``, ``dispatcher``, ``staging``, ``node``, ``peers``, ``usage``,
    ``stats`` and ``feed``)."""

    def __init__(self):
        self.serves = {op: getattr(self, f"_on_{op}") for op in OPS}

    def handle(self, identity, msg: Message) -> None:
        if identity is not self.direct:  # in-process results cross no socket
            self.usage.received(msg)
        serve = self.serves.get(msg.op)
        if serve is None:
            raise ProtocolError(f"op {msg.op} is not served by a graph server")
        serve(identity, msg)

    def _on_lease(self, identity, msg: Message) -> None:
        lease = lease_of(msg)
        if not self.dispatcher.hello(lease, identity, held_tokens(msg.get("have")), time.time()):
            self._reply(identity, Message("release", {"lease": lease, "reason": "no lease of this server"}))

    def _on_leave(self, identity, msg: Message) -> None:
        """A lease that leaves (idle, or near its time limit) runs nothing after its last result: the copies
        it was sent and never ran go back to the front of the queue, as they were (not a failure). Its
        worker waits for the ``release`` that answers it, so its invocation ends only after everything
        it sent was read here."""
        lease = self._lease(identity, msg)
        if lease is not None:
            for copy in reversed(self._end_lease(lease)):
                self.staging.forget(*copy)  # the parts of a streamed copy it ran before it left, if any
                if self.scheduler.tracker.copy_running(*copy):
                    self.dispatcher.queue.appendleft(copy)
        self._reply(identity, Message("release", {"lease": lease_of(msg), "reason": "goodbye"}))

    def _on_result(self, identity, msg: Message) -> None:
        s, lease = self.state, self._lease(identity, msg)
        if lease is None:  # late, from a lease already over (its copies failed or were done): nothing to take
            return
        require(msg, "task")
        key, attempt = task_of(msg["task"], s.layers, s.chunks, self.kinds)
        copy, now = (key, attempt), time.time()
        if copy not in self.dispatcher.leases[lease].out:
            raise ProtocolError(f"result of a task this lease was not sent: {key} attempt {attempt}")
        failed = msg.get("failed")
        if failed is not None:
            self._copy_ended(lease, copy, now, False, f"the worker: {str(failed)[:200]}")
            return
        part = part_of(msg.get("part"), chunk_rows(s, key.chunk))
        if part is not None:
            if not streams(s, key):
                raise ProtocolError(f"{key.kind} tasks of this model are not streamed")
            widths = per_row_widths(s, key)
            if widths:  # a task without per-row outputs sends only its last part, with the sums
                self.staging.add(copy, chunk_rows(s, key.chunk), *part,
                                 {k: v for k, v in msg.tensors.items() if not k.startswith("grad:")}, widths)
                self.stats["blocks"] += 1
            if msg.get("last") is not True:
                return
            msg.tensors.update(self.staging.take(copy, widths))
        check_result(s, key, msg)
        held = held_tokens(msg["have"]) if "have" in msg.fields else None
        self.dispatcher.finished(lease, copy, held, now)
        self.feed(ev.TaskResult(key, attempt, now, msg.get("version")), None, msg)
        self._copy_ended(lease, copy, now, True, "")

    def _reply(self, identity, msg: Message) -> None:
        """An answer on the ROUTER, counted with what the server sends."""
        self.usage.sent(msg)
        self.node.reply(identity, msg)

    def _lease(self, identity, msg: Message) -> str | None:
        """The lease a worker's message names, which must be the sender's own; None when that lease is
        over (the server released it, or its invocation ended before this message was read: a race the
        two channels allow, not a refusal)."""
        lease = lease_of(msg)
        one = self.dispatcher.leases.get(lease)
        if one is None and lease in self.leases_over and _same(self.leases_over[lease], identity):
            return None
        if one is None or not _same(one.peer, identity):
            raise ProtocolError(f"{msg.op} from a worker that is not lease {lease!r:.40}")
        one.peer = identity  # the same session; its route changes if its socket reconnected
        return lease

    def _on_ghosts(self, identity, msg: Message) -> None:
        s = self.state
        phase, src, epoch, layer, src_chunk, min_epoch = peer_rows(msg, s.layers)
        self._check_peer_epoch(epoch, "ghosts")
        self._check_peer_progress(min_epoch)
        if not s.sync and phase in ("fwd", *s.phases):  # how stale async reads are, for the end log line
            self.stats["peer_rows_fresh" if self.scheduler.reads_ahead(phase, epoch, layer) else "peer_rows_late"] += 1
        s.store_peer_rows(phase, src, layer, src_chunk, msg.tensors | {"positions": ghost_positions(msg)})
        self._reply(identity, Message("ok", {}))
        covers = s.chunk_counts[src] if src_chunk == ALL_CHUNKS else 1  # a sync sum stands for all its chunks
        self.feed(ev.RowsArrived(phase, epoch, layer, src, covers))
        self.feed(ev.PeerProgress(src, min_epoch))

    def _on_progress(self, identity, msg: Message) -> None:
        require(msg, "src", "min_epoch")
        src = integer(msg["src"], "src")
        if src not in self.peers:
            raise ProtocolError(f"progress from unexpected source {src}")
        min_epoch = integer(msg["min_epoch"], "min_epoch", 1)
        self._check_peer_progress(min_epoch)
        self._reply(identity, Message("ok", {}))
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



def _same(peer, identity) -> bool:
    """Whether a message from ``identity`` is from the worker ``peer`` (a lease's, or None: never connected):
    the same in-process threads, or the same session (its route may change on a reconnect)."""
    return peer is identity or peer is None or (isinstance(peer, Peer) and isinstance(identity, Peer)
                                                and peer.sender == identity.sender)
