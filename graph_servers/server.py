"""The graph server: holds one partition, does Gather/Scatter, and feeds tensor workers.

Layer ``l``: tensor tasks compute ``Z_l = dropout(P_l) W_l`` chunk by chunk; Scatter sends each peer
the rows of ``Z_l`` it holds as ghosts (in its ghost order, via the send lists); Gather computes
``G_l = Â_k [Z_l | ghosts]`` with the partition's CSR. ``Z_l`` and its ghosts share one buffer of
``n_local + n_ghost`` rows, so Gather reads it in place. The loss task turns the logits ``G_{L-1}``
into ``dG_{L-1}``; backward runs the path in reverse: Gather backward ``Â_kᵀ dG_l`` gives local rows
plus contributions to the owners of our ghosts, which are sent back and added in there; backward
tasks produce ``dG_{l-1}`` and ``dW_l``, which the server forwards to the weight server once it has
accepted the task's result (so both take effect together, exactly once).

``sync``: a barrier after each layer, one weight update per epoch (full-batch training), then an
evaluation forward without dropout on the new weights. ``async``: chunks move independently through
the stages of ``pipeline/chunks.py`` within the staleness bound, Gather reads the freshest rows
present, and weights are updated per chunk with stashing (a chunk's backward uses the version its
forward used). All waiting happens in :meth:`step` loops that keep answering requests, collect
platform completions and relaunch overdue tasks.
"""

from __future__ import annotations

import json
import logging
import queue
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import zmq

from dorylus_py.cluster.node import Node
from dorylus_py.data.graph import row_normalized
from dorylus_py.errors import DorylusError
from dorylus_py.kernels.sparse import NormalizedAdjacency
from dorylus_py.partition.store import PartitionStore
from dorylus_py.pipeline.chunks import TENSOR_STAGES, ChunkPipeline
from dorylus_py.pipeline.tasks import TaskTracker
from dorylus_py.platforms import InprocPlatform, LocalLambdaPlatform
from dorylus_py.protocol import Message, ProtocolError, decode, encode, require

log = logging.getLogger(__name__)
KINDS = ("fwd", "bwd", "loss", "eval")


def _csr(indptr, indices, weights, shape) -> torch.Tensor:
    return NormalizedAdjacency.from_csr(indptr, indices, weights, shape).matrix


