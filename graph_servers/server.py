"""The graph server process: the I/O shell around the scheduler and the partition's arrays.

Everything it decides comes from :class:`~dorylus_py.pipeline.scheduler.Scheduler`: the shell turns
each request from a tensor worker, each peer message, each platform completion, each finished graph
job and the clock into an event, and carries out the instructions it gets back (invoke a task,
answer a pull with rows or ``cancel``, apply a result, send rows to peers, forward a gradient, run
Gather on the graph thread, report an epoch), each by the method named after it, as the scheduler
handles each event. What arrives is checked and turned into events in ``requests.py``; the maths on
the arrays is :class:`~graph_servers.graph_state.GraphState`'s. Graph jobs run on a thread of their
own (``graph_thread.py``), so the loop keeps answering the workers meanwhile; only the loop thread
changes the scheduler or records task rows.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import OrderedDict

import numpy as np
import torch
import zmq

from dorylus_py.errors import DorylusError
from dorylus_py.models import spec_of
from dorylus_py.models.spec import fuses_last_layer
from dorylus_py.partition.store import PartitionStore
from dorylus_py.pipeline import events as ev
from dorylus_py.pipeline.leases import Dispatcher, Lease
from dorylus_py.pipeline.scheduler import Scheduler
from dorylus_py.pipeline.stages import task_kinds, task_stages
from dorylus_py.pipeline.tasks import RelaunchPolicy
from dorylus_py.platforms import InprocPlatform
from dorylus_py.protocol import Message
from dorylus_py.protocol.quantize import narrowed
from dorylus_py.serving.job import JobSpec
from dorylus_py.serving.node import ServerNode, hex16, peak_rss_mb
from dorylus_py.serving.rejections import REJECTED
from dorylus_py.weights.blocks import servers_of_layer, split, weight_blocks
from graph_servers.direct import DIRECT
from graph_servers.graph_state import FusedInput, GraphState
from graph_servers.graph_thread import GraphThread
from graph_servers.leasing import LEASE_DEPTH, Leasing
from graph_servers.pool import AutoPool
from graph_servers.received import ALL_CHUNKS
from graph_servers.requests import Requests
from graph_servers.staging import BlockStaging
from graph_servers.task_io import apply_result, staging_cap, static_tokens
from graph_servers.usage import Usage
from graph_servers.wire import ghost_placement
from graph_servers.workers import direct_workers, make_platform, server_device, tasks_here

log = logging.getLogger("dorylus.graph_server")

# what the scheduler may tell the server to do, each carried out by the method ``_on_<its class name>``
INSTRUCTIONS = (ev.Invoke, ev.Serve, ev.Cancel, ev.Accept, ev.SendRows, ev.ForwardGradient, ev.RunGraph,
                ev.SendProgress, ev.ReportEpoch, ev.Frozen, ev.Finished, ev.Stuck)


class GraphServer(Requests, Leasing):
    def __init__(self, node: ServerNode, start: Message):
        super().__init__()  # the requests' handlers, by op (requests.py)
        self.carry_out = {kind: getattr(self, f"_on_{kind.__name__}") for kind in INSTRUCTIONS}
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
        fused_last = fuses_last_layer(self.model.name, self.model.num_layers, cfg.fuse) and not spec.forward_only
        stages = self.model.stages(fused_last)
        if spec.forward_only:  # dorylus predict: the evaluation forward and eval, no training pass
            stages = [s for s in stages if not s.train]
        self.kinds, self.by_task = task_kinds(stages), task_stages(stages)
        self.graph_train = {s.name: s.train for s in stages if s.task is None}  # graph stage -> training pass
        fused = FusedInput(cfg.dropout, cfg.seed, spec.id_offsets[self.k]) if fused_last else None
        device = server_device(spec, self.k)
        self.state = GraphState(part, self.model, spec.chunk_counts, spec.feature_norm,
                                spec.edge_offsets[self.k] if spec.edge_offsets else 0, fused, sync=spec.mode == "sync",
                                remat=cfg.remat, device=device,
                                smoothing=cfg.stale_smoothing if spec.mode == "async" else 0.0)
        # the static rows' name per chunk, where workers cache them (task_io.py); no checksum: this start's own
        features = store.manifest["parts"][self.k]["files"]["features.npy"].get("sha256") or os.urandom(16).hex()
        self.static_tokens = static_tokens(self.state, json.dumps([features, part.feature_dtype, self.k])) \
            if cfg.resolved_row_cache_mb() else None
        self.peers = {p: self._dealer(a) for p, a in enumerate(spec.graph_servers) if p != self.k}
        push = node.session.sibling(hex16(start.get("push_id"), "start: push_id"))  # our gradients' sender (weights/server.py)
        self.weight_servers = [node.dealer(a, answered=True, session=push) for a in spec.weight_servers]
        self.blocks = weight_blocks(self.model.tensors(), len(spec.weight_servers))
        self.layer_servers = [servers_of_layer(self.blocks, l) for l in range(self.model.num_layers)]
        self.usage = Usage()
        self.platform = make_platform(spec, self.k, node, device, self._lease_event(DIRECT, device), self.usage)
        self.here = tasks_here(self.model, stages, cfg)  # (kind, layer) of the tasks its own threads run
        self.direct = getattr(self.platform, "direct", None)  # the cpu/gpu backends' own threads
        self.own_direct = self.direct is None and bool(self.here)  # --offload auto: one thread beside the Lambdas
        if self.own_direct:
            self.direct = direct_workers(node, 1, self._lease_event(DIRECT, device), self.usage)
        pool = 0 if isinstance(self.platform, InprocPlatform) else self.platform.concurrency
        own = self.direct.threads if self.direct is not None else 0  # its own threads, of either kind
        self.dispatcher = Dispatcher(pool, LEASE_DEPTH, own)
        if self.direct is not None:  # a lease that never ends, as many copies out as threads
            self.dispatcher.own_threads(DIRECT, self.direct, time.time())
        self.copies: dict[tuple, ev.Invoke] = {}  # copies launched and not ended -> how (version, hold)
        self.sent_at: dict[tuple, float] = {}  # copies sent to a lease -> when
        self.leases_alive: dict[str, float] = {}  # leases invoked whose invocation has not ended -> when
        self.leases_over: OrderedDict = OrderedDict()  # leases ended here -> their worker (leasing.py)
        policy = RelaunchPolicy(cfg.relaunch_min_s, cfg.relaunch_factor, self.platform.startup_hint_s)
        self.scheduler = Scheduler(
            rank=self.k, chunks=self.state.chunks, layers=spec.layers, epochs=cfg.epochs, mode=spec.mode,
            staleness=cfg.staleness, peers=tuple(self.peers), peer_chunks=spec.total_chunks - spec.chunk_counts[self.k],
            first_epoch=spec.first_epoch, policy=policy, stall_s=cfg.wait_timeout_s, stages=tuple(stages),
            workers=pool + own, epoch_gate=0 if cfg.remat else 1, local_barrier=cfg.local_barrier,
            sync_epochs=cfg.sync_epochs, fresh_wait_s=cfg.fresh_wait_ms / 1000 if spec.mode == "async" else 0.0)
        self.graph_thread = GraphThread(node.ctx, node.poller, self._graph_job)
        tasks_per_epoch = self.state.chunks * sum(s.task is not None for s in stages)
        self.auto_pool = AutoPool.of(spec, self, self.k, tasks_per_epoch)
        node.on_driver = self.on_driver
        self.loss_sum: dict[int, float] = {}
        self.correct: dict[int, np.ndarray] = {}
        self.epoch_start: dict[int, float] = {}
        self.task_rows: list[dict] = []  # the loop thread's alone
        self.stats = {"invoked": 0, "completed": 0, "duplicates": 0, "blocks": 0, "leases": 0,
                      "peer_rows_fresh": 0, "peer_rows_late": 0}  # async: peer messages in time for their epoch's read, or not
        self.gradients_sent: dict[tuple, int] = {}  # (epoch, layer, chunk) -> times forwarded (once)
        self.staging = BlockStaging(staging_cap(self.state))  # streamed tasks' result blocks until their commit
        self.finished = False
        log.info("graph server %d start %s", self.k, json.dumps({
            "rank": self.k, "vertices": self.state.n, "edges": self.state.edges, "ghosts": self.state.g,
            "structure_bytes": self.state.structure_bytes,
            "structure_bytes_per_edge": round(self.state.structure_bytes / max(self.state.edges, 1), 2),
            "peers": len(self.peers), "chunks": self.state.chunks, "platform": self.platform.name,
            "fused_last_layer": fused is not None, "remat": cfg.remat, "buffer_bytes": self.state.buffer_bytes,
            "device": device, "device_twin_bytes": self.state.dev.twin_bytes,
            "first_epoch": spec.first_epoch, "restart": spec.restart}))

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
            self._dispatch()
        self._flush_tasks()
        self.node.to_driver(Message("epoch_stats", {"rank": self.k, "finished": True}))
        while True:  # answer late leases (they are released) until the driver says stop
            self._serve_once(200)
            self._read_acks()
            self._collect()

    def _serve_once(self, timeout_ms: int) -> None:
        """Messages from the sockets, then results of in-process workers (which wake the same poll)."""
        self.node.serve_once(self.handle, timeout_ms)
        if self.direct is not None:
            self.direct.serve(self.handle, REJECTED, lambda e: self.node.rejections.add("invalid", e))

    def feed(self, event, to: tuple[Lease, tuple] | None = None, msg: Message | None = None) -> None:
        """Give the scheduler an event and carry out its instructions; ``to``: the lease a copy is being
        sent to and the copy, or ``msg``: the result the event came with (the instructions that act on
        them need them)."""
        for inst in self.scheduler.handle(event):
            self.carry_out[type(inst)](inst, to, msg)

    # --- the scheduler's instructions, each carried out by ``_on_<its name>`` ------------------------

    def _on_Accept(self, inst: ev.Accept, to, msg: Message) -> None:
        key = inst.key
        apply_result(self.state, key, msg.tensors)
        if key.kind in ("loss", "fused"):
            self.loss_sum[key.epoch] = self.loss_sum.get(key.epoch, 0.0) + float(msg["loss_sum"])
        elif key.kind == "eval":
            self.correct[key.epoch] = self.correct.get(key.epoch, np.zeros(3, np.int64)) + np.array(msg["correct"], np.int64)

    def _on_SendRows(self, inst: ev.SendRows, to, msg) -> None:
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
            at, listed = ghost_placement(positions)
            self._send(self.peers[p], Message("ghosts", fields | at, listed | tensors,
                                              wire=narrowed(tensors, self.spec.config.wire_dtype)))

    def _on_ForwardGradient(self, inst: ev.ForwardGradient, to, msg: Message) -> None:
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

    def _on_RunGraph(self, inst: ev.RunGraph, to, msg) -> None:
        self.epoch_start.setdefault(inst.epoch, time.perf_counter())
        self.graph_thread.submit(inst)

    def _on_SendProgress(self, inst: ev.SendProgress, to, msg) -> None:
        for sock in self.peers.values():
            self._send(sock, Message("progress", {"src": self.k, "min_epoch": inst.min_epoch}))

    def _on_ReportEpoch(self, inst: ev.ReportEpoch, to, msg) -> None:
        self._report(inst.epoch)

    def _on_Frozen(self, inst: ev.Frozen, to, msg) -> None:
        self.node.to_driver(Message("switch", {"rank": self.k, "frozen_at": inst.at_epoch}))

    def _on_Finished(self, inst: ev.Finished, to, msg) -> None:
        self.finished = True

    def _on_Stuck(self, inst: ev.Stuck, to, msg) -> None:
        raise DorylusError(f"graph server {self.k}: {inst.reason}")

    # --- peers and weight servers ------------------------------------------------------------------

    def _send(self, sock: zmq.Socket, msg: Message) -> None:
        self.usage.sent(msg)
        self.node.send(sock, msg)

    def _read_acks(self) -> None:
        for sock in [*self.peers.values(), *self.weight_servers]:
            while sock.poll(0):
                reply = self.node.receive(sock)
                if reply is not None and reply.op == "error":
                    raise DorylusError(f"graph server {self.k}: a peer or weight server refused our message: "
                                       f"{reply.get('reason')}")

    # --- platform completions and graph jobs -----------------------------------------------------

    def _graph_job(self, inst: ev.RunGraph) -> None:
        """Runs on the graph thread (``graph_thread.py``)."""
        self.usage.on_graph_thread()
        self.state.run_graph(inst.stage, inst.epoch, inst.layer, inst.chunk)

    def _graph_jobs_done(self) -> None:
        for inst, t0, t1 in self.graph_thread.finished():
            self.task_rows.append({"kind": inst.stage, "train": self.graph_train[inst.stage], "server": self.k,
                                   "chunk": inst.chunk, "epoch": inst.epoch, "layer": inst.layer, "attempt": 1,
                                   "where": "graph-server", "start": t0, "end": t1, "billed_ms": 0, "memory_mb": 0,
                                   "ok": True, "error": ""})
            self.feed(ev.GraphDone(inst.stage, inst.epoch, inst.layer, inst.chunk, time.time()))

    def _tune_pool(self) -> None:
        """``--lambdas auto``: the tuner measures the pool; a resize it makes goes into tasks.jsonl."""
        row = self.auto_pool.tick(self.graph_thread.out > 0, self.scheduler.pipe.min_epoch())
        if row is not None:
            self.task_rows.append(row)
            self.scheduler.tracker.workers = self.dispatcher.size

    # --- the driver --------------------------------------------------------------------------------

    def _report(self, epoch: int) -> None:
        if self.spec.forward_only:
            self._send_outputs()
        t = self.scheduler.tracker
        self.node.to_driver(Message("epoch_stats", {
            "rank": self.k, "epoch": epoch, "loss_sum": self.loss_sum.pop(epoch, 0.0),
            "correct": self.correct.pop(epoch, np.zeros(3, np.int64)).tolist(),
            "counts": self.state.masks.sum(axis=1).tolist(),
            "epoch_s": time.perf_counter() - self.epoch_start.pop(epoch, time.perf_counter()),
            "relaunches": t.relaunches, "duplicates": t.refused, **self._gradient_counts(),
            "refused_messages": self.node.rejections.unexpected, "usage": self.usage.epoch()}))
        self._send_task_rows()

    def _send_outputs(self) -> None:
        """dorylus predict: the evaluation forward's logits and last hidden layer (activated) of our vertices."""
        s, last = self.state, self.model.num_layers - 1
        tensors = {"ids": np.asarray(s.part.global_ids, np.int64), "logits": np.ascontiguousarray(s.G[False][last])}
        if last:
            activation = getattr(torch.nn.functional, self.model.activation)
            tensors["embeddings"] = activation(torch.from_numpy(np.array(s.G[False][last - 1]))).numpy()
        self.node.to_driver(Message("outputs", {"rank": self.k}, tensors))

    def _gradient_counts(self) -> dict:
        """Gradients forwarded to the weight servers so far (one per key), and sends of a key beyond its first."""
        return {"gradients_sent": sum(self.gradients_sent.values()),
                "gradients_resent": sum(n - 1 for n in self.gradients_sent.values())}

    def _send_task_rows(self) -> None:
        rows = "".join(json.dumps(r) + "\n" for r in self.task_rows).encode()
        self.task_rows = []
        self.node.to_driver(Message("tasks", {"rank": self.k}, {"jsonl": np.frombuffer(rows, np.uint8)}))

    def _log_end(self) -> None:
        t = self.scheduler.tracker
        log.info("graph server %d end %s", self.k, json.dumps({
            "rank": self.k, "epochs": self.scheduler.reported - self.spec.first_epoch + 1, "tasks": self.stats["invoked"],
            "completed": self.stats["completed"], "result_blocks": self.stats["blocks"],
            "leases": self.stats["leases"],
            "peer_rows_fresh": self.stats["peer_rows_fresh"], "peer_rows_late": self.stats["peer_rows_late"],
            "relaunches": t.relaunches, "duplicates": t.refused, **self._gradient_counts(),
            "bytes_sent": self.usage.totals["bytes_sent"],
            "bytes_received": self.usage.totals["bytes_received"], "messages": dict(sorted(self.usage.ops.items())),
            "workers_replaced": getattr(self.platform, "replaced", 0),
            "peak_rss_mb": peak_rss_mb()}))

    def close(self) -> None:
        self._log_end()
        self.graph_thread.close()
        self.platform.close()
        if self.own_direct:
            self.direct.close()
        for s in [*self.peers.values(), *self.weight_servers]:
            s.close(0)
