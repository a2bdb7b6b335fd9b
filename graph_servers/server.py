"""The graph server: holds one partition, does Gather/Scatter, and feeds tensor workers.

Layer ``l`` per epoch: tensor tasks compute ``Z_l = dropout(P_l) W_l`` chunk by chunk; Scatter sends
each peer the rows of ``Z_l`` it holds as ghosts (in its ghost order, via the send lists); Gather
computes ``G_l = Â_k [Z_l | ghosts]`` with the partition's CSR. The loss task turns the logits
``G_{L-1}`` into ``dG_{L-1}``; backward runs the same path in reverse: Gather backward
``Â_kᵀ dG_l`` gives local and ghost rows, the ghost rows go back to their owners and are added in,
and backward tensor tasks produce ``dG_{l-1}`` and push ``dW_l`` to the weight server.

``sync`` mode: a barrier after each layer, one weight update per epoch (full-batch training), then an
evaluation forward without dropout on the new weights. All waiting happens in :meth:`wait_until`, which
keeps answering requests, collects platform completions and relaunches overdue tasks.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import torch
import zmq

from dorylus_py.cluster.node import Node
from dorylus_py.data.graph import row_normalized
from dorylus_py.errors import DorylusError
from dorylus_py.kernels.sparse import NormalizedAdjacency, spmm
from dorylus_py.partition.store import PartitionStore
from dorylus_py.pipeline.tasks import TaskTracker
from dorylus_py.platforms import InprocPlatform, LocalLambdaPlatform
from dorylus_py.protocol import Message, ProtocolError, decode, encode, require

log = logging.getLogger(__name__)
KINDS = ("fwd", "bwd", "loss", "eval")


class GraphServer:
    def __init__(self, node: Node, spec: dict):
        self.node, self.spec = node, spec
        self.k = node.rank
        part = PartitionStore.open(spec["data_dir"]).load(self.k)
        self.part = part
        self.n = part.num_local
        self.dims = spec["dims"]
        self.layers = len(self.dims) - 1
        x = np.asarray(part.features)
        self.x = np.ascontiguousarray(row_normalized(x) if spec["feature_norm"] == "row" else x, dtype=np.float32)
        self.labels = np.asarray(part.labels)
        self.masks = np.stack([np.asarray(part.train_mask), np.asarray(part.val_mask), np.asarray(part.test_mask)])
        self.adj = NormalizedAdjacency.from_csr(part.indptr, part.indices, part.weights, (self.n, self.n + part.num_ghosts))
        chunks = max(1, min(spec["chunks"], self.n))
        self.bounds = np.linspace(0, self.n, chunks + 1).astype(np.int64)
        self.id_start = spec["id_offsets"][self.k]
        self.send_ids = [torch.from_numpy(np.array(part.sends_to(p))) for p in range(part.num_parts)]
        self.peers = {p: self._dealer(a) for p, a in enumerate(spec["graph_servers"]) if p != self.k}
        self.weight_servers = [self._dealer(a) for a in spec["weight_servers"]]
        # per-layer buffers, (n, d_{l+1}) each
        self.Z = [np.zeros((self.n, d), np.float32) for d in self.dims[1:]]
        self.G = [None] * self.layers
        self.dG = [np.zeros((self.n, d), np.float32) for d in self.dims[1:]]
        self.dZ = [None] * self.layers
        self.ghosts: dict[tuple, dict[int, np.ndarray]] = {}
        self.loss_sum = 0.0
        self.correct = np.zeros(3, dtype=np.int64)
        self.tracker = TaskTracker(spec["relaunch_min_s"], spec["relaunch_factor"])
        self.platform = self._platform()
        self.task_rows: list[dict] = []
        self.duplicate_results = 0

    def _dealer(self, address: str) -> zmq.Socket:
        sock = self.node.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        return sock

    def _platform(self):
        s = self.spec
        if s["backend"] == "local":
            per_server = max(1, s["lambdas"] // len(s["graph_servers"]))
            return LocalLambdaPlatform(per_server, s["lambda_latency_ms"], s["lambda_fail_rate"], s["lambda_memory_mb"],
                                       s["lambda_timeout_s"], seed=s["seed"] * 1000 + self.k)
        return InprocPlatform(s["tensor_threads"], s["device"])

    # --- the epoch -------------------------------------------------------------------------------

    def run(self) -> None:
        for epoch in range(1, self.spec["epochs"] + 1):
            t0 = time.perf_counter()
            self.loss_sum, self.correct[:] = 0.0, 0
            self.forward(epoch, train=True, version=epoch - 1)
            self.run_chunks("loss", epoch, self.layers - 1, train=True, version=None)
            for layer in reversed(range(self.layers)):
                self.gather_backward(epoch, layer)
                self.run_chunks("bwd", epoch, layer, train=True, version=epoch - 1)
            self.forward(epoch, train=False, version=epoch)
            self.run_chunks("eval", epoch, self.layers - 1, train=False, version=None)
            self.tracker.forget_before(epoch)
            self.report(epoch, time.perf_counter() - t0)
        self.node.to_driver(Message("epoch_stats", {"rank": self.k, "finished": True}))
        while True:  # serve late duplicates until the driver says stop
            self.node.serve_once(self.handle, 200)

    def forward(self, epoch: int, train: bool, version: int) -> None:
        for layer in range(self.layers):
            self.run_chunks("fwd", epoch, layer, train, version)
            self.scatter_gather(epoch, layer, train)

    def run_chunks(self, kind: str, epoch: int, layer: int, train: bool, version) -> None:
        keys = [(kind, train, epoch, layer, c) for c in range(len(self.bounds) - 1)]
        now = time.time()
        for key in keys:
            self.tracker.launch(key, now)
            self.platform.invoke(self.event(key, version))
        self.wait_until(lambda: not any(self.tracker.is_running(k) for k in keys), f"{kind} tasks of layer {layer}",
                        version=version)

    def event(self, key: tuple, version) -> dict:
        kind, train, epoch, layer, chunk = key
        s = self.spec
        return {
            "token": self.node.token,
            "graph_server": self.node.address,
            "weight_servers": s["weight_servers"],
            "dropout": s["dropout"],
            "seed": s["seed"],
            "num_train": s["num_train"],
            "task": {"kind": kind, "train": train, "epoch": epoch, "layer": layer, "chunk": chunk, "server": self.k,
                     "version": version, "attempt": self.tracker.attempts(key)},
        }

    def scatter_gather(self, epoch: int, layer: int, train: bool) -> None:
        t0 = time.time()
        tag = ("fwd", train, epoch, layer)
        z = torch.from_numpy(self.Z[layer])
        for p, sock in self.peers.items():
            self.send_ghosts(sock, tag, z[self.send_ids[p]].numpy())
        self.wait_until(lambda: len(self.ghosts.get(tag, {})) == len(self.peers), f"ghost rows of layer {layer}")
        width = self.dims[layer + 1]
        ghosts = np.zeros((self.part.num_ghosts, width), np.float32)
        for p, rows in self.ghosts.pop(tag, {}).items():
            ghosts[self.part.ghosts_from(p)] = rows
        self.G[layer] = spmm(self.adj, torch.cat([z, torch.from_numpy(ghosts)])).numpy()
        self.task_rows.append(self._graph_row("gather", epoch, layer, t0))

    def gather_backward(self, epoch: int, layer: int) -> None:
        t0 = time.time()
        full = torch.sparse.mm(self.adj.transpose, torch.from_numpy(self.dG[layer]))  # (n + ghosts, d)
        tag = ("bwd", True, epoch, layer)
        for p, sock in self.peers.items():
            sl = self.part.ghosts_from(p)
            self.send_ghosts(sock, tag, full[self.n + sl.start : self.n + sl.stop].numpy())
        self.wait_until(lambda: len(self.ghosts.get(tag, {})) == len(self.peers), f"ghost gradients of layer {layer}")
        dz = full[: self.n].clone()
        for p, rows in self.ghosts.pop(tag, {}).items():
            dz.index_add_(0, self.send_ids[p], torch.from_numpy(np.array(rows)))
        self.dZ[layer] = dz.numpy()
        self.task_rows.append(self._graph_row("gather_bwd", epoch, layer, t0))

    def send_ghosts(self, sock, tag: tuple, rows: np.ndarray) -> None:
        phase, train, epoch, layer = tag
        msg = Message("ghosts", {"phase": phase, "train": train, "epoch": epoch, "layer": layer, "src": self.k},
                      {"rows": np.ascontiguousarray(rows, dtype=np.float32)})
        sock.send_multipart(encode(msg, self.node.token), copy=False)

    def report(self, epoch: int, seconds: float) -> None:
        counts = self.masks.sum(axis=1).tolist()
        self.node.to_driver(Message("epoch_stats", {"rank": self.k, "epoch": epoch, "loss_sum": self.loss_sum,
                                                    "correct": self.correct.tolist(), "counts": counts, "epoch_s": seconds,
                                                    "relaunches": self.tracker.relaunches,
                                                    "duplicates": self.duplicate_results}))
        for c in self.platform.completions():
            self._record(c)
        rows = "".join(json.dumps(r) + "\n" for r in self.task_rows).encode()
        self.task_rows = []
        self.node.to_driver(Message("tasks", {"rank": self.k}, {"jsonl": np.frombuffer(rows, np.uint8)}))

    # --- waiting and serving ---------------------------------------------------------------------

    def wait_until(self, condition, what: str, version=None) -> None:
        deadline = time.monotonic() + self.spec["wait_timeout_s"]
        while not condition():
            if time.monotonic() > deadline:
                raise DorylusError(f"graph server {self.k}: timed out after {self.spec['wait_timeout_s']:.0f} s "
                                   f"waiting for {what}")
            self.node.serve_once(self.handle, 5)
            for sock in [*self.peers.values(), *self.weight_servers]:  # acks of what we sent
                while sock.poll(0):
                    self._check_ack(sock.recv_multipart())
            for c in self.platform.completions():
                self._record(c)
                if not c.ok:
                    self.tracker.failed(self._key(c.task))
            for key in self.tracker.due(time.time()):
                self.platform.invoke(self.event(key, version))

    def handle(self, identity: bytes, msg: Message) -> None:
        if msg.op == "pull_rows":
            require(msg, "task")
            key = self._key(msg["task"])
            if not self.tracker.is_running(key):
                raise ProtocolError(f"task {key} is not running here")
            self.node.reply(identity, Message("rows", self._rows_fields(key) | {"req": msg.get("req")}, self._rows(key)))
        elif msg.op == "push_result":
            require(msg, "task")
            key = self._key(msg["task"])
            self._check_result(key, msg)
            if not self.tracker.complete(key, time.time()):
                self.duplicate_results += 1
                self.node.reply(identity, Message("duplicate", {"req": msg.get("req")}))
                return
            self._apply_result(key, msg)
            self.node.reply(identity, Message("ok", {"req": msg.get("req")}))
        elif msg.op == "ghosts":
            require(msg, "phase", "train", "epoch", "layer", "src", "rows")
            self._accept_ghosts(msg)
            self.node.reply(identity, Message("ok", {}))
        else:
            raise ProtocolError(f"op {msg.op} is not served by a graph server")

    def _key(self, task) -> tuple:
        if not isinstance(task, dict):
            raise ProtocolError("task must be an object")
        try:
            key = (str(task["kind"]), bool(task["train"]), int(task["epoch"]), int(task["layer"]), int(task["chunk"]))
        except (KeyError, TypeError, ValueError):
            raise ProtocolError(f"malformed task {task!r}") from None
        if key[0] not in KINDS or not 0 <= key[3] < self.layers or not 0 <= key[4] < len(self.bounds) - 1:
            raise ProtocolError(f"task {key} out of range")
        return key

    def _chunk(self, chunk: int) -> tuple[int, int]:
        return int(self.bounds[chunk]), int(self.bounds[chunk + 1])

    def _rows_fields(self, key) -> dict:
        a, b = self._chunk(key[4])
        return {"start": a, "stop": b, "id_start": self.id_start + a}

    def _layer_input(self, layer: int, a: int, b: int) -> np.ndarray:
        return self.x[a:b] if layer == 0 else self.G[layer - 1][a:b]

    def _rows(self, key) -> dict[str, np.ndarray]:
        kind, _, _, layer, chunk = key
        a, b = self._chunk(chunk)
        if kind == "fwd":
            return {"P": self._layer_input(layer, a, b)}
        if kind == "bwd":
            return {"P": self._layer_input(layer, a, b), "dZ": self.dZ[layer][a:b]}
        logits = self.G[self.layers - 1][a:b]
        if kind == "loss":
            return {"logits": logits, "labels": self.labels[a:b], "train": self.masks[0, a:b]}
        return {"logits": logits, "labels": self.labels[a:b], "masks": self.masks[:, a:b]}

    def _check_result(self, key, msg: Message) -> None:
        kind, _, _, layer, chunk = key
        a, b = self._chunk(chunk)
        if kind == "fwd":
            require(msg, shapes={"Z": (b - a, self.dims[layer + 1])})
        elif kind == "bwd":
            require(msg, "version", shapes={"dW": (self.dims[layer], self.dims[layer + 1])})
            if layer > 0:
                require(msg, shapes={"dG": (b - a, self.dims[layer])})
        elif kind == "loss":
            require(msg, "loss_sum", shapes={"dG": (b - a, self.dims[-1])})
        elif kind == "eval":
            require(msg, "correct")
            c = msg["correct"]
            if not (isinstance(c, list) and len(c) == 3 and all(isinstance(v, int) and v >= 0 for v in c)):
                raise ProtocolError("eval result: 'correct' must be three counts")

    def _apply_result(self, key, msg: Message) -> None:
        kind, _, _, layer, chunk = key
        a, b = self._chunk(chunk)
        if kind == "fwd":
            self.Z[layer][a:b] = msg.tensors["Z"]
        elif kind == "bwd":
            if layer > 0:
                self.dG[layer - 1][a:b] = msg.tensors["dG"]
            self.forward_gradient(key, int(msg["version"]), msg.tensors["dW"])
        elif kind == "loss":
            self.dG[self.layers - 1][a:b] = msg.tensors["dG"]
            self.loss_sum += float(msg["loss_sum"])
        elif kind == "eval":
            self.correct += np.array(msg["correct"], dtype=np.int64)

    def forward_gradient(self, key: tuple, version: int, grad: np.ndarray) -> None:
        """Pass an accepted backward task's weight gradient to the weight server of its layer."""
        _, _, epoch, layer, chunk = key
        msg = Message("push_grad", {"layer": layer, "version": version, "key": [epoch, self.k, chunk]}, {"grad": grad})
        self.weight_servers[layer % len(self.weight_servers)].send_multipart(encode(msg, self.node.token), copy=False)

    def _check_ack(self, frames) -> None:
        reply = decode(frames, self.node.token)
        if reply.op == "error":
            raise DorylusError(f"graph server {self.k}: a peer or weight server refused our message: {reply.get('reason')}")
        if reply.op == "duplicate":
            log.warning("graph server %d: the weight server already had a gradient we forwarded", self.k)

    def _accept_ghosts(self, msg: Message) -> None:
        src, layer = int(msg["src"]), int(msg["layer"])
        if src not in self.peers or not 0 <= layer < self.layers or msg["phase"] not in ("fwd", "bwd"):
            raise ProtocolError(f"ghost rows from {src} for layer {layer} phase {msg['phase']!r} are not expected")
        width = self.dims[layer + 1]
        n_rows = len(self.send_ids[src]) if msg["phase"] == "bwd" else self.part.ghosts_from(src).stop - self.part.ghosts_from(src).start
        require(msg, shapes={"rows": (n_rows, width)})
        self.ghosts.setdefault((msg["phase"], bool(msg["train"]), int(msg["epoch"]), layer), {})[src] = msg.tensors["rows"]

    def _record(self, c) -> None:
        t = c.task
        self.task_rows.append({"kind": t["kind"], "train": t["train"], "server": self.k, "chunk": t["chunk"],
                               "epoch": t["epoch"], "layer": t["layer"], "attempt": t.get("attempt", 1),
                               "where": c.where, "start": c.start, "end": c.end, "billed_ms": c.billed_ms,
                               "memory_mb": c.memory_mb, "ok": c.ok, "error": c.error})

    def _graph_row(self, kind: str, epoch: int, layer: int, t0: float) -> dict:
        return {"kind": kind, "train": True, "server": self.k, "chunk": None, "epoch": epoch, "layer": layer,
                "attempt": 1, "where": "graph-server", "start": t0, "end": time.time(), "billed_ms": 0,
                "memory_mb": 0, "ok": True, "error": ""}

    def close(self) -> None:
        self.platform.close()
        for s in [*self.peers.values(), *self.weight_servers]:
            s.close(0)