class GraphServer:
    def __init__(self, node: Node, spec: dict):
        self.node, self.spec = node, spec
        self.k = node.rank
        self.part = part = PartitionStore.open(spec["data_dir"]).load(self.k)
        self.n, self.g = part.num_local, part.num_ghosts
        self.dims = spec["dims"]
        self.layers = len(self.dims) - 1
        self.mode = spec.get("mode", "sync")
        x = np.asarray(part.features)
        self.x = np.ascontiguousarray(row_normalized(x) if spec["feature_norm"] == "row" else x, dtype=np.float32)
        self.labels = np.asarray(part.labels)
        self.masks = np.stack([np.asarray(part.train_mask), np.asarray(part.val_mask), np.asarray(part.test_mask)])
        self.adj = NormalizedAdjacency.from_csr(part.indptr, part.indices, part.weights, (self.n, self.n + self.g))
        chunks = max(1, min(spec["chunks"], self.n))
        self.bounds = np.linspace(0, self.n, chunks + 1).astype(np.int64)
        self.id_start = spec["id_offsets"][self.k]
        self.send_ids = [torch.from_numpy(np.array(part.sends_to(p))) for p in range(part.num_parts)]
        self.peers = {p: self._dealer(a) for p, a in enumerate(spec["graph_servers"]) if p != self.k}
        self.weight_servers = [self._dealer(a) for a in spec["weight_servers"]]
        # ZG[train][l]: rows 0..n-1 are Z_l, rows n.. its ghosts; G[train][l]: gathered, (n, d_{l+1})
        self.ZG = {t: [np.zeros((self.n + self.g, d), np.float32) for d in self.dims[1:]] for t in (True, False)}
        self.G = {t: [np.zeros((self.n, d), np.float32) for d in self.dims[1:]] for t in (True, False)}
        self.dG = [np.zeros((self.n, d), np.float32) for d in self.dims[1:]]
        self.dZ = [np.zeros((self.n, d), np.float32) for d in self.dims[1:]]
        self.ghosts: dict[tuple, dict[int, np.ndarray]] = {}  # sync: rows from each peer, by tag
        self.loss_sum: dict[int, float] = {}
        self.correct: dict[int, np.ndarray] = {}
        self.epoch_start: dict[int, float] = {}
        self.tracker = TaskTracker(spec["relaunch_min_s"], spec["relaunch_factor"])
        self.platform = self._platform()
        self.task_rows: list[dict] = []
        self.invoked = self.completed = 0  # platform invocations, and their completions recorded
        self.duplicate_results = 0
        self.switch_at: int | None = None  # async: no epoch from this one on starts asynchronously
        self.switch_final = False  # the driver has fixed switch_at for every server
        node.on_driver = self.on_driver
        self.pipe: ChunkPipeline | None = None  # async only, as are peer_min and the per-chunk layouts
        self.peer_min: dict[int, int] = {}
        if self.mode == "async":
            self._init_async()

    def _dealer(self, address: str) -> zmq.Socket:
        sock = self.node.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        return sock

    def _platform(self):
        s = self.spec
        if s["backend"] not in ("local", "lambda"):
            return InprocPlatform(s["tensor_threads"], s["device"])
        per_server = max(1, s["lambdas"] // len(s["graph_servers"]))  # --lambdas is for the whole job
        seed = s["seed"] * 1000 + self.k
        if s["backend"] == "local":
            return LocalLambdaPlatform(per_server, s["lambda_latency_ms"], s["lambda_fail_rate"], s["lambda_memory_mb"],
                                       s["lambda_timeout_s"], seed=seed)
        from dorylus_py.platforms.aws import AwsLambdaPlatform

        return AwsLambdaPlatform(s["lambda_function"], per_server, s["lambda_memory_mb"], s["aws_region"] or None,
                                 s["aws_profile"] or None, s["lambda_endpoint"] or None, s["lambda_timeout_s"],
                                 run_here=s["lambda_run_here"], seed=seed)

    def run(self) -> None:
        if self.mode == "async":
            self.run_async()
            if self.switch_at is not None and self.switch_at <= self.spec["epochs"]:
                self.mode = "sync"  # every chunk has finished epoch switch_at - 1: go on with barriers
                self.run_sync(first=self.switch_at)
        else:
            self.run_sync(first=self.spec.get("first_epoch", 1))
        self.flush_tasks()
        self.node.to_driver(Message("epoch_stats", {"rank": self.k, "finished": True}))
        while True:  # serve late duplicates until the driver says stop
            self.node.serve_once(self.handle, 200)

    # --- sync mode -------------------------------------------------------------------------------

    def run_sync(self, first: int = 1) -> None:
        for epoch in range(first, self.spec["epochs"] + 1):
            self.epoch_start[epoch] = time.perf_counter()
            self.forward(epoch, train=True)
            self.run_chunks("loss", epoch, self.layers - 1, train=True)
            for layer in reversed(range(self.layers)):
                self.gather_backward(epoch, layer)
                self.run_chunks("bwd", epoch, layer, train=True)
            self.forward(epoch, train=False)
            self.run_chunks("eval", epoch, self.layers - 1, train=False)
            self.tracker.forget_before(epoch)
            self.report(epoch)

    def forward(self, epoch: int, train: bool) -> None:
        for layer in range(self.layers):
            self.run_chunks("fwd", epoch, layer, train)
            self.scatter_gather(epoch, layer, train)

    def run_chunks(self, kind: str, epoch: int, layer: int, train: bool) -> None:
        keys = [(kind, train, epoch, layer, c) for c in range(len(self.bounds) - 1)]
        for key in keys:
            self.launch(key)
        self.wait_until(lambda: not any(self.tracker.is_running(k) for k in keys), f"{kind} tasks of layer {layer}")

    def scatter_gather(self, epoch: int, layer: int, train: bool) -> None:
        t0 = time.time()
        tag = ("fwd", train, epoch, layer)
        zg = self.ZG[train][layer]
        for p, sock in self.peers.items():
            self.send_ghosts(sock, tag, zg[self.send_ids[p].numpy()])
        self.wait_until(lambda: len(self.ghosts.get(tag, {})) == len(self.peers), f"ghost rows of layer {layer}")
        for p, rows in self.ghosts.pop(tag, {}).items():
            sl = self.part.ghosts_from(p)
            zg[self.n + sl.start : self.n + sl.stop] = rows
        self.G[train][layer][:] = torch.sparse.mm(self.adj.matrix, torch.from_numpy(zg)).numpy()
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
        self.dZ[layer][:] = dz.numpy()
        self.task_rows.append(self._graph_row("gather_bwd", epoch, layer, t0))

    def wait_until(self, condition, what: str) -> None:
        deadline = time.monotonic() + self.spec["wait_timeout_s"]
        while not condition():
            if time.monotonic() > deadline:
                raise DorylusError(f"graph server {self.k}: timed out after {self.spec['wait_timeout_s']:.0f} s "
                                   f"waiting for {what}")
            self.step()

    # --- async mode ------------------------------------------------------------------------------

    def _init_async(self) -> None:
        s = self.spec
        # Graph stages (Gather, its backward) run on one thread of their own: torch releases the GIL, so
        # the event loop keeps serving the Lambdas' pulls and pushes instead of making them wait.
        self.graph_pool = ThreadPoolExecutor(1, thread_name_prefix="graph")
        self.graph_done: queue.SimpleQueue = queue.SimpleQueue()
        wake = f"inproc://graph-done-{id(self)}"
        self.wake_recv = self.node.ctx.socket(zmq.PULL)
        self.wake_recv.bind(wake)
        self.wake_send = self.node.ctx.socket(zmq.PUSH)
        self.wake_send.connect(wake)
        self.node.poller.register(self.wake_recv, zmq.POLLIN)  # a finished stage ends the loop's wait
        first = s.get("first_epoch", 1)
        self.pipe = ChunkPipeline(len(self.bounds) - 1, self.layers, s["epochs"], s["staleness"], first=first)
        self.peer_min = {p: first for p in self.peers}
        self.fwd_version: dict[tuple, int] = {}  # (layer, chunk) -> version its training forward used
        ip, ix, w = np.asarray(self.part.indptr), np.asarray(self.part.indices), np.asarray(self.part.weights)
        self.rows_of, self.ghost_t, self.local_t, self.touched = [], [], [], []
        local = ix < self.n
        rows = np.repeat(np.arange(self.n), np.diff(ip))
        lt = _csr(np.concatenate([[0], np.cumsum(np.bincount(rows[local], minlength=self.n))]), ix[local], w[local],
                  (self.n, self.n)).t().to_sparse_csr()  # Âᵀ restricted to local rows and columns
        lt_ptr, lt_ix, lt_w = lt.crow_indices().numpy(), lt.col_indices().numpy(), lt.values().numpy()
        for c in range(len(self.bounds) - 1):
            a, b = self._chunk(c)
            lo, hi = ip[a], ip[b]
            self.rows_of.append(_csr(ip[a : b + 1] - lo, ix[lo:hi], w[lo:hi], (b - a, self.n + self.g)))
            ghost = ix[lo:hi] >= self.n
            r = np.repeat(np.arange(b - a), np.diff(ip[a : b + 1]))[ghost]
            gcols = ix[lo:hi][ghost] - self.n
            touched = np.unique(gcols)  # the ghosts this chunk has edges from, sorted (so grouped by owner)
            gm = _csr(np.concatenate([[0], np.cumsum(np.bincount(r, minlength=b - a))]), np.searchsorted(touched, gcols),
                      w[lo:hi][ghost], (b - a, len(touched)))
            self.ghost_t.append(gm.t().to_sparse_csr())  # (touched, b - a): contributions to our ghosts' owners
            owner_cut = np.searchsorted(touched, np.asarray(self.part.ghost_offsets))
            self.touched.append({p: (owner_cut[p], owner_cut[p + 1], touched[owner_cut[p]:owner_cut[p + 1]]
                                     - self.part.ghost_offsets[p]) for p in self.peers})
            self.local_t.append(_csr(lt_ptr[a : b + 1] - lt_ptr[a], lt_ix[lt_ptr[a] : lt_ptr[b]],
                                     lt_w[lt_ptr[a] : lt_ptr[b]], (b - a, self.n)))
        self.send_in_chunk = []  # [chunk][peer] -> (positions in the peer's ghost slice, local rows)
        for c in range(len(self.bounds) - 1):
            a, b = self._chunk(c)
            per_peer = {}
            for p in self.peers:
                ids = self.send_ids[p].numpy()
                pos = np.nonzero((ids >= a) & (ids < b))[0]
                per_peer[p] = (pos, ids[pos])
            self.send_in_chunk.append(per_peer)
        self.remote_dz = [np.zeros((self.n, d), np.float32) for d in self.dims[1:]]
        self.remote_parts: dict[tuple, np.ndarray] = {}  # (layer, peer, peer chunk) -> last contribution

    def on_driver(self, msg: Message) -> None:
        """The switch back to sync mode, in two steps so that no server has started the switch epoch:
        first freeze (start no epoch beyond those already started) and tell the driver how far that is;
        then the driver's ``at_epoch`` (one past every server's frozen epoch) is where sync mode begins."""
        if msg.op != "switch" or self.mode != "async":
            return
        if msg.get("at_epoch") is None:
            started = max(e if (st or busy) else e - 1 for e, st, busy in zip(self.pipe.epoch, self.pipe.stage, self.pipe.busy))
            self.switch_at = started + 1
            self.node.to_driver(Message("switch", {"rank": self.k, "frozen_at": self.switch_at}))
        else:
            self.switch_at, self.switch_final = int(msg["at_epoch"]), True

    def run_async(self) -> None:
        reported = told = self.spec.get("first_epoch", 1) - 1
        last_progress, last_state = time.monotonic(), None
        while reported < self.spec["epochs"]:
            if self.switch_at is not None and reported >= self.switch_at - 1 and self.switch_final:
                return  # every epoch before the switch is done and reported
            ready = self.pipe.ready(self.slowest(), self.switch_at)
            while ready:  # run graph stages and launch tasks until every chunk waits on something
                for c, e, stage, layer in ready:
                    self.epoch_start.setdefault(e, time.perf_counter())
                    self.pipe.started(c)
                    if stage in TENSOR_STAGES:
                        kind, train = ("fwd", False) if stage == "efwd" else (stage, stage not in ("eval",))
                        self.launch((kind, train, e, layer, c))
                    else:  # on the graph thread, so this loop keeps answering the Lambdas meanwhile
                        self.graph_pool.submit(self._graph_job, stage, c, e, layer)
                ready = self.pipe.ready(self.slowest(), self.switch_at)
            if self.pipe.min_epoch() != told:
                told = self.pipe.min_epoch()
                for sock in self.peers.values():
                    sock.send_multipart(encode(Message("progress", {"src": self.k, "min_epoch": told}), self.node.token))
            while reported < self.spec["epochs"] and self.pipe.epoch_complete(reported + 1):
                reported += 1
                self.tracker.forget_before(self.slowest() - 1)
                self.report(reported)
            state = (tuple(self.pipe.epoch), tuple(self.pipe.stage), tuple(self.pipe.busy))
            if state != last_state:
                last_progress, last_state = time.monotonic(), state
            elif time.monotonic() - last_progress > self.spec["wait_timeout_s"]:
                raise DorylusError(f"graph server {self.k}: no progress for {self.spec['wait_timeout_s']:.0f} s "
                                   f"(chunk epochs {self.pipe.epoch}, peers at {self.peer_min})")
            self.step()
            self._graph_jobs_done()

    def _graph_job(self, stage: str, c: int, epoch: int, layer: int) -> None:
        """Runs on the graph thread; the loop learns of it through ``graph_done`` and a wake-up message."""
        try:
            self.graph_stage(stage, c, epoch, layer)
            self.graph_done.put((c, None))
        except BaseException as e:  # noqa: BLE001  (re-raised on the loop's thread)
            self.graph_done.put((c, e))
        self.wake_send.send(b"", zmq.NOBLOCK)

    def _graph_jobs_done(self) -> None:
        while self.wake_recv.poll(0):
            self.wake_recv.recv()
        while not self.graph_done.empty():
            c, error = self.graph_done.get()
            if error is not None:
                raise error
            self.pipe.done(c)

    def slowest(self) -> int:
        return min([self.pipe.min_epoch(), *self.peer_min.values()])

    def graph_stage(self, stage: str, c: int, epoch: int, layer: int) -> None:
        t0 = time.time()
        a, b = self._chunk(c)
        if stage in ("gather", "egather"):
            train = stage == "gather"
            zg = torch.from_numpy(self.ZG[train][layer])
            self.G[train][layer][a:b] = torch.sparse.mm(self.rows_of[c], zg).numpy()
        else:  # gather_bwd: local part from our chunks' dG, remote part as last sent by the peers
            dz = torch.sparse.mm(self.local_t[c], torch.from_numpy(self.dG[layer])).numpy()
            self.dZ[layer][a:b] = dz + self.remote_dz[layer][a:b]
        self.task_rows.append(self._graph_row(stage, epoch, layer, t0, chunk=c))

    def scatter_chunk(self, train: bool, epoch: int, layer: int, c: int) -> None:
        """Send each peer the rows of this chunk's fresh ``Z_l`` that it holds as ghosts."""
        z = self.ZG[train][layer]
        phase = "fwd" if train else "efwd"
        for p, sock in self.peers.items():
            pos, rows = self.send_in_chunk[c][p]
            msg = Message("ghosts", {"phase": phase, "epoch": epoch, "layer": layer, "src": self.k, "train": train,
                                     "min_epoch": self.pipe.min_epoch()}, {"positions": pos, "rows": z[rows]})
            sock.send_multipart(encode(msg, self.node.token), copy=False)

    def send_contributions(self, epoch: int, layer: int, c: int) -> None:
        """After chunk ``c`` got ``dG_l``: send each peer ``Â[c, ghosts of p]ᵀ dG_l[c]``."""
        if not self.peers:
            return
        a, b = self._chunk(c)
        contrib = torch.sparse.mm(self.ghost_t[c], torch.from_numpy(self.dG[layer][a:b])).numpy()
        for p, sock in self.peers.items():
            lo, hi, positions = self.touched[c][p]
            msg = Message("ghosts", {"phase": "bwd", "epoch": epoch, "layer": layer, "src": self.k, "train": True,
                                     "chunk": c, "min_epoch": self.pipe.min_epoch()},
                          {"positions": positions, "rows": contrib[lo:hi]})
            sock.send_multipart(encode(msg, self.node.token), copy=False)

    # --- shared machinery ------------------------------------------------------------------------

    def launch(self, key: tuple) -> None:
        self.tracker.launch(key, time.time())
        self.invoke(key)

    def invoke(self, key: tuple) -> None:
        self.invoked += 1
        self.platform.invoke(self.event(key))

    def event(self, key: tuple) -> dict:
        """The event a tensor worker gets for ``key`` (the same on every relaunch)."""
        kind, train, epoch, layer, chunk = key
        s = self.spec
        hold = [epoch, self.k, chunk] if self.mode == "async" and kind == "fwd" and train else None
        return {
            "token": self.node.token,
            "graph_server": self.node.address,
            "weight_servers": s["weight_servers"],
            "dropout": s["dropout"],
            "seed": s["seed"],
            "num_train": s["num_train"],
            "task": {"kind": kind, "train": train, "epoch": epoch, "layer": layer, "chunk": chunk, "server": self.k,
                     "version": self._version_for(key), "hold": hold, "attempt": self.tracker.attempts(key)},
        }

    def step(self) -> None:
        """One turn of waiting: serve requests, read acks and completions, relaunch what is due."""
        self.node.serve_once(self.handle, 5)
        for sock in [*self.peers.values(), *self.weight_servers]:
            while sock.poll(0):
                self._check_ack(sock.recv_multipart())
        for c in self.collect():
            if not c.ok:
                self.tracker.failed(self._key(c.task))
        for key in self.tracker.due(time.time()):
            self.invoke(key)

    def _version_for(self, key: tuple):
        """Weights version a task uses: sync trains on ``epoch - 1`` and evaluates on ``epoch``; async
        forwards take the newest (held), and a backward the one its forward used."""
        kind, train, epoch, layer, chunk = key
        if self.mode == "async":
            return self.fwd_version.get((layer, chunk)) if kind == "bwd" else None
        if kind in ("loss", "eval"):
            return None
        return epoch - 1 if train else epoch

    def send_ghosts(self, sock, tag: tuple, rows: np.ndarray) -> None:
        phase, train, epoch, layer = tag
        msg = Message("ghosts", {"phase": phase, "train": train, "epoch": epoch, "layer": layer, "src": self.k},
                      {"rows": np.ascontiguousarray(rows, dtype=np.float32)})
        sock.send_multipart(encode(msg, self.node.token), copy=False)

    def report(self, epoch: int) -> None:
        counts = self.masks.sum(axis=1).tolist()
        self.node.to_driver(Message("epoch_stats", {
            "rank": self.k, "epoch": epoch, "loss_sum": self.loss_sum.pop(epoch, 0.0),
            "correct": self.correct.pop(epoch, np.zeros(3, np.int64)).tolist(), "counts": counts,
            "epoch_s": time.perf_counter() - self.epoch_start.pop(epoch, time.perf_counter()),
            "relaunches": self.tracker.relaunches, "duplicates": self.duplicate_results}))
        self.send_task_rows()

    def collect(self) -> list:
        """The platform's new completions, each recorded as a task row."""
        done = self.platform.completions()
        for c in done:
            self._record(c)
        self.completed += len(done)
        return done

    def send_task_rows(self) -> None:
        self.collect()
        rows = "".join(json.dumps(r) + "\n" for r in self.task_rows).encode()
        self.task_rows = []
        self.node.to_driver(Message("tasks", {"rank": self.k}, {"jsonl": np.frombuffer(rows, np.uint8)}))

    def flush_tasks(self, timeout_s: float = 10.0) -> None:
        """Wait (bounded) for the completions of every invocation still out, so tasks.jsonl has them all."""
        deadline = time.monotonic() + timeout_s
        while self.collect() or (self.completed < self.invoked and time.monotonic() < deadline):
            time.sleep(0.01)
        self.send_task_rows()

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
        elif msg.op == "progress":
            require(msg, "src", "min_epoch")
            if int(msg["src"]) not in self.peers or self.pipe is None:
                raise ProtocolError(f"progress from unexpected source {msg['src']}")
            self.peer_min[int(msg["src"])] = max(self.peer_min[int(msg["src"])], int(msg["min_epoch"]))
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

    def _rows(self, key) -> dict[str, np.ndarray]:
        kind, train, _, layer, chunk = key
        a, b = self._chunk(chunk)
        p = (lambda: self.x[a:b] if layer == 0 else self.G[train][layer - 1][a:b])
        if kind == "fwd":
            return {"P": p()}
        if kind == "bwd":
            return {"P": p(), "dZ": self.dZ[layer][a:b]}
        logits = self.G[train][self.layers - 1][a:b]
        if kind == "loss":
            return {"logits": logits, "labels": self.labels[a:b], "train": self.masks[0, a:b]}
        return {"logits": logits, "labels": self.labels[a:b], "masks": self.masks[:, a:b]}

    def _check_result(self, key, msg: Message) -> None:
        kind, _, _, layer, chunk = key
        a, b = self._chunk(chunk)
        if kind == "fwd":
            require(msg, "version", shapes={"Z": (b - a, self.dims[layer + 1])})
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
        kind, train, epoch, layer, chunk = key
        a, b = self._chunk(chunk)
        if kind == "fwd":
            self.ZG[train][layer][a:b] = msg.tensors["Z"]
            if train and self.mode == "async":
                self.fwd_version[(layer, chunk)] = int(msg["version"])
        elif kind == "bwd":
            if layer > 0:
                self.dG[layer - 1][a:b] = msg.tensors["dG"]
            self.forward_gradient(key, int(msg["version"]), msg.tensors["dW"])
        elif kind == "loss":
            self.dG[self.layers - 1][a:b] = msg.tensors["dG"]
            self.loss_sum[epoch] = self.loss_sum.get(epoch, 0.0) + float(msg["loss_sum"])
        elif kind == "eval":
            self.correct[epoch] = self.correct.get(epoch, np.zeros(3, np.int64)) + np.array(msg["correct"], np.int64)
        if self.mode == "async":
            if kind == "fwd":
                self.scatter_chunk(train, epoch, layer, chunk)
            elif kind == "loss" or (kind == "bwd" and layer > 0):
                self.send_contributions(epoch, self.layers - 1 if kind == "loss" else layer - 1, chunk)
            self.pipe.done(chunk)

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
        src, layer, phase = int(msg["src"]), int(msg["layer"]), msg["phase"]
        if src not in self.peers or not 0 <= layer < self.layers or phase not in ("fwd", "efwd", "bwd"):
            raise ProtocolError(f"ghost rows from {src} for layer {layer} phase {phase!r} are not expected")
        width = self.dims[layer + 1]
        sl = self.part.ghosts_from(src)
        if "positions" not in msg.tensors:  # sync: whole slices, kept until the barrier consumes them
            n_rows = len(self.send_ids[src]) if phase == "bwd" else sl.stop - sl.start
            require(msg, shapes={"rows": (n_rows, width)})
            self.ghosts.setdefault((phase, bool(msg["train"]), int(msg["epoch"]), layer), {})[src] = msg.tensors["rows"]
            return
        if self.pipe is None:
            raise ProtocolError("asynchronous ghost rows sent to a server in sync mode")
        self.peer_min[src] = max(self.peer_min[src], int(msg.get("min_epoch", 1)))
        require(msg, "positions", shapes={"rows": (None, width)})
        pos = msg.tensors["positions"]
        limit = len(self.send_ids[src]) if phase == "bwd" else sl.stop - sl.start
        if pos.dtype != np.int64 or pos.shape != (len(msg.tensors["rows"]),):
            raise ProtocolError("ghost positions must be int64, one per row")
        if len(pos) and (pos.min() < 0 or pos.max() >= limit):
            raise ProtocolError(f"ghost positions out of range [0, {limit})")
        if phase == "bwd":  # replace this (peer, chunk)'s previous contribution by the new one
            require(msg, "chunk")
            key = (layer, src, int(msg["chunk"]))
            new = np.array(msg.tensors["rows"])
            old = self.remote_parts.get(key)
            rows = self.send_ids[src].numpy()[pos]  # unique: plain fancy-index add is exact
            self.remote_dz[layer][rows] += new if old is None or old.shape != new.shape else new - old
            self.remote_parts[key] = new
            return
        self.ZG[phase == "fwd"][layer][self.n + sl.start + pos] = msg.tensors["rows"]

    def _record(self, c) -> None:
        t = c.task
        self.task_rows.append({"kind": t["kind"], "train": t["train"], "server": self.k, "chunk": t["chunk"],
                               "epoch": t["epoch"], "layer": t["layer"], "attempt": t.get("attempt", 1),
                               "where": c.where, "start": c.start, "end": c.end, "billed_ms": c.billed_ms,
                               "memory_mb": c.memory_mb, "ok": c.ok, "error": c.error})

    def _graph_row(self, kind: str, epoch: int, layer: int, t0: float, chunk=None) -> dict:
        return {"kind": kind, "train": True, "server": self.k, "chunk": chunk, "epoch": epoch, "layer": layer,
                "attempt": 1, "where": "graph-server", "start": t0, "end": time.time(), "billed_ms": 0,
                "memory_mb": 0, "ok": True, "error": ""}

    def close(self) -> None:
        if hasattr(self, "graph_pool"):
            self.graph_pool.shutdown(wait=True, cancel_futures=True)
            self.wake_send.close(0)
            self.wake_recv.close(0)
        self.platform.close()
        for s in [*self.peers.values(), *self.weight_servers]:
            s.close(0)
