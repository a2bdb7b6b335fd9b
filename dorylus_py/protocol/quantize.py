"""Narrower wire forms of float32 row blocks (``--wire-dtype``): what ghost rows, task rows, results and
gradient contributions travel as, one frame per block.

``float16`` and ``bfloat16`` round to nearest, ties to even (float16 saturates at its largest finite value,
65504, where a plain cast would give infinity; bfloat16 is sent as its 16 bits: numpy has no such type).
``int8`` follows AdaQP: one scale per row (its largest magnitude over 127, rounded up to a bfloat16: two
bytes, not four, which at 16 columns is 0.28x float32's bytes instead of 0.31x) and stochastic rounding, so
the decoded value is an unbiased estimate of the original (``E[decode] = x``) with an error below one step
(the row's scale) per element; its frame holds the row scales, then the values. Weights, weight
gradients and optimizer state stay float32. Encoding is numpy's, on the sending thread (a graph server's
loop thread: torch there would start an intra-op pool beside the graph thread's on the same cores), at
about 1 GB/s for the 16-bit forms and 0.5 GB/s for int8 (its random draws) here: it pays on a link of a
few hundred Mbps (a Lambda's) and costs on loopback.
"""

from __future__ import annotations

import numpy as np

from dorylus_py.wire_forms import INT8_SCALE_BYTES, WIRE_DTYPES, check_wire_dtype, wire_bytes

__all__ = ["ROW_BLOCKS", "WIRE_DTYPES", "narrowed", "dither", "pack", "unpack", "wire_bytes"]

INT8_MAX = 127
FLOAT16_MAX = 65504.0
# The tensors sent narrower: vertex rows (task inputs P, dZ, dOut, logits, AP; results Z, S, dG; ghost
# rows and contributions, "rows"). Attention scores (heads wide: few bytes) and all else stay as they are.
ROW_BLOCKS = frozenset({"P", "dZ", "dOut", "logits", "AP", "Z", "S", "dG", "rows"})


def narrowed(tensors: dict, dtype: str) -> dict[str, str]:
    """``Message.wire`` for ``tensors``: its 2-D float32 row blocks (:data:`ROW_BLOCKS`) in ``dtype``."""
    if dtype == "float32":
        return {}
    return {n: dtype for n, t in tensors.items() if n in ROW_BLOCKS and t.dtype == np.float32 and t.ndim == 2}


def pack(x: np.ndarray, dtype: str, rng: np.random.Generator | None = None) -> np.ndarray:
    """``x`` (2-D float32) as the one contiguous block that travels in ``dtype``; ``rng``: the stochastic
    rounding's draws (int8 only)."""
    check_wire_dtype(dtype)
    if x.dtype != np.float32 or x.ndim != 2:
        raise ValueError(f"expected 2-D float32 rows, got {x.dtype} of shape {x.shape}")
    x = np.require(x, requirements="C")
    if dtype == "float32":
        return x
    if dtype == "float16":
        return np.clip(x, -FLOAT16_MAX, FLOAT16_MAX).astype(np.float16)
    if dtype == "bfloat16":
        bits = x.view(np.uint32)
        up = (bits >> 16) & 1  # round to nearest, ties to even: add 0x7FFF, and one more if odd
        up += 0x7FFF
        up += bits
        up >>= 16
        return up.astype(np.uint16)
    rows, cols = x.shape
    out = np.empty(INT8_SCALE_BYTES * rows + rows * cols, np.uint8)
    mag = x.view(np.uint32) & np.uint32(0x7FFFFFFF)  # |x| as bits, ordered as |x| is: an integer max, 4x a float one
    amax = mag.max(axis=1, initial=0).view(np.float32)
    bits = (amax / np.float32(INT8_MAX)).astype(np.float32).view(np.uint32)
    bits = (bits + 0xFFFF) >> 16  # rounded up to bfloat16: no value exceeds 127 steps of the scale sent
    out[: INT8_SCALE_BYTES * rows].view(np.uint16)[:] = bits
    scale = (bits.astype(np.uint32) << 16).view(np.float32)
    inv = np.divide(np.float32(1.0), scale, out=np.zeros_like(scale), where=scale > 0)
    y = dither(rng or np.random.default_rng(), x.shape)  # floor(v + u), u ~ U[0, 1): E = v
    v = np.multiply(x, inv[:, None], out=mag.view(np.float32))  # the bits' buffer, spent
    y += v
    np.floor(y, out=y)
    np.clip(y, -INT8_MAX, INT8_MAX, out=y)
    out[INT8_SCALE_BYTES * rows :].view(np.int8).reshape(rows, cols)[:] = y
    return out


def dither(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """float32 draws of u ~ U[0, 1) for stochastic rounding, on the grid (k + 1/2) / 2**16: 16 random bits a
    draw, four from each of the generator's raw 64-bit words (2.5x the speed of ``rng.random``, which was
    the largest cost of int8 packing). The grid's mean is exactly 1/2, so ``E[floor(v + u)]`` is ``v`` to
    within 2**-17 of a step, below float32's own rounding of ``x / scale``."""
    n = shape[0] * shape[1]
    u = rng.bit_generator.random_raw(-(-n // 4)).view(np.uint16)[:n].astype(np.float32)
    u *= np.float32(2.0**-16)
    u += np.float32(2.0**-17)
    return u.reshape(shape)


def unpack(buf, rows: int, cols: int, dtype: str) -> np.ndarray:
    """The float32 rows a block :func:`pack` made (``buf``: its bytes, as received) stands for."""
    check_wire_dtype(dtype)
    if len(buf) != wire_bytes(rows, cols, dtype):
        raise ValueError(f"{len(buf)} bytes for {rows} x {cols} rows in {dtype}")
    if dtype == "float32":
        return np.frombuffer(buf, np.float32).reshape(rows, cols)
    if dtype == "float16":
        return np.frombuffer(buf, np.float16).reshape(rows, cols).astype(np.float32)
    if dtype == "bfloat16":
        bits = np.frombuffer(buf, np.uint16).astype(np.uint32)
        bits <<= 16  # in place: 3x the speed of a shift into a new array here
        return bits.view(np.float32).reshape(rows, cols)
    scale = (np.frombuffer(buf, np.uint16, count=rows).astype(np.uint32) << 16).view(np.float32)
    out = np.frombuffer(buf, np.int8, offset=INT8_SCALE_BYTES * rows).reshape(rows, cols).astype(np.float32)
    out *= scale[:, None]
    return out
