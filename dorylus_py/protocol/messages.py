"""What travels: a :class:`Message` (an op, fields of JSON's kinds of values, named tensors), the ops there
are, the dtypes a tensor may have, and the errors a bad message raises. How a message becomes signed
ZeroMQ frames and back is ``session.py``: one MessagePack header frame (``header.py``), then one raw
frame per tensor, without copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dorylus_py.errors import DorylusError
from dorylus_py.wire_forms import wire_bytes

DTYPES = {
    "float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32, "uint8": np.uint8, "bool": np.bool_,
}

# Every op a process may receive. Unknown ops are rejected before any field is read.
OPS = frozenset(
    {
        # tensor worker <-> graph server (a lease: worker/handler.py)
        "lease", "task", "result", "leave", "release",
        # tensor worker -> weight server (pull_state: the driver, for checkpoints)
        "pull_weights", "push_grad", "pull_state",
        # graph server <-> graph server
        "ghosts", "progress",
        # driver <-> servers
        "hello", "start", "switch", "release", "recorded", "epoch_stats", "tasks", "stop", "ping", "heartbeat", "outputs",
        # decentralised worker <-> worker (dorylus_py/decentral; also ping and stop)
        "steal", "mix", "snapshot", "report", "dead", "row", "average",
        # replies
        "batches", "params", "state", "ok", "weights", "duplicate", "refused", "error",
    }
)  # fmt: skip


class ProtocolError(DorylusError):
    """A message that is malformed, unauthenticated or inconsistent; it is rejected, never used."""


class AuthError(ProtocolError):
    """A message not provably from a key holder, or one seen before: dropped unanswered (the sender
    cannot be trusted with even an error)."""


class StaleMessage(AuthError):
    """A signed message older than the session receiving it: a replay, or (expected, and not worth a
    warning) a server's hello that waited in its queue while no driver was listening."""


@dataclass
class Message:
    op: str
    fields: dict = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    sender: bytes = b""  # the verified sender's session id (set by Session.decode); a reply goes to it
    size: int = 0  # bytes it came in (header and tensors; set by Session.decode): what keeping it costs
    wire: dict[str, str] = field(default_factory=dict)  # float32 row blocks sent narrower (``quantize.py``), by
    # name: the sender's choice; on a received message, how they came (they are float32 again)

    def __getitem__(self, key):
        return self.fields[key]

    def get(self, key, default=None):
        return self.fields.get(key, default)

    def tensor_bytes(self) -> int:
        """Bytes its tensors take on the wire (narrower forms as sent)."""
        return sum(wire_bytes(*t.shape, self.wire[name]) if name in self.wire else np.asarray(t).nbytes
                   for name, t in self.tensors.items())


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


MAX_INT = 2**53  # integers beyond this are not exact in a float64 (nor in every JSON reader)


def integer(value, what: str, low: int = 0, high: int = MAX_INT) -> int:
    """A peer's count, index, epoch or version: an int in [low, high) (bools and floats are not), or the
    protocol's rejection naming ``what``. The one check every receiver uses for such fields."""
    if type(value) is not int or not low <= value < high:
        raise ProtocolError(f"{what} must be an integer in [{low}, {high}), got {str(value)[:40]!r}")
    return value
