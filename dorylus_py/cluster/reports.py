"""What graph servers report to the driver, checked before the driver uses it.

A graph server is trusted with the job key, but a compromised or buggy one must not crash the driver
or make it write unbounded records: every field of ``epoch_stats``, ``switch`` and ``tasks`` is checked
here and anything wrong raises :class:`~dorylus_py.protocol.ProtocolError`, which the driver counts and
drops. Task rows are parsed line by line within the JSON limits (``protocol/bounded_json.py``), and a
``tasks`` message is capped in bytes before any of it is parsed.
"""

from __future__ import annotations

import math

import numpy as np

from dorylus_py.protocol import Message, ProtocolError, integer
from dorylus_py.protocol.bounded_json import MAX_OBJECT_BYTES, parse_object

MAX_TASKS_BYTES = 256 * 2**20  # one epoch's task rows of one server: ~300 bytes a row, ~900 k rows
def _finite(value, name: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ProtocolError(f"{name} must be a finite number, got {str(value)[:40]!r}")
    return float(value)


def _counts(value, name: str) -> list[int]:
    if not (isinstance(value, list) and len(value) == 3):
        raise ProtocolError(f"{name} must be three counts")
    return [integer(v, name) for v in value]


def epoch_stats(msg: Message, rank: int, epochs: int) -> dict:
    """The fields of a graph server's ``epoch_stats`` for one epoch, checked: sent by ``rank``, for an
    epoch in ``[1, epochs]``, counts that are counts and sums that are finite."""
    if msg.get("rank") != rank:
        raise ProtocolError(f"epoch_stats: rank {str(msg.get('rank'))[:20]!r} from graph server {rank}")
    out = {"rank": rank, "epoch": integer(msg.get("epoch"), "epoch", 1, epochs + 1),
           "loss_sum": _finite(msg.get("loss_sum"), "loss_sum"), "correct": _counts(msg.get("correct"), "correct"),
           "counts": _counts(msg.get("counts"), "counts"), "epoch_s": _finite(msg.get("epoch_s"), "epoch_s"),
           **{name: integer(msg.get(name), name) for name in ("relaunches", "duplicates", "gradients_sent",
                                                              "gradients_resent", "refused_messages")}}
    usage = msg.get("usage", {})
    if not isinstance(usage, dict) or len(usage) > 16:
        raise ProtocolError("epoch_stats: usage must be an object of at most 16 numbers")
    out["usage"] = {str(k)[:32]: _finite(v, f"usage {str(k)[:32]}") for k, v in usage.items()}
    return out


def weight_server_counts(msg: Message) -> dict:
    """A weight server's answer to the driver's closing ``ping``: its updates, the duplicate and refused
    gradients it dropped and the messages it refused, each a count."""
    return {name: integer(msg.get(name), f"a weight server's {name}")
            for name in ("updates", "duplicates", "refused", "refused_messages")}


def frozen_at(msg: Message, epochs: int) -> int:
    """The epoch a graph server froze at, in a ``switch`` report."""
    return integer(msg.get("frozen_at"), "frozen_at", 0, epochs + 2)


def task_rows(msg: Message) -> list[dict]:
    """The task rows of a ``tasks`` message: a ``jsonl`` byte tensor of at most ``MAX_TASKS_BYTES``, each
    line a JSON object within the JSON limits."""
    blob = msg.tensors.get("jsonl")
    if blob is None or blob.dtype != np.uint8 or blob.ndim != 1:
        raise ProtocolError("tasks: a jsonl tensor of bytes is needed")
    if blob.nbytes > MAX_TASKS_BYTES:
        raise ProtocolError(f"tasks: {blob.nbytes} bytes of task rows exceed {MAX_TASKS_BYTES}")
    rows = []
    for line in bytes(blob).splitlines():
        if len(line) > MAX_OBJECT_BYTES:
            raise ProtocolError(f"tasks: a row of {len(line)} bytes exceeds {MAX_OBJECT_BYTES}")
        if line.strip():
            rows.append(parse_object(line, "tasks: a row"))
    return rows
