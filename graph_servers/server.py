"""The graph server process: the I/O shell around the scheduler and the partition's arrays.

Everything it decides comes from :class:`~dorylus_py.pipeline.scheduler.Scheduler`: the shell turns
each request from a tensor worker, each peer message, each platform completion, each finished graph
job and the clock into an event, and carries out the instructions it gets back (invoke a task,
answer a pull with rows or ``cancel``, apply a result, send rows to peers, forward a gradient, run
Gather on the graph thread, report an epoch). The maths on the arrays is
:class:`~graph_servers.graph_state.GraphState`'s. Graph jobs run on a thread of their own (torch
releases the GIL in the sparse products), so the loop keeps answering the workers meanwhile; only
the loop thread changes the scheduler or records task rows.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import zmq

from dorylus_py.cluster.job import JobSpec
from dorylus_py.cluster.node import Node, peak_rss_mb
from dorylus_py.cluster.rejections import REJECTED
from dorylus_py.errors import DorylusError
from dorylus_py.models import spec_of
from dorylus_py.models.spec import fuses_last_layer
from dorylus_py.partition.store import PartitionStore
from dorylus_py.pipeline import events as ev
from dorylus_py.pipeline.scheduler import Scheduler
from dorylus_py.pipeline.stages import task_kinds, task_stages
from dorylus_py.pipeline.tasks import RelaunchPolicy
from dorylus_py.protocol import Message, ProtocolError, require
from dorylus_py.weights.blocks import servers_of_layer, split, weight_blocks
from graph_servers.direct import DirectLink, DirectSlot
from graph_servers.graph_state import FusedInput, GraphState
from graph_servers.pool import AutoPool
from graph_servers.received import ALL_CHUNKS
from graph_servers.staging import BlockStaging
from graph_servers.task_io import (
    STATIC, apply_result, check_result, chunk_rows, has_static, per_row_widths, staging_cap, static_tokens, streams,
    task_block, task_rows,
)
from graph_servers.usage import Usage
from graph_servers.workers import make_platform
from graph_servers.wire import held_tokens, integer, peer_rows, run_id, task_event, task_of

log = logging.getLogger("dorylus.graph_server")


class GraphServer:
    def __init__(self, node: Node, start: Message):
        self.node = node
        self.spec = spec = JobSpec.from_wire(start["spec"])
        cfg = spec.config
        node.set_hang_timeout(cfg.hang_timeout_s)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)  # --threads: the sparse products' intra-op threads
        self.k = node.rank
        store = PartitionStore.open(spec.data_dir)
        part = store.load(self.k)
        self.model = spec_of(cfg, spec.dims)
        fused_last = fuses_last_layer(self.model.name, self.model.num_layers, cfg.fuse, cfg.backend,
                                      cfg.lambda_latency_ms)
        stages = self.model.stages(fused_last)
        self.kinds, self.by_task = task_kinds(stages), task_stages(stages)
        self.graph_train = {s.name: s.train for s in stages if s.task is None}  # graph stage -> training pass
        fused = FusedInput(cfg.dropout, cfg.seed, spec.id_offsets[self.k]) if fused_last else None
        self.state = GraphState(part, self.model, spec.chunk_counts, spec.feature_norm,
                                spec.edge_offsets[self.k] if spec.edge_offsets else 0, fused, sync=spec.mode == "sync",
                                remat=cfg.remat)
        # the static rows' name per chunk, where workers cache them (task_io.py); no checksum: this start's own
        features = store.manifest["parts"][self.k]["files"]["features.npy"].get("sha256") or os.urandom(16).hex()
        self.static_tokens = static_tokens(self.state, json.dumps([features, part.feature_dtype, self.k])) \
            if cfg.resolved_row_cache_mb() else None
        self.peers = {p: self._dealer(a) for p, a in enumerate(spec.graph_servers) if p != self.k}
        self.weight_servers = [self._dealer(a) for a in spec.weight_servers]
        self.blocks = weight_blocks(self.model.tensors(), len(spec.weight_servers))
        self.layer_servers = [servers_of_layer(self.blocks, l) for l in range(self.model.num_layers)]
        self.platform = make_platform(spec, self.k, node)
        self.direct: DirectLink | None = getattr(self.platform, "direct", None)
        policy = RelaunchPolicy(cfg.relaunch_min_s, cfg.relaunch_factor, self.platform.startup_hint_s)
        self.scheduler = Scheduler(
            rank=self.k, chunks=self.state.chunks, layers=spec.layers, epochs=cfg.epochs, mode=spec.mode,
            staleness=cfg.staleness, peers=tuple(self.peers), peer_chunks=spec.total_chunks - spec.chunk_counts[self.k],
            first_epoch=spec.first_epoch, policy=policy, stall_s=cfg.wait_timeout_s, stages=tuple(stages),
            workers=self.platform.concurrency, epoch_gate=0 if cfg.remat else 1)
        # Graph jobs run on one thread of their own; a finished one wakes the loop through an inproc socket.
        self.graph_pool = ThreadPoolExecutor(1, thread_name_prefix="graph")
        self.graph_out = 0  # graph jobs submitted and not done
        tasks_per_epoch = self.state.chunks * sum(s.task is not None for s in stages)
        self.auto_pool = AutoPool.of(spec, self.platform, self.k, tasks_per_epoch)
        self.graph_done: queue.SimpleQueue = queue.SimpleQueue()
        wake = f"inproc://graph-done-{id(self)}"
        self.wake_recv = node.ctx.socket(zmq.PULL)
        self.wake_recv.bind(wake)
        self.wake_send = node.ctx.socket(zmq.PUSH)
        self.wake_send.connect(wake)
        node.poller.register(self.wake_recv, zmq.POLLIN)
        node.on_driver = self.on_driver
        self.loss_sum: dict[int, float] = {}
        self.correct: dict[int, np.ndarray] = {}
        self.epoch_start: dict[int, float] = {}
        self.task_rows: list[dict] = []  # the loop thread's alone
        self.stats = {"invoked": 0, "completed": 0, "duplicates": 0, "blocks": 0}
        self.gradients_sent: dict[tuple, int] = {}  # (epoch, layer, chunk) -> times forwarded (once)
        self.usage = Usage()
        self.staging = BlockStaging(staging_cap(self.state))  # streamed tasks' result blocks until their commit
        self.finished = False
        log.info("graph server %d start %s", self.k, json.dumps({
            "rank": self.k, "vertices": self.state.n, "edges": self.state.edges, "ghosts": self.state.g,
            "structure_bytes": self.state.structure_bytes,
            "structure_bytes_per_edge": round(self.state.structure_bytes / max(self.state.edges, 1), 2),
            "peers": len(self.peers), "chunks": self.state.chunks, "platform": self.platform.name,
            "fused_last_layer": fused is not None, "remat": cfg.remat, "buffer_bytes": self.state.buffer_bytes,
            "first_epoch": spec.first_epoch, "restart": spec.restart, "job": node.session.job.hex()}))

    def _dealer(self, address: str) -> zmq.Socket:
        return self.node.dealer(address, answered=True)  # peers and weight servers answer every message

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> None:
        self.usage.start()
        self.feed(ev.Tick(time.time()))
        while not self.finished:
            self._serve_once(5)
            self._read_acks()
            self._collect()
            self._graph_jobs_done()
            self.feed(ev.Tick(time.time()))
            if self.auto_pool is not None:
                self._tune_pool()
        self._flush_tasks()
        self.node.to_driver(Message("epoch_stats", {"rank": self.k, "finished": True}))
        while True:  # serve late copies (they are told to stop) until the driver says stop
            self._serve_once(200)
            self._read_acks()
            self._collect()

    def _serve_once(self, timeout_ms: int) -> None:
        """Requests from the sockets, then from in-process workers (which wake the same poll)."""
        self.node.serve_once(self.handle, timeout_ms)
        if self.direct is not None:
            self.direct.serve(self.handle, REJECTED, lambda e: self.node.rejections.add("invalid", e))

    def feed(self, event, request: tuple | None = None, msg: Message | None = None) -> None:
        """Give the scheduler an event and carry out its instructions; ``request`` (identity, req,
        op) and ``msg`` belong to the worker request the event came from."""
        for inst in self.scheduler.handle(event):
            self.execute(inst, request, msg)

    def execute(self, inst, request, msg) -> None:
        kind = type(inst)
        if kind is ev.Invoke:
            self.stats["invoked"] += 1
            key = inst.key
            weighted = self.by_task[(key.kind, key.train, key.layer)].weights is not None
            servers = [self.spec.weight_servers[w] for w in self.layer_servers[key.layer]] if weighted else []
            self.platform.invoke(task_event(self.spec, self.k, self.node.address, self.node.curve, self.node.session.job,
                                            inst, servers, chunk_rows(self.state, key.chunk) if streams(self.state, key) else 0))
        elif kind is ev.Serve:
            key = inst.key
            token = self.static_tokens[key.chunk] if self.static_tokens and has_static(key) else None
            rows = task_rows(self.state, key, static_held=token is not None and token in held_tokens(msg.get("have")),
                             span=task_block(self.state, key, msg))
            (a, b), ((lo, _), (glo, _)) = self.state.chunk(key.chunk), self.state.edge_runs(key.chunk)
            fields = {"start": a, "stop": b, "id_start": self.spec.id_offsets[self.k] + a, "sent": time.time(),
                      "edge_start": self.state.edge_offset + lo, "ghost_edge_start": self.state.edge_offset + glo}
            self._answer(request, Message("rows", fields | ({"static": {STATIC: token}} if token else {}), rows))
        elif kind is ev.Cancel:
            self._answer(request, Message("duplicate" if request[2] == "push_result" else "cancel", {"reason": inst.reason}))
        elif kind is ev.Accept:
            self._accept(inst.key, msg)
            self._answer(request, Message("ok", {}))
        elif kind is ev.SendRows:
            self._send_rows(inst)
        elif kind is ev.ForwardGradient:
            self._forward_gradient(inst, msg)
        elif kind is ev.RunGraph:
            self.epoch_start.setdefault(inst.epoch, time.perf_counter())
            self.graph_out += 1
            self.graph_pool.submit(self._graph_job, inst)
        elif kind is ev.SendProgress:
            for sock in self.peers.values():
                self._send(sock, Message("progress", {"src": self.k, "min_epoch": inst.min_epoch}))
        elif kind is ev.ReportEpoch:
            self._report(inst.epoch)
        elif kind is ev.Frozen:
            self.node.to_driver(Message("switch", {"rank": self.k, "frozen_at": inst.at_epoch}))
        elif kind is ev.Finished:
            self.finished = True
        elif kind is ev.Stuck:
            raise DorylusError(f"graph server {self.k}: {inst.reason}")
        if kind is ev.Invoke:
            self.epoch_start.setdefault(inst.key.epoch, time.perf_counter())

    # --- requests from tensor workers and peers ----------------------------------------------------

    def handle(self, identity: bytes, msg: Message) -> None:
        s = self.state
        if not isinstance(identity, DirectSlot):  # in-process requests cross no socket
            self.usage.received(msg.tensors)
        req = msg.get("req")
        request = (identity, req if isinstance(req, str) else None, msg.op)
        if msg.op == "pull_rows":
            require(msg, "task")
            key, attempt = task_of(msg["task"], s.layers, s.chunks, self.kinds)
            held_tokens(msg.get("have"))  # checked before the scheduler hears of the pull; Serve reads it
            task_block(s, key, msg)
            self.feed(ev.TaskPulled(key, attempt, time.time()), request, msg)
        elif msg.op == "push_block":  # staged, unanswered: the task's push_result commits or fails for it
            require(msg, "task")
            key, attempt = task_of(msg["task"], s.layers, s.chunks, self.kinds)
            lo, hi = task_block(s, key, msg, required=True)
            if self.scheduler.tracker.copy_running(key, attempt):  # else a late copy's: not kept
                self.staging.add((key, attempt, run_id(msg)), chunk_rows(s, key.chunk), lo, hi, msg.tensors,
                                 per_row_widths(s, key))
                self.stats["blocks"] += 1
        elif msg.op == "push_result":
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
        elif msg.op == "ghosts":
            phase, src, epoch, layer, src_chunk, min_epoch = peer_rows(msg, s.layers)
            self._check_peer_epoch(epoch, "ghosts")
            self._check_peer_progress(min_epoch)
            s.store_peer_rows(phase, src, layer, src_chunk, msg.tensors)
            self.node.reply(identity, Message("ok", {}))
            covers = s.chunk_counts[src] if src_chunk == ALL_CHUNKS else 1  # a sync sum stands for all its chunks
            self.feed(ev.RowsArrived(phase, epoch, layer, src, covers))
            self.feed(ev.PeerProgress(src, min_epoch))
        elif msg.op == "progress":
            require(msg, "src", "min_epoch")
            src = integer(msg["src"], "src")
            if src not in self.peers:
                raise ProtocolError(f"progress from unexpected source {src}")
            min_epoch = integer(msg["min_epoch"], "min_epoch", 1)
            self._check_peer_progress(min_epoch)
            self.node.reply(identity, Message("ok", {}))
            self.feed(ev.PeerProgress(src, min_epoch))
        else:
            raise ProtocolError(f"op {msg.op} is not served by a graph server")

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
        """The switch back to sync mode, in two steps so that no server has started the switch epoch:
        freeze (start no epoch beyond those already started, and say how far that is); then the
        driver's ``at_epoch``, one past every server's frozen epoch, is where sync mode begins."""
        if msg.op != "switch":
            return
        at = msg.get("at_epoch")
        self.feed(ev.Freeze() if at is None else ev.SwitchAt(integer(at, "at_epoch", 1)))

    def _answer(self, request, reply: Message) -> None:
        identity, req, _ = request
        reply.fields["req"] = req
        if isinstance(identity, DirectSlot):
            identity.answer(reply)
            return
        self.usage.sent(reply.tensors)
        self.node.reply(identity, reply)

    def _accept(self, key: ev.TaskKey, msg: Message) -> None:
        apply_result(self.state, key, msg.tensors)
        if key.kind in ("loss", "fused"):
            self.loss_sum[key.epoch] = self.loss_sum.get(key.epoch, 0.0) + float(msg["loss_sum"])
        elif key.kind == "eval":
            self.correct[key.epoch] = self.correct.get(key.epoch, np.zeros(3, np.int64)) + np.array(msg["correct"], np.int64)

    def _send_rows(self, inst: ev.SendRows) -> None:
        s, chunk = self.state, inst.chunk
        if inst.phase in ("fwd", "efwd"):
            parts = s.rows_for_peers(inst.phase == "fwd", inst.layer, inst.chunk)
        else:  # sync: one message per peer, once every chunk's contribution is in the sum
            contrib = (s.summed_contributions if s.sync else s.contributions)(inst.phase, inst.layer, inst.chunk)
            if contrib is None:
                return
            parts = {p: (pos, {"rows": rows}) for p, (pos, rows) in contrib.items()}
            chunk = ALL_CHUNKS if s.sync else chunk
        fields = {"phase": inst.phase, "epoch": inst.epoch, "layer": inst.layer, "src": self.k, "chunk": chunk,
                  "min_epoch": self.scheduler.pipe.min_epoch()}
        for p, (positions, tensors) in parts.items():
            self._send(self.peers[p], Message("ghosts", fields, {"positions": positions} | tensors))

    def _forward_gradient(self, inst: ev.ForwardGradient, msg: Message) -> None:
        """An accepted backward task's gradients, cut into row blocks: to each weight server its blocks."""
        key = inst.key
        tensors = {t.name: msg.tensors[f"grad:{t.name}"] for t in self.model.layer_tensors(key.layer)}
        grads = split([b for b in self.blocks if b.layer == key.layer], tensors)
        fields = {"layer": key.layer, "version": inst.version, "key": [key.epoch, self.k, key.chunk]}
        sent = (key.epoch, key.layer, key.chunk)
        self.gradients_sent[sent] = self.gradients_sent.get(sent, 0) + 1
        for w in self.layer_servers[key.layer]:
            mine = {b.name: grads[b.name] for b in self.blocks if b.layer == key.layer and b.server == w}
            self._send(self.weight_servers[w], Message("push_grad", fields, mine))

    def _send(self, sock: zmq.Socket, msg: Message) -> None:
        self.usage.sent(msg.tensors)
        self.node.send(sock, msg)

    def _read_acks(self) -> None:
        for sock in [*self.peers.values(), *self.weight_servers]:
            while sock.poll(0):
                reply = self.node.receive(sock)
                if reply is not None and reply.op == "error":
                    raise DorylusError(f"graph server {self.k}: a peer or weight server refused our message: "
                                       f"{reply.get('reason')}")

    # --- platform completions and graph jobs -----------------------------------------------------

    def _collect(self) -> None:
        for c in self.platform.completions():
            self.stats["completed"] += 1
            t = c.task
            self.task_rows.append({"kind": t["kind"], "train": t["train"], "server": self.k, "chunk": t["chunk"],
                                   "epoch": t["epoch"], "layer": t["layer"], "attempt": t.get("attempt", 1),
                                   "where": c.where, "start": c.start, "end": c.end, "billed_ms": c.billed_ms,
                                   "memory_mb": c.memory_mb, "ok": c.ok, "error": c.error})
            if self.auto_pool is not None:
                self.auto_pool.finished(c)
            key = ev.TaskKey(t["kind"], t["train"], t["epoch"], t["layer"], t["chunk"])
            self.feed(ev.TaskEnded(key, t.get("attempt", 1), c.ok, time.time(), c.error))
            self.staging.forget(key, t.get("attempt", 1))

    def _graph_job(self, inst: ev.RunGraph) -> None:
        """Runs on the graph thread; the loop learns of it through ``graph_done`` and a wake-up message."""
        self.usage.on_graph_thread()
        t0 = time.time()
        try:
            self.state.run_graph(inst.stage, inst.epoch, inst.layer, inst.chunk)
            self.graph_done.put((inst, t0, time.time(), None))
        except BaseException as e:  # noqa: BLE001  (re-raised on the loop's thread)
            self.graph_done.put((inst, t0, time.time(), e))
        self.wake_send.send(b"", zmq.NOBLOCK)

    def _graph_jobs_done(self) -> None:
        while self.wake_recv.poll(0):
            self.wake_recv.recv()
        while not self.graph_done.empty():
            inst, t0, t1, error = self.graph_done.get()
            self.graph_out -= 1
            if error is not None:
                raise error
            self.task_rows.append({"kind": inst.stage, "train": self.graph_train[inst.stage], "server": self.k,
                                   "chunk": inst.chunk, "epoch": inst.epoch, "layer": inst.layer, "attempt": 1,
                                   "where": "graph-server", "start": t0, "end": t1, "billed_ms": 0, "memory_mb": 0,
                                   "ok": True, "error": ""})
            self.feed(ev.GraphDone(inst.stage, inst.epoch, inst.layer, inst.chunk, time.time()))

    def _tune_pool(self) -> None:
        """``--lambdas auto``: the tuner measures the pool; a resize it makes goes into tasks.jsonl."""
        row = self.auto_pool.tick(self.graph_out > 0, self.scheduler.pipe.min_epoch())
        if row is not None:
            self.task_rows.append(row)
            self.scheduler.tracker.workers = self.platform.concurrency

    # --- the driver --------------------------------------------------------------------------------

    def _report(self, epoch: int) -> None:
        t = self.scheduler.tracker
        self.node.to_driver(Message("epoch_stats", {
            "rank": self.k, "epoch": epoch, "loss_sum": self.loss_sum.pop(epoch, 0.0),
            "correct": self.correct.pop(epoch, np.zeros(3, np.int64)).tolist(),
            "counts": self.state.masks.sum(axis=1).tolist(),
            "epoch_s": time.perf_counter() - self.epoch_start.pop(epoch, time.perf_counter()),
            "relaunches": t.relaunches, "duplicates": t.refused, **self._gradient_counts(), "usage": self.usage.epoch()}))
        self._send_task_rows()

    def _gradient_counts(self) -> dict:
        """Gradients forwarded to the weight servers so far (one per key), and sends of a key beyond its first."""
        return {"gradients_sent": sum(self.gradients_sent.values()),
                "gradients_resent": sum(n - 1 for n in self.gradients_sent.values())}

    def _send_task_rows(self) -> None:
        rows = "".join(json.dumps(r) + "\n" for r in self.task_rows).encode()
        self.task_rows = []
        self.node.to_driver(Message("tasks", {"rank": self.k}, {"jsonl": np.frombuffer(rows, np.uint8)}))

    def _flush_tasks(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for the completions of every copy still out, so tasks.jsonl has them all."""
        deadline = time.monotonic() + timeout_s
        while self.stats["completed"] < self.stats["invoked"] and time.monotonic() < deadline:
            self._serve_once(10)
            self._collect()
        self._send_task_rows()

    def _log_end(self) -> None:
        t = self.scheduler.tracker
        log.info("graph server %d end %s", self.k, json.dumps({
            "rank": self.k, "epochs": self.scheduler.reported - self.spec.first_epoch + 1, "tasks": self.stats["invoked"],
            "completed": self.stats["completed"], "result_blocks": self.stats["blocks"],
            "relaunches": t.relaunches, "duplicates": t.refused, **self._gradient_counts(),
            "bytes_sent": self.usage.totals["bytes_sent"],
            "bytes_received": self.usage.totals["bytes_received"], "workers_replaced": getattr(self.platform, "replaced", 0),
            "peak_rss_mb": peak_rss_mb()}))

    def close(self) -> None:
        self._log_end()
        self.graph_pool.shutdown(wait=True, cancel_futures=True)
        self.node.poller.unregister(self.wake_recv)  # the node serves the next job with its poller
        self.wake_send.close(0)
        self.wake_recv.close(0)
        self.platform.close()
        if self.direct is not None:
            self.direct.close()
        for s in [*self.peers.values(), *self.weight_servers]:
            s.close(0)
