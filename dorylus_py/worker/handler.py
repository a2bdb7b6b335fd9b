"""The tensor worker: ``handler(event, context)``, the same code in AWS Lambda, in the local Lambda
emulator and in a graph server's own threads (``cpu``/``gpu`` backends).

It connects *out* (Lambdas accept no inbound connections) with DEALER sockets to its graph server and
the weight servers holding its layer's blocks, pulls the chunk's rows and the weights, computes
(``dorylus_py/kernels/tasks.py``: any model, any task kind), and pushes the result to the graph server
in one message, the weight gradients included. The graph server accepts
the first result of a task and only then forwards its gradient to the weight server, so result and
gradient take effect together, exactly once, however often the task was launched. Dropout masks are a
function of ``(seed, epoch, layer, vertex id)`` (attention dropout: of the edge id), so a relaunch
computes exactly the same result.

A copy of a task that the graph server no longer wants (another copy finished first, or the epoch
moved on) is told so in the reply to its first request (``cancel``) and stops at once; every reply,
errors included, carries the request id, so no copy waits out a timeout for an answer that came.

Every message is signed with the job key, which the worker reads at its cold start from its own
environment (``DORYLUS_KEY``; on AWS the Secrets Manager secret named by ``DORYLUS_KEY_SECRET``,
through the function's role), or is handed directly (``session``) when it runs inside a graph server.
The event carries no secret.

The event is a :class:`~dorylus_py.worker.event.TaskEvent` (or its JSON form, checked field by field).
The weights of a layer are spread over several weight servers by row block: the task asks the lead
for its version (the newest, or the one it names) and every other server for that same version.
Sockets are cached per process (and per thread), as a warm Lambda container keeps them, and so are the
input-feature rows it pulled, up to ``row_cache_mb`` (``row_cache.py``; 0 in a graph server's threads,
which have the rows already): its next pull of the same chunk names them and gets them no more. In the
local emulator, ``context.bandwidth_mbps`` paces every message both ways (``link.py``). Run inside its
graph server (``cpu``/``gpu``), it is handed ``direct`` (``graph_servers/direct.py``): the requests
to that server go on its in-process queue instead of a socket. With ``stream`` in the event
(``--stream-rows``) a row-wise task runs a block of rows at a time, its transfers overlapping its
compute (``stream.py``); its requests in flight go through a ``Channel`` (``channel.py``).
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import torch
import zmq

from dorylus_py.jobkey import load_job_key
from dorylus_py.kernels.tasks import TaskContext, run_task
from dorylus_py.models.architectures import architecture
from dorylus_py.protocol import Message, Session
from dorylus_py.protocol.quantize import narrowed
from dorylus_py.protocol.transport import Curve, Gate, Plain, dealer
from dorylus_py.timescale import scaled_ms
from dorylus_py.weights.blocks import join
from dorylus_py.worker.channel import Channel
from dorylus_py.worker.event import TaskEvent
from dorylus_py.worker.row_cache import RowCache
from dorylus_py.worker.stream import Totals, stream_spans

REQUEST_TIMEOUT_MS = 30_000  # no single answer takes longer (a dead server: the task is relaunched)
SAFETY_MARGIN_MS = 500  # give up (and let the graph server relaunch) this close to the Lambda timeout

_local = threading.local()
_addresses: dict[zmq.Socket, str] = {}  # each cached socket's server address
_container: dict[str, Session] = {}  # this container's session, made at its cold start
_container_lock = threading.Lock()
_row_cache = RowCache()  # the static rows this container pulled, kept while it is warm


class TaskAborted(RuntimeError):
    """The task cannot finish (time running out, a server error); the graph server will relaunch it."""


class TaskCancelled(Exception):
    """The graph server does not want this copy (already done, or no longer running): stop."""


def handler(event: dict | TaskEvent, context=None, session: Session | None = None, direct=None) -> dict:
    """Run the task of ``event`` (a :class:`TaskEvent`, or its JSON form as a Lambda gets it); ``session``
    and ``direct`` are handed in by a graph server running it in its own threads."""
    t0 = time.perf_counter()
    ev = TaskEvent.from_dict(event)
    try:
        return _run(ev, context, (session or _container_session()).for_job(bytes.fromhex(ev.job)), direct) \
            | {"seconds": time.perf_counter() - t0}
    except TaskCancelled as e:
        return {"status": "cancelled", "reason": str(e), "seconds": time.perf_counter() - t0}


def _container_session() -> Session:
    with _container_lock:
        if "session" not in _container:
            _container["session"] = Session(load_job_key())
        return _container["session"]


def _run(event: TaskEvent, context, session: Session, direct) -> dict:
    task = event.task.to_wire()  # what every request names
    device = torch.device(event.device)
    gate = Curve(event.curve_public_key.encode(), None, *session.curve_client_keys()) if event.curve_public_key \
        else Plain(session.plain_password())
    _check_time(context)
    if direct is None and (spans := stream_spans(event.stream)):
        gs = _socket(event.graph_server, gate)
        return _run_streamed(event, task, spans, Channel(gs, _addresses[gs], session, context), gate, context, device)
    gs = None if direct is not None else _socket(event.graph_server, gate)

    def to_server(msg: Message) -> Message:
        return _request_direct(direct, msg, context) if direct is not None else _request(gs, msg, session, context)

    reply, tensors = _pull_rows(event, task, to_server)
    fields, weights = _weights(event, task, session, gate, context, device)
    out, extra = run_task(_context(event, reply), _on(tensors, device), weights)
    _check_time(context)
    results = {k: _np(v) for k, v in out.items()}
    ack = to_server(Message("push_result", fields | extra, results, wire=narrowed(results, event.wire_dtype)))
    return {"status": ack.op}


def _pull_rows(event: TaskEvent, task: dict, to_server) -> tuple[Message, dict]:
    """The chunk's rows: the reply, and its tensors with the static rows this container holds put back."""
    cache, slot, held = _held_rows(event, task)
    reply = to_server(Message("pull_rows", {"task": task} | _have(held)))
    tensors, fresh = _static_rows(reply, held, None)
    for name, (token, rows) in fresh.items() if cache is not None else ():
        cache.keep(slot, name, token, rows)
    return reply, tensors


