"""The receive thread's side of a decentralised worker (:class:`~dorylus_py.decentral.node.Node`): each
peer request and notice, every field checked before it touches the worker's state, handled by
``_on_<op>``: steals from the tail of the work queue, gossip exchanges with this worker's current
parameters and gradient, snapshots, pings; reports, deaths, the recorder's rows, averages, stop."""

from __future__ import annotations

import numpy as np

from dorylus_py.protocol import Message, ProtocolError, integer, require
from dorylus_py.protocol.bounded_json import parse

MAX_REPORT_BYTES = 64 * 2**20  # a worker's task rows of one epoch, as JSON


class PeerRequests:
    """Mixed into ``Node``, whose state (pool, ledger, mailbox, lock) the handlers read and change."""

    def _handle(self, sender: int, msg: Message) -> Message | None:
        with self.lock:
            if sender in self.pool.dead and msg.op != "dead":
                return Message("error", {"reason": f"worker {sender} was declared dead", "declared_dead": True})
        handler = {"steal": self._on_steal, "mix": self._on_mix, "snapshot": self._on_snapshot, "ping": self._on_ping,
                   "dead": self._on_dead, "report": self._on_report, "row": self._on_row, "average": self._on_average,
                   "stop": self._on_stop}.get(msg.op)
        if handler is None:
            raise ProtocolError(f"op {msg.op} is not for a decentralised worker")
        return handler(sender, msg)

    def _on_steal(self, sender: int, msg: Message) -> Message:
        epoch, cycle = _int(msg["epoch"]), msg.get("cycle")
        if cycle is not None and not (isinstance(cycle, (int, float)) and cycle > 0):
            raise ProtocolError(f"steal: bad cycle {cycle!r}")
        with self.lock:
            items = self.pool.serve_steal(sender, epoch, cycle, self.cycle)
        return Message("batches", {"items": [list(i) for i in items]})

    def _on_mix(self, sender: int, msg: Message) -> Message:
        with self.lock:
            tensors, fields = self.share()
            self.mailbox.extend(self._shared_of(sender, msg, tensors["params"]))
        return Message("params", fields, tensors)

    def _on_snapshot(self, sender: int, msg: Message) -> Message:
        epoch, keep = _int(msg["epoch"]), bool(msg.get("keep"))
        if keep and not 1 <= epoch <= self.cfg.epochs:  # bounded: no peer makes us keep snapshots without end
            raise ProtocolError(f"snapshot: epoch {epoch} is not one of this run's 1..{self.cfg.epochs}")
        with self.lock:
            mine = self.params()
            if keep:
                self.kept[epoch] = mine
        return Message("params", {"epoch": epoch}, {"params": mine})

    def _on_ping(self, sender: int, msg: Message) -> Message:
        return Message("ok")

    def _on_dead(self, sender: int, msg: Message) -> None:
        dead, why = _int(msg["dead"]), str(msg.get("why", ""))[:200]
        if dead == self.rank:
            self._left_out(sender)
        elif 0 <= dead < self.world:
            self.declare_dead(dead, f"told by worker {sender}: {why}")  # news is passed on

    def _on_report(self, sender: int, msg: Message) -> None:
        require(msg, "epoch", "batches", "left", "loss_sum", "count", "exchanges", shapes={"tasks": (None,)})
        epoch, batches = _int(msg["epoch"]), msg["batches"]
        if not 1 <= epoch <= self.cfg.epochs or not isinstance(batches, list) or not all(
                0 <= _int(b) < self.per_epoch for b in batches):
            raise ProtocolError(f"report from worker {sender}: bad epoch or batches")
        tasks = parse(bytes(msg.tensors["tasks"]), MAX_REPORT_BYTES, f"report from worker {sender}: tasks")
        if not isinstance(tasks, list):
            raise ProtocolError(f"report from worker {sender}: tasks is not a list")
        with self.lock:
            self.ledger.add(sender, epoch, batches, bool(msg["left"]), float(msg["loss_sum"]), _int(msg["count"]),
                            tasks, _int(msg["exchanges"]))
        self._poked.set()

    def _on_row(self, sender: int, msg: Message) -> None:
        row = msg["row"]
        if not isinstance(row, dict) or not isinstance(row.get("epoch"), int):
            raise ProtocolError(f"row from worker {sender}: not a metrics row")
        with self.lock:
            self.ledger.add_row(row)
            if "best" in msg.tensors:
                self.best_params = np.array(self.params_of(msg, "best"))

    def _on_average(self, sender: int, msg: Message) -> None:
        epoch, average = _int(msg["epoch"]), self.params_of(msg)
        with self.lock:
            if epoch in self.kept:  # keep what this worker learnt since its snapshot: add the snapshot's shift
                self.mailbox.append(("average", average - self.kept.pop(epoch)))

    def _on_stop(self, sender: int, msg: Message) -> None:
        if msg.get("error"):
            self._fail(f"stopped by worker {sender}: {str(msg['error'])[:500]}")
        with self.lock:
            self.pool.stop()
            self.wake.notify_all()

    def _shared_of(self, peer: int, msg: Message, mine: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """What gossip partner ``peer`` sent, as mailbox entries: the shift half-way from ``mine`` (this
        worker's parameters when the two exchanged) to its parameters; its latest gradient, unless this
        worker has had that one already (a slow peer is asked again before it has a new one)."""
        mail = [("shift", 0.5 * (self.params_of(msg) - mine))]
        step = msg.get("grad_step")
        if "grad" in msg.tensors and is_int(step) and step > self.grads_seen.get(peer, 0):
            self.grads_seen[peer] = step
            mail.append(("grad", np.array(self.params_of(msg, "grad"))))
        return mail

    def params_of(self, msg: Message, name: str = "params") -> np.ndarray:
        require(msg, shapes={name: (self.n_params,)})
        if msg.tensors[name].dtype != np.float32:
            raise ProtocolError(f"op {msg.op}: {name} must be float32")
        return msg.tensors[name]

def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value) -> int:
    """A peer's count, epoch or rank (protocol.integer: never negative)."""
    return integer(value, "a peer's field")
