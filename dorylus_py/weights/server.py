"""The weight-server process: serves versioned weights and takes gradients over ZeroMQ.

Requests (``protocol/messages.py``); tensors are named by block (``W0.1``: rows of ``W0``):
- ``pull_weights {layer, version|null, hold|null, epoch|null}`` -> ``weights {layer, version}`` + this
  server's blocks of the layer (``epoch``: a training task's; with ``--predict-weights`` a version behind
  that epoch's is answered with predicted weights, ``store.py``). A pull of a version that does not exist yet waits (the reply is deferred)
  until an update makes it: at most ``MAX_WAITING`` pulls of at most ``MAX_WAITING_BYTES`` in all.
  ``hold`` is a task key of this job whose gradient has not come yet; a sender holds at most
  ``holds_per_sender`` of them at once, so no peer can pin versions without end.
- ``push_grad {layer, version, key}`` + one gradient per block of the layer here -> ``ok``, ``duplicate``
  or ``refused`` (its values, ``guard.py``: the key counts as come, the gradient adds nothing);
  ``key`` is ``[epoch, server, chunk]`` of a task of this job (a graph server and chunk it has, an epoch
  within the key window of ``guard.py``), and the push must come from that graph server (below).
- Pulls carry no tensors.
- ``pull_state {version|null}`` -> ``state`` + ``BLOCK:FIELD`` for every block here and each of
  ``W``, ``adam_m``, ``adam_v``, ``adam_step``, ``version``: what a checkpoint keeps, every layer at
  the same epoch boundary (deferred like a pull).
- from the driver, ``release {version}``: it has recorded every epoch up to there, so older epoch
  snapshots may go (until then they stay, however far training runs ahead of a slow driver).

The ``start`` message carries the job spec and, when the job resumes from a checkpoint, the state
of this server's blocks as tensors (``BLOCK:FIELD``), so no weight server reads a checkpoint.

**Who may push** (issue 52). Every key holder can sign any message, so the key alone cannot say who
sent a gradient. For each start the driver draws a sender id per graph server and sends it to that
graph server and to the weight servers (``pushers``, in ``start``); a graph server signs its gradients
with a session of that id (``ServerNode.dealer``). The id travels only in the envelopes of those
pushes, on the graph server's links to the weight servers, which no worker is on: the ids a worker
sees are those of the sessions that answer it (the graph server's own, the weight server's). A push
from any other sender, or for another graph server's keys, is refused. Every refused push (sender,
key, shape, values) is counted, and the driver puts the count in the run's summary.

Sharding (``weights/blocks.py``): every tensor is cut into row blocks dealt round-robin over the
``M`` servers, so ``M`` may exceed the layer count. A layer's blocks on one server are updated
together; servers need no coordination (each gets every gradient of its blocks), where replication
would need every replica to apply every gradient.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import torch

from dorylus_py.models import ModelSpec, build_module, spec_of
from dorylus_py.protocol import Message, ProtocolError, integer, require
from dorylus_py.serving.job import JobSpec
from dorylus_py.serving.node import Peer, ServerNode, hex16, peak_rss_mb
from dorylus_py.serving.process import serve_process
from dorylus_py.serving.rejections import REJECTED
from dorylus_py.weights.blocks import split, weight_blocks
from dorylus_py.weights.guard import GradientRefused, WindowSpec
from dorylus_py.weights.store import STATE_FIELDS, VersionFreed, WeightError, WeightStore

MAX_WAITING = 4096  # deferred pulls: far more than tasks in flight
MAX_WAITING_BYTES = 64 * 2**20  # and the bytes they came in (a pull is a header of at most 64 KB)
log = logging.getLogger("dorylus.weight_server")


def initial_weights(spec: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    """The same initial weights as the reference trainer for the same seed, by tensor name."""
    return {name: w.detach().numpy() for name, w in build_module(spec, 0.0, 0.0, seed).tensors().items()}


class WeightServer:
    def __init__(self, node: ServerNode, start: Message):
        self.node = node
        spec = JobSpec.from_wire(start["spec"])
        cfg = spec.config
        node.set_hang_timeout(cfg.hang_timeout_s)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        model = spec_of(cfg, spec.dims)
        mine = [b for b in weight_blocks(model.tensors(), len(spec.weight_servers)) if b.server == node.rank]
        arrays = split(mine, initial_weights(model, cfg.seed))
        self.layers = sorted({b.layer for b in mine})
        self.store = WeightStore(
            {l: {b.name: arrays[b.name] for b in mine if b.layer == l} for l in self.layers},
            lr=cfg.lr,
            weight_decay={b.name: cfg.weight_decay for b in mine if b.decay},
            update="chunk" if spec.mode == "async" and cfg.async_update == "chunk" else "epoch",
            expected=spec.total_chunks,
            keep=cfg.staleness + 4,  # epoch snapshots: the driver reads one while training runs ahead
            stale_step=cfg.stale_step if spec.mode == "async" else "none",
            predict=spec.mode == "async" and cfg.predict_weights,
            window=WindowSpec(tuple(spec.chunk_counts), spec.first_epoch, cfg.staleness if spec.mode == "async" else 0),
        )
        self.pushers = pushers(start.get("pushers"), len(spec.chunk_counts))  # sender id -> graph server
        if start.tensors:  # continue from a checkpoint (the driver sends the state of our blocks)
            for layer in self.layers:
                self.store.restore(layer, {f"{b.name}:{f}": start.tensors[f"{b.name}:{f}"] for b in mine if b.layer == layer
                                           for f in STATE_FIELDS if f"{b.name}:{f}" in start.tensors})
        self.waiting: list[tuple[Peer, Message]] = []
        self.waiting_bytes = 0
        self.chunk_counts, self.epochs = spec.chunk_counts, cfg.epochs
        self.holds: dict[bytes, set[tuple[int, tuple]]] = {}  # sender -> (layer, key) it holds
        self.holds_per_sender = spec.total_chunks * (cfg.staleness + 2)  # every chunk's tasks in flight, and more
        self.duplicates = 0
        self.refused = 0  # gradients refused, whatever the reason
        self.late_pulls = 0  # pulls of a version freed since (store.VersionFreed)
        self.bytes = {"sent": 0, "received": 0}
        node.on_driver = self.on_driver
        log.info("weight server %d start %s", node.rank, json.dumps({
            "rank": node.rank, "layers": self.layers, "blocks": len(mine), "parameters": int(sum(arrays[b.name].size for b in mine)),
            "peers": len(spec.graph_servers), "first_epoch": spec.first_epoch, "restart": spec.restart}))

    def handle(self, identity: Peer, msg: Message) -> None:
        self.bytes["received"] += sum(t.nbytes for t in msg.tensors.values())
        if msg.op in ("pull_weights", "pull_state", "ping") and msg.tensors:
            raise ProtocolError(f"{msg.op} carries no tensors")
        if msg.op == "pull_weights":
            require(msg, "layer", "version")
            integer(msg["layer"], "layer")
            _version(msg["version"], optional=True)
            if msg.get("epoch") is not None and not 1 <= integer(msg["epoch"], "epoch") <= self.epochs:
                raise ProtocolError(f"epoch {msg['epoch']} names no epoch of this job")
            if msg.get("hold") is not None:
                self._hold(msg.sender, msg["layer"], self._key(msg["hold"], "hold"))
            try:
                if not self._try_pull(identity, msg):
                    self._wait(identity, msg)
            except VersionFreed:
                self.late_pulls += 1  # refused like any other, but not reported as a refusal (store.py)
                raise
        elif msg.op == "push_grad":
            try:
                self._push(identity, msg)
            except REJECTED:
                self.refused += 1
                raise
        elif msg.op == "pull_state":
            require(msg, "version")
            _version(msg["version"], optional=True)
            if not self._try_pull(identity, msg):
                self._wait(identity, msg)
        elif msg.op == "ping":
            self.node.reply(identity, Message("ok", {"updates": self.store.updates, "duplicates": self.duplicates,
                                                     "refused": self.refused,
                                                     "refused_messages": self.node.rejections.unexpected - self.late_pulls,
                                                     "req": msg.get("req")}))
        else:
            raise ProtocolError(f"op {msg.op} is not served by a weight server")

    def _push(self, identity: Peer, msg: Message) -> None:
        """A gradient: from the graph server whose key it carries, of a key in the window, then its values."""
        require(msg, "layer", "version", "key")
        key = self._key(msg["key"], "key")
        if self.pushers.get(msg.sender) != key[1]:
            raise ProtocolError(f"push_grad for graph server {key[1]}'s key {list(key)} from a sender that is not "
                                "its gradient link in this job")
        _check_gradient(msg)
        layer, version = integer(msg["layer"], "layer"), _version(msg["version"])
        try:
            applied = self.store.push(layer, version, key, dict(msg.tensors))
        except GradientRefused as e:  # the key counts as come: the graph server goes on, the run reports it
            self.refused += 1
            if self.refused <= 5 or self.refused % 1000 == 0:
                log.warning("weight server %d refused a gradient of key %s (#%d): %s", self.node.rank, list(key),
                            self.refused, e)
            self.node.reply(identity, Message("refused", {"reason": str(e)[:300], "req": msg.get("req")}))
            return
        self.duplicates += not applied
        self.node.reply(identity, Message("ok" if applied else "duplicate", {"req": msg.get("req")}))
        if applied and self.waiting:
            self._retry_waiting()

    def on_driver(self, msg: Message) -> None:
        if msg.op != "release":
            raise ProtocolError(f"op {msg.op} from the driver is not for a weight server")
        self.store.release(integer(msg.get("version"), "release: version"))

    def run(self) -> None:
        while True:
            self.node.serve_once(self.handle, timeout_ms=200)

    def close(self) -> None:
        log.info("weight server %d end %s", self.node.rank, json.dumps({
            "rank": self.node.rank, "updates": self.store.updates, "predicted": self.store.predicted,
            "duplicates": self.duplicates, "refused": self.refused, "late_pulls": self.late_pulls,
            "furthest_key_ahead": max((st.window.furthest for st in self.store.layers.values()), default=0),
            "largest_over_scale": round(max((st.scale.worst for st in self.store.layers.values()), default=0.0), 3),
            "bytes_sent": self.bytes["sent"], "bytes_received": self.bytes["received"], "peak_rss_mb": peak_rss_mb()}))

    def _reply(self, identity: bytes, msg: Message) -> None:
        self.bytes["sent"] += sum(t.nbytes for t in msg.tensors.values())
        self.node.reply(identity, msg)

    def _retry_waiting(self) -> None:
        """Answer the deferred pulls an update made possible; one that can no longer be served gets
        its own error reply (with its request id), and the rest go on waiting."""
        still = []
        for identity, msg in self.waiting:
            try:
                if not self._try_pull(identity, msg):
                    still.append((identity, msg))
            except REJECTED as e:
                self.node.reply(identity, Message("error", {"reason": str(e), "req": msg.get("req")}))
        self.waiting = still
        self.waiting_bytes = sum(msg.size for _, msg in still)

    def _wait(self, identity: Peer, msg: Message) -> None:
        """Defer a pull of a version still to come; bounded in number and bytes, so no peer can pile them up."""
        if len(self.waiting) >= MAX_WAITING or self.waiting_bytes + msg.size > MAX_WAITING_BYTES:
            raise WeightError(f"{len(self.waiting)} pulls of {self.waiting_bytes} bytes are already waiting for "
                              "versions to come")
        self.waiting.append((identity, msg))
        self.waiting_bytes += msg.size

    def _key(self, value, name: str) -> tuple[int, int, int]:
        """A task key ``[epoch, server, chunk]`` of this job."""
        if not (isinstance(value, list) and len(value) == 3 and all(type(x) is int for x in value)):
            raise ProtocolError(f"{name} must be [epoch, server, chunk]")
        epoch, server, chunk = value
        if not (1 <= epoch <= self.epochs and 0 <= server < len(self.chunk_counts)
                and 0 <= chunk < self.chunk_counts[server]):
            raise ProtocolError(f"{name} {value} names no task of this job")
        return epoch, server, chunk

    def _hold(self, sender: bytes, layer: int, key: tuple) -> None:
        """Count a hold against its sender: at most ``holds_per_sender`` whose gradients have not come."""
        if self.store.pushed(layer, key):  # nothing would ever release it
            raise WeightError(f"layer {layer}: hold {list(key)} names a task whose gradient came already")
        held = {(l, k) for l, k in self.holds.get(sender, ()) if not self.store.pushed(l, k)}
        if (layer, key) not in held and len(held) >= self.holds_per_sender:
            raise WeightError(f"a sender holds {len(held)} versions already (at most {self.holds_per_sender})")
        self.holds[sender] = held | {(layer, key)}

    def _try_pull(self, identity: Peer, msg: Message) -> bool:
        """Answer a pull of weights or state; False while the version asked for is still to come."""
        version = msg.get("version")
        version = None if version is None else int(version)
        if msg.op == "pull_state":
            states = [self.store.state(layer, version) for layer in self.layers]
            if any(s is None for s in states):
                return False
            self._reply(identity, Message("state", {"req": msg.get("req")}, {k: v for s in states for k, v in s.items()}))
            return True
        layer = msg["layer"]
        epoch = msg.get("epoch")
        got = self.store.pull(layer, version, msg.get("hold"), None if epoch is None else int(epoch))
        if got is None:
            return False
        v, arrays = got
        self._reply(identity, Message("weights", {"layer": layer, "version": v, "req": msg.get("req")}, arrays))
        return True


def pushers(value, graph_servers: int) -> dict[bytes, int]:
    """``start``'s ``pushers``: the sender id each graph server signs its gradients with, by rank (the
    driver draws them per start), as id -> rank."""
    if not (isinstance(value, list) and len(value) == graph_servers):
        raise ProtocolError(f"start: pushers must list the {graph_servers} graph servers' gradient senders")
    ids = {hex16(v, "start: a pusher"): rank for rank, v in enumerate(value)}
    if len(ids) < graph_servers:
        raise ProtocolError("start: two graph servers with the same gradient sender")
    return ids


def _version(value, optional: bool = False) -> int | None:
    """A version: a non-negative integer, or (``optional``) null for the newest."""
    return None if value is None and optional else integer(value, "version")


def _check_gradient(msg: Message) -> None:
    """Names and shapes are the store's to check; here what any gradient must be."""
    if not msg.tensors or any(g.dtype != np.float32 or not np.isfinite(g).all() for g in msg.tensors.values()):
        raise ProtocolError("gradients must be finite float32 tensors")


def main(argv=None) -> int:
    return serve_process("weight-server", WeightServer, argv)


if __name__ == "__main__":
    raise SystemExit(main())
