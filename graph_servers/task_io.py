"""The graph server's side of a tensor task: what it pulls, what its result must look like, where it goes.

Inputs and outputs per task kind are listed in ``dorylus_py/kernels/tasks.py``. Every result is checked
against the model and the chunk (names, shapes, dtypes) before anything is written, so a wrong or
hostile worker cannot corrupt the server's arrays.

Static rows: layer 0's input ``P`` (the features) never changes in training and is the widest input
(pulled by three tasks a chunk and epoch: the training forward, the evaluation forward and backward).
A warm worker keeps it (``dorylus_py/worker/row_cache.py``); a task message names it by a token, and
leaves it out when its lease said it holds that token.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from dorylus_py.pipeline.events import TaskKey
from dorylus_py.protocol import ProtocolError, require
from dorylus_py.worker.stream import stream_spans
from graph_servers.graph_state import GraphState
from graph_servers.staging import MIN_CAP_BYTES

STATIC = "P"  # the name of the static rows in a layer-0 task's pull
STREAMED = ("fwd", "bwd", "fused", "loss", "eval")  # row-wise kinds: each row's outputs need only its own inputs


def static_tokens(s: GraphState, source: str) -> list[str]:
    """Per chunk, a name for its static rows that changes whenever the rows would: ``source`` names the
    partition's features (their checksum and dtype, the server's rank), then the chunk's bounds and
    the feature normalisation. 128 bits: no two different blocks share one by chance."""
    bounds = s.bounds.tolist()
    return [hashlib.sha256(json.dumps([source, a, b, s.feature_norm]).encode()).hexdigest()[:32]
            for a, b in zip(bounds[:-1], bounds[1:])]


def has_static(key: TaskKey) -> bool:
    return key.kind in ("fwd", "bwd") and key.layer == 0


def task_rows(s: GraphState, key: TaskKey, static_held: bool = False, span: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """What a task pulls: the chunk's rows of its inputs (per-edge arrays over the chunk's in-edges, in
    the state's numbering: the local block's, then the ghost block's, each run with its row pointers).
    ``static_held``: the worker holds the static rows, which are then neither read nor sent. With
    ``remat``, the layer buffers' rows as copies: rows go out without a copy and are signed when
    encoded, and an alias of them may be written by the next stage before a late copy's reply has left
    (without ``remat``, an epoch later). The features are no layer buffer: not copied."""
    rows = _task_rows(s, key, static_held, span)
    if not s.remat:
        return rows
    return {k: v if k == STATIC and has_static(key) else np.array(v) for k, v in rows.items()}


def _task_rows(s: GraphState, key: TaskKey, static_held: bool, span: tuple[int, int] | None) -> dict[str, np.ndarray]:
    """``span``: the block of the chunk's rows a streamed task pulls (row-wise kinds only)."""
    kind, train, _, layer, chunk = key
    a, b = s.chunk(chunk)
    if span is not None:
        a, b = a + span[0], a + span[1]
    if kind in ("fwd", "bwd"):
        out = {} if static_held and layer == 0 else {"P": s.input_rows(a, b) if layer == 0 else s.G[train][layer - 1][a:b]}
        if kind == "bwd":
            out["dZ"] = s.dZ[layer][a:b]
            if s.model.self_term:
                out["dOut"] = s.dG[layer][a:b]
            if s.attention:
                out |= {"dsrc": s.dsrc[layer][a:b], "ddst": s.ddst[layer][a:b]}
        return out
    if kind in ("edge_fwd", "edge_bwd"):
        (llo, lhi), (glo, ghi) = s.edge_runs(chunk)
        p, sg = s.part, s.SG[train][layer]
        lp, gp = np.asarray(p.local_indptr[a : b + 1], np.int64), np.asarray(p.ghost_indptr[a : b + 1], np.int64)
        sources = np.concatenate([sg[np.asarray(p.local_indices[lp[0] : lp[-1]])],
                                  sg[s.n + np.asarray(p.ghost_indices[gp[0] : gp[-1]], np.int64)]])
        out = {"src": np.ascontiguousarray(sources.T), "dst": s.SD[train][layer][a:b],
               "local_ptr": lp - lp[0], "ghost_ptr": gp - gp[0]}
        if kind == "edge_bwd":
            h = s.shapes[layer].heads
            out["dalpha"] = np.concatenate([s.dalpha[:h, llo:lhi], s.dalpha[:h, glo:ghi]], axis=1)
        return out
    logits = s.G[train][s.layers - 1][a:b]
    if kind == "fused":  # the fused last layer's G is its input's Gather, Â P̃
        return {"AP": logits, "labels": s.labels[a:b], "train": s.masks[0, a:b]}
    if kind == "loss":
        return {"logits": logits, "labels": s.labels[a:b], "train": s.masks[0, a:b]}
    return {"logits": logits, "labels": s.labels[a:b], "masks": s.masks[:, a:b]}


def streams(s: GraphState, key: TaskKey) -> bool:
    """Whether a task of ``key`` may be streamed (``--stream-rows``): a row-wise kind, and not GAT's
    (its vertex forward also returns the layer's bias row, which no block owns)."""
    return key.kind in STREAMED and not s.attention


def chunk_rows(s: GraphState, chunk: int) -> int:
    a, b = s.chunk(chunk)
    return b - a


def task_parts(s: GraphState, key: TaskKey, block: int) -> list[tuple[int, int] | None]:
    """The parts a task of ``key`` is sent in: blocks of ``block`` rows of its chunk where it streams
    (``--stream-rows``), else the whole chunk (``[None]``)."""
    return (stream_spans(chunk_rows(s, key.chunk), block) if streams(s, key) else []) or [None]


