"""One task's work in a tensor worker: the ``task`` message a graph server sent (the task, its rows) in,
the ``result`` message out; the same code in a Lambda's lease (``handler.py``) and in a graph server's
own threads (``cpu``/``gpu``, ``graph_servers/direct.py``).

The rows come with the task. The weights come from the weight servers holding the task's layer, by row
block (``weights/blocks.py``): the lead first (it fixes the version: the newest, or the one the task
names), then the others for that version at once; a lease keeps the last versions it pulled by name,
so a task that names a version it has (sync mode: every training task of an epoch) pulls nothing, while
one that holds a version for its backward (async) or asks for the newest always asks. The kernels are
``dorylus_py/kernels/tasks.py``'s. Dropout masks are a function of ``(seed, epoch, layer, vertex id)``
(attention dropout: of the edge id), so a relaunch computes exactly the same result.

A streamed task (``--stream-rows``) comes as parts, each a block of the chunk's rows: each part's
per-row outputs go back at once; what the whole chunk gives (weight gradients, the loss sum, correct
counts) is added up over the parts and goes with the last (``stream.py``).

Static rows (layer 0's input) are kept while the container is warm (``row_cache.py``), up to
``row_cache_mb``: the server leaves them out of a task whose lease says it holds them.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import zmq

from dorylus_py.kernels.tasks import TaskContext, run_task
from dorylus_py.models.architectures import architecture
from dorylus_py.protocol import Message, ProtocolError, Session, integer
from dorylus_py.protocol.quantize import narrowed
from dorylus_py.protocol.transport import Gate, dealer
from dorylus_py.timescale import scaled_ms
from dorylus_py.weights.blocks import join
from dorylus_py.worker.channel import Channel
from dorylus_py.worker.event import LeaseEvent, TaskRef
from dorylus_py.worker.row_cache import RowCache
from dorylus_py.worker.scratch import RowScratch
from dorylus_py.worker.stream import Totals

REQUEST_TIMEOUT_MS = 30_000  # no single answer takes longer (a dead server: the task is relaunched)
SAFETY_MARGIN_MS = 500  # give up (and let the graph server relaunch) this close to the Lambda timeout
KEPT_VERSIONS = 8  # layers' weight versions a lease keeps (sync mode: every layer's training and evaluation ones)

_local = threading.local()
_addresses: dict[zmq.Socket, str] = {}  # each cached socket's server address
_row_cache = RowCache()  # the static rows this container pulled, kept while it is warm


class TaskAborted(RuntimeError):
    """The task cannot finish (time running out, a server error); the graph server will relaunch it."""


@dataclass
class _Streamed:
    """A streamed copy's state between its parts: the sums so far, its weights and version, the static
    rows each part brought (for the cache, once the chunk's are whole)."""

    totals: Totals
    fields: dict
    weights: dict
    statics: list


class TaskRunner:
    """Runs the tasks of one lease (or of a graph server's own threads): ``event`` says the model and
    where the weight servers are; ``session`` signs the weight pulls."""

    def __init__(self, event: LeaseEvent, session: Session, gate: Gate, context=None):
        self.event, self.session, self.gate, self.context = event, session, gate, context
        self.device = torch.device(event.device)
        self.kernels = architecture(event.model).kernels()
        self.cache = _row_cache_of(event.row_cache_mb)
        # (layer, version, epoch of a training pull) -> the layer's weights on the device, the newest last
        self.versions: OrderedDict[tuple, dict[str, torch.Tensor]] = OrderedDict()
        self._parts: dict[tuple, _Streamed] = {}  # a streamed copy (key, attempt) -> its state between parts
        self.scratch = RowScratch()  # in-process rows' copies (copy_rows)

    def held(self) -> list[str]:
        """The static rows' tokens this container holds for our graph server (what the server may leave out)."""
        return self.cache.tokens(self.event.graph_server) if self.cache is not None else []

    def run(self, task: Message, copy_rows: bool = False) -> Message | None:
        """The ``result`` message of a ``task`` message (one part of it, if streamed: None for a part that
        is not the last of a task without per-row outputs); ``copy_rows``: the rows are the server's own
        arrays (in-process), so they are copied before use (into the thread's reused scratch, unless a row
        cache might keep them)."""
        ref = TaskRef.from_wire(task.get("task"))
        part, parts = _part(task)
        scratch = self.scratch if copy_rows and self.cache is None else None
        if scratch is not None:
            rows = scratch.copy(task.tensors)
        else:
            rows = {k: np.array(v) if copy_rows else v for k, v in task.tensors.items()}
        rows, fresh = self._static_rows(task, ref, rows, part)
        copy = (ref.key, ref.attempt)
        if part is None or part[0] == 0:
            fields, weights = self._weights(ref, task)
            if part is not None:
                self._parts[copy] = _Streamed(Totals(), fields, weights, [])
        elif copy in self._parts:
            fields, weights = self._parts[copy].fields, self._parts[copy].weights
        else:
            raise TaskAborted(f"part {list(part)} of a task whose first part this lease did not run")
        out, extra = run_task(self._context(ref, task, part[0] if part else 0), _on(rows, self.device), weights)
        if scratch is not None:
            out = scratch.owned(out)  # the result outlives the scratch's copies
        self._check_time()
        result = {k: _np(v) for k, v in out.items()}
        reply = {"task": ref.to_wire()} | fields
        if part is None:
            self._keep_static(ref, [fresh], None)
            return Message("result", reply | extra, result, wire=narrowed(result, self.event.wire_dtype))
        streamed = self._parts[copy]
        streamed.totals.add({k: v for k, v in out.items() if k.startswith("grad:")}, extra)
        streamed.statics.append(fresh)
        per_row = {k: v for k, v in result.items() if not k.startswith("grad:")}
        reply |= {"part": list(part)}
        if part[1] < parts:  # not the last block: its rows only (nothing, for a task without per-row outputs)
            return Message("result", reply, per_row, wire=narrowed(per_row, self.event.wire_dtype)) if per_row else None
        del self._parts[copy]
        self._keep_static(ref, streamed.statics, parts)
        grads, sums = streamed.totals.result()
        tensors = per_row | {k: _np(v) for k, v in grads.items()}
        return Message("result", reply | sums | {"last": True}, tensors, wire=narrowed(per_row, self.event.wire_dtype))

    def forget(self) -> None:
        """Drop the partial sums of streamed copies (the lease ends)."""
        self._parts.clear()

    # --- rows -------------------------------------------------------------------------------------

    def _static_rows(self, task: Message, ref: TaskRef, rows: dict, part) -> tuple[dict, dict]:
        """The task's rows with the static rows this container holds put back where the server left them
        out (named by token, ``static``), and those that came (name -> (token, rows)), for the cache."""
        static = task.get("static") or {}
        if not isinstance(static, dict) or not all(isinstance(t, str) for t in static.values()):
            raise ProtocolError(f"task: malformed static rows {static!r:.100}")
        held = self.cache.held(self._slot(ref)) if self.cache is not None else {}
        fresh = {}
        for name, token in static.items():
            if name in rows:
                fresh[name] = (token, rows[name])
            elif name in held and held[name][0] == token:
                whole = held[name][1]
                rows[name] = whole if part is None else whole[part[0] : part[1]]
            else:
                raise TaskAborted(f"task: {name!r} left out as held, but this container holds no rows {token!r:.40}")
        return rows, fresh

    def _keep_static(self, ref: TaskRef, fresh: list[dict], parts: int | None) -> None:
        """Keep the static rows that came: a whole chunk's (a streamed task's only if every part brought
        them, under one token)."""
        if self.cache is None or not fresh or not fresh[0]:
            return
        for name, (token, rows) in fresh[0].items():
            blocks = [f.get(name) for f in fresh]
            if all(b is not None and b[0] == token for b in blocks):
                self.cache.keep(self._slot(ref), name, token, rows if parts is None else np.concatenate([b[1] for b in blocks]))

    def _slot(self, ref: TaskRef) -> tuple:
        return (self.event.graph_server, ref.server, ref.key.chunk)

    def _context(self, ref: TaskRef, task: Message, offset: int) -> TaskContext:
        """What the kernels need to know of the task; ``offset``: the first row's place in the chunk."""
        ev, key = self.event, ref.key
        return TaskContext(model=self.kernels, kind=key.kind, layer=key.layer, epoch=key.epoch, seed=ev.seed,
                           rate=float(ev.dropout) if key.train else 0.0,
                           attn_rate=float(ev.attn_dropout) if key.train else 0.0,
                           negative_slope=float(ev.negative_slope),
                           id_start=integer(task.get("id_start"), "id_start") + offset,
                           edge_start=integer(task.get("edge_start"), "edge_start"),
                           ghost_edge_start=integer(task.get("ghost_edge_start"), "ghost_edge_start"),
                           num_train=ev.num_train)

    # --- weights ----------------------------------------------------------------------------------

    def _weights(self, ref: TaskRef, task: Message) -> tuple[dict, dict]:
        """The result's fields so far (the weights' version) and the layer's weights on the device."""
        servers = task.get("ws") or []
        if not isinstance(servers, list) or not all(type(w) is int and 0 <= w < len(self.event.weight_servers)
                                                    for w in servers):
            raise ProtocolError(f"task: bad weight servers {servers!r:.60}")
        if not servers:
            return {}, {}
        key = ref.key
        kept = (key.layer, ref.version, key.epoch if key.train else None)  # --predict-weights: by the task's epoch
        if ref.version is not None and ref.hold is None and kept in self.versions:
            self.versions.move_to_end(kept)
            return {"version": ref.version}, self.versions[kept]
        version, weights = self._pull(ref, [self.event.weight_servers[w] for w in servers])
        weights = {k: v.to(self.device) for k, v in weights.items()}
        self.versions[(key.layer, version, kept[2])] = weights
        while len(self.versions) > KEPT_VERSIONS:
            self.versions.popitem(last=False)
        return {"version": version}, weights

    def _pull(self, ref: TaskRef, addresses: list[str]) -> tuple[int, dict[str, torch.Tensor]]:
        """The layer's tensors (by base name: ``W``, ``att_src``, ...) at one version, from every weight
        server holding a block of them: the lead first (it fixes the version), then the others at once."""
        key = ref.key
        layer, epoch = key.layer, key.epoch if key.train else None  # a training task's may be predicted (--predict-weights)
        hold = list(ref.hold) if ref.hold is not None else None
        lead, *others = [_socket(a, self.gate) for a in addresses]

        def ask(version):
            return Message("pull_weights", {"layer": layer, "version": version, "hold": hold, "epoch": epoch})

        self._check_time()
        first = self._request_all([(lead, ask(ref.version))])[0]
        version = first["version"]
        replies = [first] + self._request_all([(s, ask(version)) for s in others])
        if any(r["version"] != version for r in replies):
            raise TaskAborted(f"weight servers answered layer {layer} at versions {[r['version'] for r in replies]}")
        blocks = {k: v for r in replies for k, v in r.tensors.items()}
        suffix = len(str(layer))
        return version, {name[:-suffix]: torch.from_numpy(np.array(w)) for name, w in join(blocks).items()}

    def _request_all(self, requests: list[tuple[zmq.Socket, Message]]) -> list[Message]:
        """Several requests on different sockets, sent together; their replies in the same order. A capped
        link sends them one after another, each once the link would have carried it."""
        channels = [Channel(sock, _addresses[sock], self.session, self.context) for sock, _ in requests]
        reqs = [ch.send(msg) for ch, (_, msg) in zip(channels, requests)]
        out = []
        for ch, req, (_, msg) in zip(channels, reqs, requests):
            wait_ms = self.wait_ms()
            reply = ch.reply(req, time.monotonic() + max(0, wait_ms) / 1000)
            if reply is None:
                raise TaskAborted(f"{msg.op}: no reply within {max(0, wait_ms)} ms")
            if reply.op == "error":
                raise TaskAborted(f"{msg.op} refused: {reply.get('reason')}")
            out.append(reply)
        return out

    # --- time -------------------------------------------------------------------------------------

    def wait_ms(self) -> int:
        """How long a request may wait for its answer: the request timeout, within the time the Lambda has."""
        wait_ms = scaled_ms(REQUEST_TIMEOUT_MS)
        if self.context is not None:
            wait_ms = min(wait_ms, self.context.get_remaining_time_in_millis() - scaled_ms(SAFETY_MARGIN_MS))
        return wait_ms

    def _check_time(self) -> None:
        if self.context is not None and self.context.get_remaining_time_in_millis() < scaled_ms(SAFETY_MARGIN_MS):
            raise TaskAborted("too little time left; leaving the task to a relaunch")


def _part(task: Message) -> tuple[tuple[int, int] | None, int]:
    """The block ``[lo, hi)`` of the chunk's rows a streamed task's part covers (None: the whole chunk),
    and the chunk's rows (the last part ends there)."""
    value = task.get("part")
    if value is None:
        return None, 0
    rows = integer(task.get("rows"), "rows", 1)
    if not isinstance(value, list) or len(value) != 2:
        raise ProtocolError(f"part must be [first row, end row], got {value!r:.100}")
    lo = integer(value[0], "part start", 0, rows)
    return (lo, integer(value[1], "part end", lo + 1, rows + 1)), rows


def _on(tensors: dict, device) -> dict[str, torch.Tensor]:
    """The task's rows on ``device``: on a GPU through page-locked memory, so their copies are queued on
    the task's stream without waiting for each (the first op on them waits, in stream order)."""
    rows = {k: torch.from_numpy(np.array(v, copy=False)) for k, v in tensors.items()}
    if device.type == "cuda":
        rows = {k: t.pin_memory() for k, t in rows.items()}
    return {k: t.to(device, non_blocking=True) for k, t in rows.items()}


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().to("cpu", torch.float32).contiguous().numpy()


def _row_cache_of(mb: int) -> RowCache | None:
    """This container's cache, sized as the event asks (``row_cache_mb``); None when that is 0."""
    _row_cache.resize(mb << 20)
    return _row_cache if mb else None


def _socket(address: str, gate: Gate) -> zmq.Socket:
    """A DEALER to ``address``, one per thread and gate, kept while the container is warm."""
    cache = getattr(_local, "sockets", None)
    if cache is None:
        cache = _local.sockets = {}
    sock = cache.get((address, gate))
    if sock is None:
        sock = cache[(address, gate)] = dealer(zmq.Context.instance(), address, gate)
        _addresses[sock] = address  # what its requests are signed for
    return sock