def _run_streamed(event: TaskEvent, task: dict, spans: list, ch: Channel, gate, context, device) -> dict:
    """A row-wise task a block of rows at a time (``stream.py``): every block's pull is asked for at
    once; each block is computed as it comes in, and its rows of the result go back at once (staged by
    the graph server); the last message carries the sums (weight gradients, loss, counts) and commits."""
    cache, slot, held = _held_rows(event, task)
    pulls = [ch.send(Message("pull_rows", {"task": task, "block": list(span)} | _have(held))) for span in spans]
    fields, weights = _weights(event, task, ch.session, gate, context, device)
    run = os.urandom(8).hex()  # this run's blocks: a platform's retry of the invocation is another run
    fields |= {"streamed": True, "run": run}
    totals, fresh = Totals(), {}
    for span, req in zip(spans, pulls):
        reply = _reply(ch, req, "pull_rows", context)
        tensors, new = _static_rows(reply, held, span)
        for name, (token, rows) in new.items():
            fresh.setdefault((name, token), []).append(rows)
        out, extra = run_task(_context(event, reply, span[0]), _on(tensors, device), weights)
        rows_out = {k: _np(v) for k, v in out.items() if not k.startswith("grad:")}
        if rows_out:
            ch.send(Message("push_block", {"task": task, "block": list(span), "run": run}, rows_out,
                            wire=narrowed(rows_out, event.wire_dtype)), wait=False)
        totals.add({k: v for k, v in out.items() if k.startswith("grad:")}, extra)
        _check_time(context)
        ch.drain()
    for (name, token), parts in fresh.items() if cache is not None else ():
        if len(parts) == len(spans):  # every block came with its rows: the chunk's rows, whole
            cache.keep(slot, name, token, np.concatenate(parts))
    grads, sums = totals.result()
    final = Message("push_result", fields | sums, {k: _np(v) for k, v in grads.items()})
    return {"status": _reply(ch, ch.send(final), "push_result", context).op}


