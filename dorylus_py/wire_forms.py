"""The forms vertex rows may travel in (``--wire-dtype``) and what a block of rows takes in each: pure
Python, so the settings and the cost estimator read them without numpy; ``protocol/quantize.py`` is the
codec."""

from __future__ import annotations

WIRE_DTYPES = ("float32", "bfloat16", "float16", "int8")
_ITEM = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
INT8_SCALE_BYTES = 2  # int8 rows carry one bfloat16 scale each


def check_wire_dtype(dtype: str) -> None:
    if dtype not in WIRE_DTYPES:
        raise ValueError(f"wire dtype must be one of {', '.join(WIRE_DTYPES)}, got {dtype!r}")


def wire_bytes(rows: int, cols: int, dtype: str) -> int:
    """Bytes a ``rows`` x ``cols`` block takes on the wire in ``dtype`` (scales included)."""
    check_wire_dtype(dtype)
    return rows * cols * _ITEM[dtype] + (INT8_SCALE_BYTES * rows if dtype == "int8" else 0)
