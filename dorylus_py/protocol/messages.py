"""The wire format: one JSON header frame, then one raw frame per tensor, sent and received without copies.

Header: ``{"op", "token", "tensors": [{"name", "dtype", "shape"}], ...fields}``. A decoder checks, in
order: frame count, header size and JSON, the job token (``hmac.compare_digest``), a known op, each
tensor's dtype against an allow-list and its byte length against its shape; only then are the raw
frames viewed as arrays (``np.frombuffer``, no copy). Anything wrong raises :class:`ProtocolError`,
which a server answers with an ``error`` reply before going on with the next message.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass, field

import numpy as np

from dorylus_py.errors import DorylusError

MAX_HEADER_BYTES = 64 * 1024
DTYPES = {
    "float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32, "uint8": np.uint8, "bool": np.bool_,
}

# Every op a process may receive. Unknown ops are rejected before any field is read.
OPS = frozenset(
    {
        # tensor worker -> graph server
        "pull_rows", "push_result",
        # tensor worker -> weight server (pull_state: the driver, for checkpoints)
        "pull_weights", "push_grad", "pull_state",
        # graph server <-> graph server
        "ghosts", "progress",
        # driver <-> servers
        "hello", "start", "switch", "epoch_stats", "tasks", "stop", "ping", "heartbeat",
        # decentralised worker <-> worker (dorylus_py/decentral; also ping and stop)
        "steal", "mix", "snapshot", "report", "dead", "row", "average",
        # replies
        "batches", "params", "state", "ok", "rows", "weights", "duplicate", "cancel", "error",
    }
)  # fmt: skip


class ProtocolError(DorylusError):
    """A message that is malformed, unauthenticated or inconsistent; it is rejected, never used."""


@dataclass
class Message:
    op: str
    fields: dict = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    def __getitem__(self, key):
        return self.fields[key]

    def get(self, key, default=None):
        return self.fields.get(key, default)


def encode(msg: Message, token: str) -> list:
    """Frames for ``msg``: the header, then each tensor's buffer (contiguous arrays are not copied)."""
    specs, frames = [], []
    for name, arr in msg.tensors.items():
        arr = np.require(arr, requirements="C")  # unlike ascontiguousarray, keeps 0-d arrays 0-d
        dtype = arr.dtype.name
        if dtype not in DTYPES:
            raise ProtocolError(f"tensor {name!r}: dtype {dtype} cannot be sent")
        specs.append({"name": name, "dtype": dtype, "shape": list(arr.shape)})
        frames.append(memoryview(arr).cast("B") if arr.size else b"")
    header = {"op": msg.op, "token": token, "tensors": specs, **msg.fields}
    return [json.dumps(header, separators=(",", ":")).encode(), *frames]


def decode(frames: list, token: str) -> Message:
    """Parse and check ``frames`` (bytes or zmq Frames); raise :class:`ProtocolError` on any problem."""
    if not frames:
        raise ProtocolError("empty message")
    raw = _bytes(frames[0])
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ProtocolError("header is not valid JSON") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    if not hmac.compare_digest(str(header.get("token", "")).encode(), token.encode()):
        raise ProtocolError("wrong or missing job token")
    op = header.get("op")
    if op not in OPS:
        raise ProtocolError(f"unknown op {op!r}")
    specs = header.get("tensors", [])
    if not isinstance(specs, list):
        raise ProtocolError("'tensors' must be a list")
    if len(frames) != 1 + len(specs):
        raise ProtocolError(f"op {op}: header names {len(specs)} tensors but {len(frames) - 1} data frames came")
    tensors = {}
    for spec, frame in zip(specs, frames[1:]):
        name, dtype, shape = _spec(spec)
        buf = _buffer(frame)
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dtype]).itemsize
        if len(buf) != expected:
            raise ProtocolError(f"tensor {name!r}: {len(buf)} bytes, but shape {shape} of {dtype} needs {expected}")
        tensors[name] = np.frombuffer(buf, dtype=DTYPES[dtype]).reshape(shape)
    fields = {k: v for k, v in header.items() if k not in ("op", "token", "tensors")}
    return Message(op, fields, tensors)


def require(msg: Message, *names: str, shapes: dict | None = None) -> None:
    """Check that ``msg`` has the fields or tensors ``names`` and, optionally, tensor shapes."""
    for name in names:
        if name not in msg.fields and name not in msg.tensors:
            raise ProtocolError(f"op {msg.op}: missing {name!r}")
    for name, shape in (shapes or {}).items():
        got = msg.tensors.get(name)
        if got is None:
            raise ProtocolError(f"op {msg.op}: missing tensor {name!r}")
        if len(got.shape) != len(shape) or any(s is not None and s != g for s, g in zip(shape, got.shape)):
            raise ProtocolError(f"op {msg.op}: tensor {name!r} has shape {list(got.shape)}, expected {list(shape)}")


def _spec(spec) -> tuple[str, str, list[int]]:
    if not isinstance(spec, dict):
        raise ProtocolError("tensor spec is not an object")
    name, dtype, shape = spec.get("name"), spec.get("dtype"), spec.get("shape")
    if not isinstance(name, str):
        raise ProtocolError("tensor spec without a name")
    if dtype not in DTYPES:
        raise ProtocolError(f"tensor {name!r}: dtype {dtype!r} not allowed")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape) or len(shape) > 4:
        raise ProtocolError(f"tensor {name!r}: bad shape {shape!r}")
    return name, dtype, shape


def _bytes(frame) -> bytes:
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)


def _buffer(frame) -> memoryview:
    return memoryview(frame.buffer if hasattr(frame, "buffer") else frame).cast("B")