def _context(event: TaskEvent, rows: Message, offset: int = 0) -> TaskContext:
    """What the kernels need to know of the task; ``offset``: the first row's place in the chunk."""
    task, train = event.task.key, event.task.key.train
    return TaskContext(model=architecture(event.model).kernels(), kind=task.kind, layer=task.layer, epoch=task.epoch,
                       seed=event.seed, rate=float(event.dropout) if train else 0.0,
                       attn_rate=float(event.attn_dropout) if train else 0.0,
                       negative_slope=float(event.negative_slope), id_start=rows["id_start"] + offset,
                       edge_start=rows["edge_start"], ghost_edge_start=rows["ghost_edge_start"],
                       num_train=event.num_train)


def _on(tensors: dict, device) -> dict[str, torch.Tensor]:
    """The task's rows on ``device``: on a GPU through page-locked memory, so their copies are queued on
    the task's stream without waiting for each (the first op on them waits, in stream order)."""
    rows = {k: torch.from_numpy(np.array(v, copy=False)) for k, v in tensors.items()}
    if device.type == "cuda":
        rows = {k: t.pin_memory() for k, t in rows.items()}
    return {k: t.to(device, non_blocking=True) for k, t in rows.items()}


def _weights(event: TaskEvent, task: dict, session: Session, gate, context, device) -> tuple[dict, dict]:
    """The result's fields so far (the task, the weights' version) and the layer's weights on ``device``."""
    if not event.weight_servers:
        return {"task": task}, {}
    version, weights = _pull_weights(event, task, session, gate, context)
    return {"task": task, "version": version}, {k: v.to(device) for k, v in weights.items()}


def _held_rows(event: TaskEvent, task: dict) -> tuple[RowCache | None, tuple, dict]:
    """This container's row cache, the task's slot in it, and what it holds for that slot."""
    cache = _row_cache_of(event.row_cache_mb)
    slot = (event.graph_server, event.task.server, event.task.key.chunk)
    return cache, slot, cache.held(slot) if cache is not None else {}


def _have(held: dict) -> dict:
    return {"have": [token for token, _ in held.values()]} if held else {}


def _static_rows(reply: Message, held: dict, span: tuple[int, int] | None) -> tuple[dict, dict]:
    """A pull's tensors with the static rows this container holds put back where the graph server left
    them out (it names them by token, ``row_cache.py``; ``span``: the block of the chunk's rows pulled),
    and the static rows that came (name -> token, rows), for the cache."""
    tensors, static, fresh = dict(reply.tensors), reply.get("static") or {}, {}
    if not isinstance(static, dict) or not all(isinstance(t, str) for t in static.values()):
        raise TaskAborted(f"pull_rows: malformed static rows {static!r:.100}")
    for name, token in static.items():
        if name in tensors:
            fresh[name] = (token, tensors[name])
        elif name in held and held[name][0] == token:
            rows = held[name][1]
            tensors[name] = rows if span is None else rows[span[0] : span[1]]
        else:
            raise TaskAborted(f"pull_rows: {name!r} left out as held, but this container holds no rows {token!r:.40}")
    return tensors, fresh


def _row_cache_of(mb: int) -> RowCache | None:
    """This container's cache, sized as the event asks (``row_cache_mb``); None when that is 0."""
    _row_cache.resize(mb << 20)
    return _row_cache if mb else None


