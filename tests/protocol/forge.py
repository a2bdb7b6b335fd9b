"""Frames a key holder could make by hand: any header and data, correctly signed (for tests and fuzzing)."""

from __future__ import annotations

import time

import msgspec

from dorylus_py.protocol import Session
from dorylus_py.protocol.session import _FIXED, MAGIC


def signed(session: Session, header: bytes, *data: bytes, to: str | bytes) -> list:
    """Frames carrying ``header`` and ``data`` as they are (hostile or not), with a valid MAC for ``to``."""
    fixed = _FIXED.pack(MAGIC, session.id, next(session._seq), time.time_ns() // 1000)
    return [fixed + session._mac(fixed, to, header, list(data)), header, *data]


def header(op, tensors=(), **fields) -> bytes:
    """A header frame as a key holder could write it, whatever its values (``tensors``: lists of name,
    dtype, shape and wire form, or anything else)."""
    return packed([op, list(tensors), fields])


def packed(value) -> bytes:
    """Any value as MessagePack (NaN included), as a header frame would hold it; an integer beyond what
    MessagePack can hold is sent as its nearest bound (2**64 - 1 or -2**63), as out of range as it was."""
    return msgspec.msgpack.encode(_clamped(value))


def _clamped(value):
    if type(value) is int:
        return min(max(value, -(2**63)), 2**64 - 1)
    if isinstance(value, (list, tuple)):
        return [_clamped(v) for v in value]
    if isinstance(value, dict):
        return {_clamped(k): _clamped(v) for k, v in value.items()}
    return value
