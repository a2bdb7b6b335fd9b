"""The weight-server process: serves versioned weights and takes gradients over ZeroMQ.

Requests (``protocol/messages.py``):
- ``pull_weights {layer, version|null, hold|null}`` -> ``weights {layer, version}`` + tensor ``W``.
  A pull of a version that does not exist yet waits (the reply is deferred) until an update makes it.
- ``push_grad {layer, version, key}`` + tensor ``grad`` -> ``ok`` or ``duplicate``.
- ``pull_state {layer, version|null}`` -> ``state {layer}`` + tensors ``W``, ``adam_m``, ``adam_v``,
  ``adam_step``, ``version``: what a checkpoint keeps, at an epoch boundary (deferred like a pull).

The ``start`` message carries the job spec and, when the job resumes from a checkpoint, the state
of this server's layers as tensors (``W0``, ``adam_m0``, ...), so no weight server reads a checkpoint.

Sharding: layer ``l`` lives on weight server ``l % M``. Layers are updated independently, so
sharding by layer spreads the pull traffic with no coordination between weight servers, where
replication would need every replica to apply every gradient.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import torch

from dorylus_py.cluster.job import JobSpec
from dorylus_py.cluster.node import Node, peak_rss_mb, serve_process
from dorylus_py.models.gcn import GCN
from dorylus_py.protocol import Message, ProtocolError, require
from dorylus_py.weights.store import WeightError, WeightStore

STATE_NAMES = ("W", "adam_m", "adam_v", "adam_step", "version")
log = logging.getLogger("dorylus.weight_server")


def initial_weights(dims: list[int], seed: int) -> list[np.ndarray]:
    """The same initial weights as the reference trainer for the same seed."""
    return [w.detach().numpy() for w in GCN(dims, seed=seed).weights]


def shard(layer: int, servers: int) -> int:
    return layer % servers


class WeightServer:
    def __init__(self, node: Node, start: Message):
        self.node = node
        spec = JobSpec.from_wire(start["spec"])
        cfg = spec.config
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        init = initial_weights(spec.dims, cfg.seed)
        mine = [l for l in range(len(init)) if shard(l, len(spec.weight_servers)) == node.rank]
        self.store = WeightStore(
            {l: init[l] for l in mine},
            lr=cfg.lr,
            weight_decay={0: cfg.weight_decay},
            update="chunk" if spec.mode == "async" and cfg.async_update == "chunk" else "epoch",
            expected=spec.total_chunks,
            keep=cfg.staleness + 4,  # epoch snapshots: the driver reads one while training runs ahead
        )
        for layer in mine:  # continue from a checkpoint (the driver sends the state)
            names = [f"{k}{layer}" for k in STATE_NAMES]
            if all(n in start.tensors for n in names):
                self.store.restore(layer, {k: start.tensors[f"{k}{layer}"] for k in STATE_NAMES})
        self.waiting: list[tuple[bytes, Message]] = []
        self.duplicates = 0
        self.bytes = {"sent": 0, "received": 0}
        log.info("weight server %d start %s", node.rank, json.dumps({
            "rank": node.rank, "layers": mine, "parameters": int(sum(init[l].size for l in mine)),
            "peers": len(spec.graph_servers), "first_epoch": spec.first_epoch, "restart": spec.restart}))

    def handle(self, identity: bytes, msg: Message) -> None:
        self.bytes["received"] += sum(t.nbytes for t in msg.tensors.values())
        if msg.op == "pull_weights":
            require(msg, "layer", "version")
            if not self._try_pull(identity, msg):
                self.waiting.append((identity, msg))
        elif msg.op == "push_grad":
            require(msg, "layer", "version", "key", "grad")
            applied = self.store.push(int(msg["layer"]), int(msg["version"]), tuple(msg["key"]), msg.tensors["grad"])
            self.duplicates += not applied
            self.node.reply(identity, Message("ok" if applied else "duplicate", {"req": msg.get("req")}))
            if applied and self.waiting:
                self._retry_waiting()
        elif msg.op == "pull_state":
            require(msg, "layer")
            if not self._try_pull(identity, msg):
                self.waiting.append((identity, msg))
        elif msg.op == "ping":
            self.node.reply(identity, Message("ok", {"updates": self.store.updates, "duplicates": self.duplicates,
                                                     "req": msg.get("req")}))
        else:
            raise ProtocolError(f"op {msg.op} is not served by a weight server")

    def run(self) -> None:
        while True:
            self.node.serve_once(self.handle, timeout_ms=200)

    def close(self) -> None:
        log.info("weight server %d end %s", self.node.rank, json.dumps({
            "rank": self.node.rank, "updates": self.store.updates, "duplicates": self.duplicates,
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
            except WeightError as e:
                self.node.reply(identity, Message("error", {"reason": str(e), "req": msg.get("req")}))
        self.waiting = still

    def _try_pull(self, identity: bytes, msg: Message) -> bool:
        """Answer a pull of weights or state; False while the version asked for is still to come."""
        version, layer = msg.get("version"), int(msg["layer"])
        version = None if version is None else int(version)
        if msg.op == "pull_state":
            state = self.store.state(layer, version)
            if state is not None:
                self._reply(identity, Message("state", {"layer": layer, "req": msg.get("req")}, state))
            return state is not None
        got = self.store.pull(layer, version, msg.get("hold"))
        if got is None:
            return False
        v, w = got
        self._reply(identity, Message("weights", {"layer": layer, "version": v, "req": msg.get("req")}, {"W": w}))
        return True


def main(argv=None) -> int:
    return serve_process("weight-server", WeightServer, argv)


if __name__ == "__main__":
    raise SystemExit(main())
