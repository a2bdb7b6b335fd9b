"""What a graph server sends and accepts: lease events for tensor workers, and checks on what comes in.

Every field a peer or a tensor worker sends is checked here, against the job, before the scheduler or
the arrays see it; anything wrong raises :class:`~dorylus_py.protocol.ProtocolError`, which the
server's receive loop answers with an ``error`` reply (carrying the request id) and survives.
"""

from __future__ import annotations

import numpy as np

from dorylus_py.pipeline.events import TaskKey
from dorylus_py.protocol import Message, ProtocolError, integer, require
from dorylus_py.protocol.transport import Curve, Gate
from dorylus_py.serving.job import JobSpec
from dorylus_py.worker.event import MAX_LEASE_ID, LeaseEvent, TaskRef
from graph_servers.received import ALL_CHUNKS

MAX_HELD = 64  # static-row tokens a worker may name at once (those of the chunks it holds for this server)
MAX_TOKEN = 64  # characters of one token (ours are 32 hex digits)
PHASES = ("fwd", "efwd", "bwd", "ebwd")  # what peers send: Z rows (training, evaluation), dZ and score-gradient parts


def lease_event(spec: JobSpec, rank: int, address: str, gate: Gate, job: bytes, lease: str, idle_ms: int,
                device: str = "cpu") -> LeaseEvent:
    """The event a tensor worker is invoked with for ``lease``; ``job``: the job's nonce, which its
    messages are bound to; ``idle_ms``: how long it waits for a task before it leaves. No secret: the
    worker has the job key from its own environment; the CURVE key here is the public one, and the nonce
    is no secret either."""
    cfg = spec.config
    return LeaseEvent(
        job=job.hex(), curve_public_key=gate.server_public.decode() if isinstance(gate, Curve) else None,
        graph_server=address, server=rank, lease=lease, weight_servers=tuple(spec.weight_servers), model=cfg.model,
        dropout=cfg.dropout, attn_dropout=cfg.attention_dropout(), negative_slope=cfg.negative_slope, seed=cfg.seed,
        num_train=spec.num_train, row_cache_mb=cfg.resolved_row_cache_mb() if cfg.backend in ("local", "lambda") else 0,
        idle_ms=idle_ms, device=device, wire_dtype=cfg.wire_dtype)


def task_of(task, layers: int, chunks: int, kinds: frozenset[str]) -> tuple[TaskKey, int]:
    """The key and attempt number of a task a worker names (``kinds``: the model's task kinds)."""
    ref = TaskRef.from_wire(task)
    key = ref.key
    if key.kind not in kinds:
        raise ProtocolError(f"malformed task {task!r:.200}")
    integer(key.epoch, "task epoch", 1)
    integer(key.layer, "task layer", 0, layers)
    integer(key.chunk, "task chunk", 0, chunks)
    return key, integer(ref.attempt, "task attempt", 1)


def lease_of(msg: Message) -> str:
    """The lease id a worker's message names."""
    value = msg.get("lease")
    if not isinstance(value, str) or not 0 < len(value) <= MAX_LEASE_ID:
        raise ProtocolError(f"{msg.op}: lease must be a string of 1 to {MAX_LEASE_ID} characters")
    return value


def part_of(value, rows: int) -> tuple[int, int] | None:
    """The rows ``[lo, hi)`` of a chunk of ``rows`` rows that a streamed task's result names (its
    optional ``part``), or None when it names none."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise ProtocolError(f"part must be [first row, end row], got {value!r:.100}")
    lo = integer(value[0], "part start", 0, rows)
    return lo, integer(value[1], "part end", lo + 1, rows + 1)


def held_tokens(value) -> frozenset[str]:
    """The static-row tokens a worker says it holds (a lease's or a result's optional ``have``). Only a
    match with the server's own token counts, so a wrong one costs the worker its rows, never the server
    its state."""
    if value is None:
        return frozenset()
    if (not isinstance(value, list) or len(value) > MAX_HELD
            or not all(isinstance(t, str) and 0 < len(t) <= MAX_TOKEN for t in value)):
        raise ProtocolError(f"have must be a list of at most {MAX_HELD} tokens of 1 to {MAX_TOKEN} characters")
    return frozenset(value)


def ghost_placement(positions: np.ndarray) -> tuple[dict, dict]:
    """The fields and tensors that tell a peer where a ``ghosts`` message's rows go: a run of consecutive
    positions (a chunk's forward rows, a sync sum) as its first only; others as the list (int32: 1-5 % of
    an int8 wire's bytes, 0.5-1.5 % of float32's)."""
    if len(positions) and positions[-1] - positions[0] == len(positions) - 1 and np.all(np.diff(positions) == 1):
        return {"first": int(positions[0])}, {}
    return {}, {"positions": positions}


def ghost_positions(msg: Message) -> np.ndarray:
    """Where a ``ghosts`` message's rows go (:func:`ghost_placement`'s two forms; ranges checked later)."""
    if "positions" in msg.tensors:
        return msg.tensors["positions"]
    first, rows = integer(msg.get("first"), "first", 0, 2**31), msg.tensors.get("rows")
    if rows is None or rows.ndim != 2:
        raise ProtocolError("ghosts: rows must be a 2-D block")
    return np.arange(first, first + len(rows), dtype=np.int64)


def peer_rows(msg: Message, layers: int) -> tuple[str, int, int, int, int, int]:
    """``(phase, src, epoch, layer, src_chunk, min_epoch)`` of a ``ghosts`` message from a peer."""
    require(msg, "phase", "epoch", "layer", "src", "chunk", "rows")
    phase = msg["phase"]
    if phase not in PHASES:
        raise ProtocolError(f"unknown ghost phase {phase!r}")
    return (phase, integer(msg["src"], "src"), integer(msg["epoch"], "epoch", 1), integer(msg["layer"], "layer", 0, layers),
            integer(msg["chunk"], "chunk", ALL_CHUNKS), integer(msg.get("min_epoch", 1), "min_epoch", 1))
