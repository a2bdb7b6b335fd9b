"""The tensor worker: ``handler(event, context)``, the same code in AWS Lambda, in the local Lambda
emulator and in a graph server's own threads (``cpu``/``gpu`` backends).

It connects *out* (Lambdas accept no inbound connections) with DEALER sockets to its graph server and
the weight server of its layer, pulls the chunk's rows and the weights, computes, and pushes the
result to the graph server in one message, the weight gradient included. The graph server accepts
the first result of a task and only then forwards its gradient to the weight server, so result and
gradient take effect together, exactly once, however often the task was launched. Dropout masks are a
function of ``(seed, epoch, layer, vertex id)``, so a relaunch computes exactly the same result.

A copy of a task that the graph server no longer wants (another copy finished first, or the epoch
moved on) is told so in the reply to its first request (``cancel``) and stops at once; every reply,
errors included, carries the request id, so no copy waits out a timeout for an answer that came.

Event: ``{"token", "graph_server", "weight_servers", "dropout", "seed", "num_train", "device",
"task": {"kind": fwd|bwd|loss|eval, "epoch", "layer", "chunk", "server", "version", "train", "attempt"}}``.
Sockets are cached per process (and per thread), as a warm Lambda container keeps them.
"""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import torch
import zmq

from dorylus_py.kernels.dropout import dropout_keep_mask
from dorylus_py.kernels.gcn_ops import apply_vertex_backward, apply_vertex_forward, correct_counts, softmax_cross_entropy
from dorylus_py.protocol import Message, ProtocolError, decode, encode

REQUEST_TIMEOUT_MS = 30_000  # no single answer takes longer (a dead server: the task is relaunched)
SAFETY_MARGIN_MS = 500  # give up (and let the graph server relaunch) this close to the Lambda timeout

_local = threading.local()
_req_ids = itertools.count()


class TaskAborted(RuntimeError):
    """The task cannot finish (time running out, a server error); the graph server will relaunch it."""


class TaskCancelled(Exception):
    """The graph server does not want this copy (already done, or no longer running): stop."""


def handler(event: dict, context=None) -> dict:
    t0 = time.perf_counter()
    try:
        return _run(event, context) | {"seconds": time.perf_counter() - t0}
    except TaskCancelled as e:
        return {"status": "cancelled", "reason": str(e), "seconds": time.perf_counter() - t0}


def _run(event: dict, context) -> dict:
    task = event["task"]
    device = torch.device(event.get("device", "cpu"))
    token = event["token"]
    gs = _socket(event["graph_server"])
    _check_time(context)
    rows = _request(gs, Message("pull_rows", {"task": task}), token, context)
    start, stop, id_start = rows["start"], rows["stop"], rows["id_start"]
    t = {k: torch.from_numpy(np.array(v, copy=False)).to(device) for k, v in rows.tensors.items()}
    kind, layer = task["kind"], task["layer"]
    keep = None
    rate = float(event["dropout"]) if task.get("train", True) else 0.0
    if kind in ("fwd", "bwd") and rate > 0:
        width = t["P"].shape[1]
        keep = dropout_keep_mask(id_start, id_start + stop - start, width, rate, event["seed"], task["epoch"], layer).to(device)

    out: dict[str, np.ndarray] = {}
    fields: dict = {"task": task}
    if kind in ("fwd", "bwd"):
        ws = _socket(event["weight_servers"][layer % len(event["weight_servers"])])
        _check_time(context)
        got = _request(ws, Message("pull_weights", {"layer": layer, "version": task["version"], "hold": task.get("hold")}),
                       token, context)
        w = torch.from_numpy(np.array(got.tensors["W"])).to(device)
        fields["version"] = got["version"]
        if kind == "fwd":
            out["Z"] = apply_vertex_forward(t["P"], w, layer, keep, rate)
        else:
            dw, dg = apply_vertex_backward(t["P"], w, t["dZ"], layer, keep, rate)
            out["dW"] = dw
            if dg is not None:
                out["dG"] = dg
    elif kind == "loss":
        loss_sum, grad = softmax_cross_entropy(t["logits"], t["labels"], t["train"], event["num_train"])
        out["dG"] = grad
        fields["loss_sum"] = float(loss_sum)
    elif kind == "eval":
        fields["correct"] = correct_counts(t["logits"], t["labels"], list(t["masks"]))
    else:
        raise ProtocolError(f"unknown task kind {kind!r}")

    _check_time(context)
    ack = _request(gs, Message("push_result", fields, {k: _np(v) for k, v in out.items()}), token, context)
    return {"status": ack.op}


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().to("cpu", torch.float32).contiguous().numpy()


def _check_time(context) -> None:
    if context is not None and context.get_remaining_time_in_millis() < SAFETY_MARGIN_MS:
        raise TaskAborted("too little time left; leaving the task to a relaunch")


def _socket(address: str) -> zmq.Socket:
    cache = getattr(_local, "sockets", None)
    if cache is None:
        cache = _local.sockets = {}
    sock = cache.get(address)
    if sock is None:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        cache[address] = sock
    return sock


def _request(sock: zmq.Socket, msg: Message, token: str, context=None) -> Message:
    """Send and wait for the reply with the same request id (stale replies of an earlier,
    abandoned invocation on this warm socket are skipped), no longer than the Lambda has left."""
    req = f"{id(threading.current_thread())}-{next(_req_ids)}"
    msg.fields["req"] = req
    sock.send_multipart(encode(msg, token), copy=False)
    wait_ms = REQUEST_TIMEOUT_MS
    if context is not None:
        wait_ms = min(wait_ms, context.get_remaining_time_in_millis() - SAFETY_MARGIN_MS)
    deadline = time.monotonic() + max(0, wait_ms) / 1000
    while (left := deadline - time.monotonic()) > 0:
        if not sock.poll(int(left * 1000) + 1):
            break
        try:
            reply = decode(sock.recv_multipart(copy=False), token)
        except ProtocolError:
            continue  # not a reply we can trust: keep waiting for ours
        if reply.get("req") != req:
            continue
        if reply.op == "error":
            raise TaskAborted(f"{msg.op} refused: {reply.get('reason')}")
        if reply.op == "cancel":
            raise TaskCancelled(reply.get("reason") or "not wanted")
        return reply
    raise TaskAborted(f"{msg.op}: no reply within {max(0, wait_ms)} ms")
