"""JSON headers parsed with limits, so that no header can exhaust the stack, the CPU or a later ``int()``.

Checked here: size (before anything), nesting depth (a vectorised pre-scan, before ``json.loads``
recurses), numbers (finite, integers of at most 2**53 in magnitude, so ``int(x)`` downstream cannot
overflow or allocate), and that the result is an object. ``NaN``/``Infinity`` are refused.
"""

from __future__ import annotations

import json
import math

import numpy as np

from dorylus_py.protocol.messages import ProtocolError

MAX_HEADER_BYTES = 64 * 1024
MAX_DEPTH = 16
MAX_NUMBER = 2**53  # exact in a float64, ample for epochs, counts, versions and loss sums

_STEP = np.zeros(256, np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def nesting_depth(raw: bytes) -> int:
    """Deepest ``[``/``{`` nesting of ``raw``, brackets inside strings not counted; O(n) in numpy."""
    b = np.frombuffer(raw, np.uint8)
    if not len(b):
        return 0
    idx = np.arange(len(b))
    # A quote is escaped when an odd run of backslashes precedes it.
    last_plain = np.maximum.accumulate(np.where(b != _BACKSLASH, idx, -1))
    run_before = np.concatenate([[0], idx[:-1] - last_plain[:-1]])
    quote = (b == _QUOTE) & (run_before % 2 == 0)
    inside = (np.cumsum(quote) - quote) % 2 == 1  # after an opening quote, up to its closing one
    steps = np.where(inside | quote, 0, _STEP[b])
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def _int(text: str) -> int:
    if len(text) > 17:  # 2**53 has 16 digits; anything longer is out of range, and never converted
        raise ProtocolError(f"header number {text[:20]}... is out of range")
    value = int(text)
    if abs(value) > MAX_NUMBER:
        raise ProtocolError(f"header number {value} is out of range (|x| <= 2**53)")
    return value


def _float(text: str) -> float:
    value = float(text[:400])
    if not math.isfinite(value) or abs(value) > MAX_NUMBER:
        raise ProtocolError(f"header number {text[:20]} is not finite or out of range (|x| <= 2**53)")
    return value


def _constant(name: str):
    raise ProtocolError(f"header holds {name}; numbers must be finite")


def parse_header(raw: bytes) -> dict:
    """The JSON object in ``raw``, or :class:`ProtocolError` naming what is wrong with it."""
    header = parse(raw, MAX_HEADER_BYTES, "header")
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    return header


def parse(raw: bytes, max_bytes: int, what: str = "JSON") -> object:
    """The JSON value in ``raw`` (at most ``max_bytes``; nesting and numbers within the limits above),
    or :class:`ProtocolError` naming ``what`` is wrong."""
    if len(raw) > max_bytes:
        raise ProtocolError(f"{what} of {len(raw)} bytes exceeds {max_bytes}")
    # Every opening bracket bounds the depth from above: most values have a few and skip the scan.
    depth = raw.count(b"[") + raw.count(b"{")
    if depth > MAX_DEPTH and (depth := nesting_depth(raw)) > MAX_DEPTH:
        raise ProtocolError(f"{what} nested {depth} deep (at most {MAX_DEPTH})")
    try:
        return json.loads(raw, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ProtocolError(f"{what} is not valid JSON") from None
