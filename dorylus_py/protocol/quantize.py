"""Narrower wire forms of float32 row blocks (issue 32's ``--wire-dtype``; not yet used by the wire).

``float16`` and ``bfloat16`` round to nearest (bfloat16 kept as its upper 16 bits in ``uint16``: numpy has
no such type); ``int8`` follows AdaQP: one float32 scale per row (its largest magnitude over 127) and
stochastic rounding, so the decoded value is an unbiased estimate of the original (``E[decode] = x``) with
an error below one step (the row's scale) per element. Weights and optimizer state stay float32; only
rows and gradient contributions in transit would travel this way.
"""

from __future__ import annotations

import numpy as np

WIRE_DTYPES = ("float32", "bfloat16", "float16", "int8")
INT8_MAX = 127


def encode(x: np.ndarray, dtype: str, rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """``x`` (2-D float32, finite) as ``(values, row scales or None)`` in ``dtype``; ``rng``: the stochastic
    rounding's draws (int8 only)."""
    if dtype not in WIRE_DTYPES:
        raise ValueError(f"wire dtype must be one of {', '.join(WIRE_DTYPES)}, got {dtype!r}")
    if x.dtype != np.float32 or x.ndim != 2:
        raise ValueError(f"expected 2-D float32 rows, got {x.dtype} of shape {x.shape}")
    if dtype == "float32":
        return x, None
    if dtype == "float16":
        return x.astype(np.float16), None
    if dtype == "bfloat16":
        bits = np.ascontiguousarray(x).view(np.uint32).astype(np.uint64)
        bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest, ties to even
        return (bits >> 16).astype(np.uint16), None
    scale = (np.abs(x).max(axis=1, initial=0.0) / INT8_MAX).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0).astype(np.float32)[:, None]
    draws = (rng or np.random.default_rng()).random(x.shape, dtype=np.float32)
    q = np.floor(x / safe + draws)
    return np.clip(q, -INT8_MAX, INT8_MAX).astype(np.int8), scale


def decode(values: np.ndarray, scale: np.ndarray | None, dtype: str) -> np.ndarray:
    """The float32 rows :func:`encode` gave ``values`` (and ``scale``) for."""
    if dtype == "float32":
        return values
    if dtype == "float16":
        return values.astype(np.float32)
    if dtype == "bfloat16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    if dtype == "int8":
        if scale is None or scale.shape != (values.shape[0],):
            raise ValueError("int8 rows need one scale per row")
        return values.astype(np.float32) * scale[:, None]
    raise ValueError(f"wire dtype must be one of {', '.join(WIRE_DTYPES)}, got {dtype!r}")


def wire_bytes(rows: int, cols: int, dtype: str) -> int:
    """Bytes a ``rows`` x ``cols`` block takes on the wire in ``dtype`` (scales included)."""
    per = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}[dtype]
    return rows * cols * per + (4 * rows if dtype == "int8" else 0)
