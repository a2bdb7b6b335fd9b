"""numpy's Philox4x64-10 stream in torch integer ops, so a device draws the same bits as numpy.

Dropout masks are keyed draws from ``np.random.Philox`` (``kernels/dropout.py``); a graph server or
task whose rows live on a GPU draws them there instead of on the host and copying them over. The
counter-based generator needs no state: block ``c`` of a key's stream is ``philox(counter=c + 1,
key)`` (numpy increments the counter before each block), four 64-bit words, little-endian. torch has
no unsigned 64-bit multiply, so words are int64 (same bits; sums and products wrap) and the high
half of a 64x64 product is built from 32-bit halves.
"""

from __future__ import annotations

import torch

_M = (0xD2E7470EE14C6C93, 0xCA5A826395121157)  # Random123's Philox4x64 multipliers
_W = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)  # and key increments (the golden ratio, sqrt 3 - 1)
_ROUNDS = 10  # numpy's
_LOW = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    """An unsigned 64-bit value as the int64 with the same bits."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _high(x: torch.Tensor) -> torch.Tensor:
    """Bits 32..63 of int64 words, as non-negative values (a logical shift)."""
    return (x >> 32) & _LOW


def _mulhilo(m: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(high, low)`` 64-bit halves of the 128-bit product ``m * x`` (``m`` a constant)."""
    m_lo, m_hi = m & _LOW, m >> 32
    x_lo, x_hi = x & _LOW, _high(x)
    ll, lh, hl, hh = x_lo * m_lo, x_hi * m_lo, x_lo * m_hi, x_hi * m_hi  # each < 2**64: wraps, bits exact
    mid = _high(ll) + (lh & _LOW) + (hl & _LOW)
    return hh + _high(lh) + _high(hl) + _high(mid), x * _signed(m)


def philox_blocks(first: int, count: int, key: tuple[int, int], device: torch.device | str = "cpu") -> torch.Tensor:
    """``(count, 4)`` int64: blocks ``first .. first + count - 1`` of the stream
    ``np.random.Philox(key=key)`` emits (its ``random_raw`` words, in the same order)."""
    c0 = torch.arange(first + 1, first + 1 + count, dtype=torch.int64, device=device)
    zero = torch.zeros_like(c0)
    c1, c2, c3 = zero, zero, zero  # a 256-bit counter: the upper words stay 0 below 2**63 blocks
    k0, k1 = key[0] & _MASK64, key[1] & _MASK64
    for r in range(_ROUNDS):
        if r:
            k0, k1 = (k0 + _W[0]) & _MASK64, (k1 + _W[1]) & _MASK64
        hi0, lo0 = _mulhilo(_M[0], c0)
        hi1, lo1 = _mulhilo(_M[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ _signed(k0), lo1, hi0 ^ c3 ^ _signed(k1), lo0
    return torch.stack((c0, c1, c2, c3), dim=1)


def philox_words16(first_word: int, count: int, key: tuple[int, int], device: torch.device | str = "cpu") -> torch.Tensor:
    """int32 ``(count,)``: the stream's 16-bit words ``first_word ..`` (its bytes read as ``<u2``)."""
    block, skip = divmod(first_word, 16)
    blocks = (skip + count + 15) // 16
    words = philox_blocks(block, blocks, key, device)
    shifts = torch.arange(0, 64, 16, dtype=torch.int64, device=device)
    parts = (words.unsqueeze(-1) >> shifts) & 0xFFFF  # (blocks, 4, 4): each word's four 16-bit parts, low first
    return parts.reshape(-1)[skip : skip + count].to(torch.int32)
