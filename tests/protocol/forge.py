"""Frames a key holder could make by hand: any header and data, correctly signed (for tests and fuzzing)."""

from __future__ import annotations

import time

from dorylus_py.protocol import Session
from dorylus_py.protocol.session import _FIXED, MAGIC


def signed(session: Session, header: bytes, *data: bytes, to: str | bytes) -> list:
    """Frames carrying ``header`` and ``data`` as they are (hostile or not), with a valid MAC for ``to``."""
    fixed = _FIXED.pack(MAGIC, session.id, next(session._seq), time.time_ns() // 1000)
    return [fixed + session._mac(fixed, to, header, list(data)), header, *data]