def staging_cap(s: GraphState, copies: int = 4) -> int:
    """Bytes a server may stage for streamed tasks: ``copies`` partial results of every chunk at the
    widest per-row output (two layer-widths: GraphSAGE's forward sends ``Z`` and ``S``), at least 512 MB."""
    widest = max(max(sh.z_width, sh.out_width, sh.d_in) for sh in s.shapes)
    rows = int(np.diff(s.bounds).max(initial=0))
    return max(MIN_CAP_BYTES, copies * s.chunks * rows * (1 + 2 * widest * 4))


def per_row_widths(s: GraphState, key: TaskKey) -> dict[str, int]:
    """Name -> width of each per-row output of a streamed task (what its ``push_block`` messages carry)."""
    return {k: shape[1] for k, shape in expected_tensors(s, key).items() if not k.startswith("grad:")}


def expected_tensors(s: GraphState, key: TaskKey) -> dict[str, tuple]:
    """Name -> shape of every tensor the result of ``key`` must carry (a row count of 1 for ``S``
    stands for the rows of a GAT bias, broadcast to the chunk)."""
    kind, _, _, layer, chunk = key
    a, b = s.chunk(chunk)
    rows, shape = b - a, s.shapes[layer]
    if kind == "fwd":
        out = {"Z": (rows, shape.z_width)}
        if s.model.self_term:
            out["S"] = (1 if s.attention else rows, shape.out_width)
        if s.attention:
            out |= {"src": (rows, shape.heads), "dst": (rows, shape.heads)}
        return out
    if kind in ("bwd", "fused"):
        out = {f"grad:{t.name}": t.shape for t in s.model.layer_tensors(layer)}
        if kind == "fused":
            return out | {"dG": (rows, shape.d_in)}
        return out | ({"dG": (rows, s.shapes[layer - 1].out_width)} if layer > 0 else {})
    if kind in ("edge_fwd", "edge_bwd"):
        edges = sum(hi - lo for lo, hi in s.edge_runs(chunk))
        if kind == "edge_fwd":
            return {"alpha": (shape.heads, edges)}
        return {"ds": (shape.heads, edges), "ddst": (rows, shape.heads)}
    if kind == "loss":
        return {"dG": (rows, s.shapes[-1].out_width)}
    return {}


def check_result(s: GraphState, key: TaskKey, msg) -> None:
    kind = key.kind
    expected = expected_tensors(s, key)
    require(msg, shapes=expected)
    extra = set(msg.tensors) - set(expected)
    if extra:
        raise ProtocolError(f"{kind} result: unexpected tensors {sorted(extra)[:4]}")
    if any(msg.tensors[name].dtype != np.float32 for name in expected):
        raise ProtocolError(f"{kind} result: tensors must be float32")
    if kind in ("fwd", "bwd", "fused"):
        require(msg, "version")
        v = msg["version"]
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**53:
            raise ProtocolError(f"{kind} result: 'version' must be a non-negative integer")
    if kind in ("loss", "fused"):
        require(msg, "loss_sum")
        if not isinstance(msg["loss_sum"], (int, float)) or not np.isfinite(msg["loss_sum"]):
            raise ProtocolError(f"{kind} result: 'loss_sum' must be a finite number")
    elif kind == "eval":
        require(msg, "correct")
        c = msg["correct"]
        if not (isinstance(c, list) and len(c) == 3 and all(isinstance(v, int) and 0 <= v <= s.n for v in c)):
            raise ProtocolError("eval result: 'correct' must be three counts")


def apply_result(s: GraphState, key: TaskKey, tensors: dict[str, np.ndarray]) -> None:
    """Write a checked, accepted result into the arrays (gradients go to the weight servers instead)."""
    kind, train, _, layer, chunk = key
    a, b = s.chunk(chunk)
    rows = []  # (buffer, result): the chunk's rows of each
    if kind == "fwd":
        rows += [(s.ZG[train][layer], "Z")] + ([(s.S[train][layer], "S")] if s.S is not None else [])
        if s.attention:
            rows += [(s.SG[train][layer], "src"), (s.SD[train][layer], "dst")]
    elif kind == "edge_fwd":
        _put_edges(s, s.alpha[train][layer], s.edge_runs(chunk), tensors["alpha"])
    elif kind == "edge_bwd":
        _put_edges(s, s.ds[layer], s.edge_runs(chunk), tensors["ds"])
        rows.append((s.ddst[layer], "ddst"))
    elif kind == "bwd" and layer > 0:
        rows.append((s.dG[layer - 1], "dG"))
    elif kind in ("loss", "fused"):  # fused: dL/d(Â P̃), which Gather backward turns into dP̃
        rows.append((s.dG[s.layers - 1], "dG"))
    for buffer, name in rows:
        buffer[a:b] = tensors[name]
        s.dev.upload(buffer, slice(a, b))  # to the graph stages' twin (device_rows.py)


def _put_edges(s: GraphState, target: np.ndarray, runs, values: np.ndarray) -> None:
    """Write a chunk's per-edge ``(H, E)`` result (its local block's edges, then its ghost block's)."""
    (llo, lhi), (glo, ghi) = runs
    target[:, llo:lhi] = values[:, : lhi - llo]
    target[:, glo:ghi] = values[:, lhi - llo :]
    for lo, hi in runs:
        s.dev.upload(target, (slice(None), slice(lo, hi)))