def _pull_weights(event: TaskEvent, task: dict, session: Session, gate: Gate, context) -> tuple[int, dict[str, torch.Tensor]]:
    """The layer's tensors (by base name: ``W``, ``att_src``, ...) at one version, from every weight
    server holding a block of them: the lead first (it fixes the version), then the others at once."""
    key = event.task.key
    layer, epoch = key.layer, key.epoch if key.train else None  # a training task's may be predicted (--predict-weights)
    lead, *others = [_socket(a, gate) for a in event.weight_servers]

    def ask(version):
        return Message("pull_weights", {"layer": layer, "version": version, "hold": task["hold"], "epoch": epoch})

    _check_time(context)
    first = _request(lead, ask(event.task.version), session, context)
    version = first["version"]
    replies = [first] + _request_all([(s, ask(version)) for s in others], session, context)
    if any(r["version"] != version for r in replies):
        raise TaskAborted(f"weight servers answered layer {layer} at versions {[r['version'] for r in replies]}")
    blocks = {k: v for r in replies for k, v in r.tensors.items()}
    suffix = len(str(layer))
    return version, {name[:-suffix]: torch.from_numpy(np.array(w)) for name, w in join(blocks).items()}


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().to("cpu", torch.float32).contiguous().numpy()


def _check_time(context) -> None:
    if context is not None and context.get_remaining_time_in_millis() < scaled_ms(SAFETY_MARGIN_MS):
        raise TaskAborted("too little time left; leaving the task to a relaunch")


def _socket(address: str, gate: Gate) -> zmq.Socket:
    cache = getattr(_local, "sockets", None)
    if cache is None:
        cache = _local.sockets = {}
    sock = cache.get((address, gate))
    if sock is None:
        sock = cache[(address, gate)] = dealer(zmq.Context.instance(), address, gate)
        _addresses[sock] = address  # what its requests are signed for
    return sock


def _request(sock: zmq.Socket, msg: Message, session: Session, context=None) -> Message:
    """Send and wait for the reply with the same request id, no longer than the Lambda has left."""
    return _request_all([(sock, msg)], session, context)[0]


def _request_all(requests: list[tuple[zmq.Socket, Message]], session: Session, context=None) -> list[Message]:
    """Several requests on different sockets, sent together; their replies in the same order. A capped
    link sends them one after another, each once the link would have carried it."""
    channels = [Channel(sock, _addresses[sock], session, context) for sock, _ in requests]
    reqs = [ch.send(msg) for ch, (_, msg) in zip(channels, requests)]
    return [_reply(ch, req, msg.op, context) for ch, req, (_, msg) in zip(channels, reqs, requests)]


def _reply(ch: Channel, req: str, op: str, context) -> Message:
    wait_ms = _wait_ms(context)
    return _checked(ch.reply(req, time.monotonic() + max(0, wait_ms) / 1000), op, wait_ms)


def _request_direct(direct, msg: Message, context) -> Message:
    """A request to the graph server this worker runs inside (``graph_servers/direct.py``)."""
    wait_ms = _wait_ms(context)
    return _checked(direct.request(msg, max(0, wait_ms) / 1000), msg.op, wait_ms)


def _wait_ms(context) -> int:
    wait_ms = scaled_ms(REQUEST_TIMEOUT_MS)
    if context is not None:
        wait_ms = min(wait_ms, context.get_remaining_time_in_millis() - scaled_ms(SAFETY_MARGIN_MS))
    return wait_ms


def _checked(reply: Message | None, op: str, wait_ms: int) -> Message:
    """The reply to ``op``, or the reason the task cannot go on: none came in ``wait_ms``, an error, a cancel."""
    if reply is None:
        raise TaskAborted(f"{op}: no reply within {max(0, wait_ms)} ms")
    if reply.op == "error":
        raise TaskAborted(f"{op} refused: {reply.get('reason')}")
    if reply.op == "cancel":
        raise TaskCancelled(reply.get("reason") or "not wanted")
    return reply
