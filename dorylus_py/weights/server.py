"""The weight-server process: serves versioned weights and takes gradients over ZeroMQ.

Requests (``protocol/messages.py``):
- ``pull_weights {layer, version|null, hold|null}`` -> ``weights {layer, version}`` + tensor ``W``.
  A pull of a version that does not exist yet waits (the reply is deferred) until an update makes it.
- ``push_grad {layer, version, key}`` + tensor ``grad`` -> ``ok`` or ``duplicate``.
- ``pull_state {layer}`` -> ``state {layer}`` + tensors ``W``, ``adam_m``, ``adam_v``, ``adam_step``,
  ``version``: what a checkpoint keeps.

Sharding: layer ``l`` lives on weight server ``l % M``. Layers are updated independently, so
sharding by layer spreads the pull traffic with no coordination between weight servers, where
replication would need every replica to apply every gradient.
"""

from __future__ import annotations

import numpy as np

from dorylus_py.cluster.node import Node, serve_process
from dorylus_py.models.gcn import GCN
from dorylus_py.protocol import Message, ProtocolError, require
from dorylus_py.weights.store import WeightStore


def initial_weights(dims: list[int], seed: int) -> list[np.ndarray]:
    """The same initial weights as the reference trainer for the same seed."""
    return [w.detach().numpy() for w in GCN(dims, seed=seed).weights]


def shard(layer: int, servers: int) -> int:
    return layer % servers


class WeightServer:
    def __init__(self, node: Node, spec: dict):
        self.node = node
        init = initial_weights(spec["dims"], spec["seed"])
        mine = [l for l in range(len(init)) if shard(l, len(spec["weight_servers"])) == node.rank]
        self.store = WeightStore(
            {l: init[l] for l in mine},
            lr=spec["lr"],
            weight_decay={0: spec["weight_decay"]},
            update="chunk" if spec["mode"] == "async" and spec.get("async_update") == "chunk" else "epoch",
            expected=spec["expected_grads"],
        )
        if spec.get("resume_from"):  # continue a checkpointed run (dorylus train --resume)
            from dorylus_py.checkpoint import load_checkpoint

            saved = load_checkpoint(spec["resume_from"])
            for layer in mine:
                self.store.restore(layer, {k: saved[f"{k}{layer}"] for k in ("W", "adam_m", "adam_v", "adam_step", "version")})
        self.waiting: list[tuple[bytes, Message]] = []
        self.duplicates = 0

    def handle(self, identity: bytes, msg: Message) -> None:
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
                self.waiting = [(i, m) for i, m in self.waiting if not self._try_pull(i, m)]
        elif msg.op == "pull_state":
            require(msg, "layer")
            self.node.reply(identity, Message("state", {"layer": msg["layer"]}, self.store.state(int(msg["layer"]))))
        elif msg.op == "ping":
            self.node.reply(identity, Message("ok", {"updates": self.store.updates, "duplicates": self.duplicates}))
        else:
            raise ProtocolError(f"op {msg.op} is not served by a weight server")

    def run(self) -> None:
        while True:
            self.node.serve_once(self.handle, timeout_ms=200)

    def _try_pull(self, identity: bytes, msg: Message) -> bool:
        version = msg["version"]
        got = self.store.pull(int(msg["layer"]), None if version is None else int(version), msg.get("hold"))
        if got is None:
            return False
        v, w = got
        self.node.reply(identity, Message("weights", {"layer": msg["layer"], "version": v, "req": msg.get("req")}, {"W": w}))
        return True


def main(argv=None) -> int:
    return serve_process("weight-server", WeightServer, argv)


if __name__ == "__main__":
    raise SystemExit(main())
