"""JSON parsed with limits, so that no text a peer or a file holds can exhaust the stack, the CPU or a later
``int()``: the rows of a ``tasks`` report, a decentral worker's report, the run's record files (the wire's
headers are MessagePack: ``header.py``).

Checked here: size (before anything), nesting depth (a vectorised pre-scan, before ``json.loads``
recurses), numbers (finite, integers of at most 2**53 in magnitude, so ``int(x)`` downstream cannot
overflow or allocate), and that the result is an object. ``NaN``/``Infinity`` are refused.
Files (``jsonfile.py``) are parsed by the same code with :data:`FILE_NUMBERS`: a run record holds a
diverged run's NaN loss, so there the constants pass and only integers are bounded (2**63; a file's
schema bounds each field it uses: ``schema.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dorylus_py.protocol.messages import ProtocolError

MAX_OBJECT_BYTES = 64 * 1024  # a row of a report
MAX_DEPTH = 16
MAX_NUMBER = 2**53  # exact in a float64, ample for epochs, counts, versions and loss sums


@dataclass(frozen=True)
class Numbers:
    """What numbers a parse takes: integers up to ``max_int`` in magnitude (a longer text is never given
    to ``int()``); floats up to ``max_float`` and, unless ``finite``, ``NaN`` and the infinities."""

    max_int: int = MAX_NUMBER
    max_float: float = MAX_NUMBER
    finite: bool = True

    @cached_property
    def decoder(self) -> json.JSONDecoder:
        """A decoder with these checks, made once (``json.loads`` with hooks builds one per call); a check
        that bounds nothing is left out, so that a file of many numbers is parsed at C speed."""
        bounded = self.finite or self.max_float < math.inf
        return json.JSONDecoder(parse_int=self._int, parse_float=self._float if bounded else None,
                                parse_constant=self._constant if self.finite else None)

    @cached_property
    def _max_chars(self) -> int:
        return len(str(self.max_int)) + 1  # its digits and a sign

    def _int(self, text: str) -> int:
        # a longer text is out of range, and never converted
        if len(text) > self._max_chars or abs(value := int(text)) > self.max_int:
            raise ProtocolError(f"number {text[:20]}{'...' if len(text) > 20 else ''} is out of range "
                                f"(|x| <= 2**{self.max_int.bit_length() - 1})")
        return value

    def _float(self, text: str) -> float:
        value = float(text[:400])
        if not math.isfinite(value) and self.finite or abs(value) > self.max_float:
            raise ProtocolError(f"number {text[:20]} is not finite or out of range (|x| <= {self.max_float:.4g})")
        return value

    def _constant(self, name: str) -> float:
        if self.finite:
            raise ProtocolError(f"holds {name}; numbers must be finite")
        return float(name)


HEADER_NUMBERS = Numbers()
FILE_NUMBERS = Numbers(max_int=2**63, max_float=math.inf, finite=False)

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


def parse_object(raw: bytes, what: str = "row") -> dict:
    """The JSON object in ``raw`` (at most :data:`MAX_OBJECT_BYTES`), or :class:`ProtocolError` naming
    what is wrong with it."""
    value = parse(raw, MAX_OBJECT_BYTES, what)
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} is not a JSON object")
    return value


def parse(raw: bytes, max_bytes: int, what: str = "JSON", numbers: Numbers = HEADER_NUMBERS) -> object:
    """The JSON value in ``raw`` (at most ``max_bytes``; nesting within :data:`MAX_DEPTH`, numbers within
    ``numbers``), or :class:`ProtocolError` naming ``what`` is wrong."""
    if len(raw) > max_bytes:
        raise ProtocolError(f"{what}: {len(raw)} bytes exceed {max_bytes}")
    # Every opening bracket bounds the depth from above: most values have a few and skip the scan.
    depth = raw.count(b"[") + raw.count(b"{")
    if depth > MAX_DEPTH and (depth := nesting_depth(raw)) > MAX_DEPTH:
        raise ProtocolError(f"{what}: nested {depth} deep (at most {MAX_DEPTH})")
    try:
        return numbers.decoder.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))  # as json.loads
    except ProtocolError as e:  # a number out of bounds
        raise ProtocolError(f"{what}: {e}") from None
    except json.JSONDecodeError as e:
        raise ProtocolError(f"{what}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise ProtocolError(f"{what}: not valid JSON (not UTF-8 text)") from None
    except (ValueError, RecursionError):
        raise ProtocolError(f"{what}: not valid JSON") from None
