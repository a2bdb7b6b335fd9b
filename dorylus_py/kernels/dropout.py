"""Dropout whose mask is a pure function of ``(seed, epoch, layer, vertex id, column)``.

A recomputed or relaunched task, on any machine and with any chunking, draws the same mask, so
distributed training reproduces single-process training exactly. The bits come from a Philox
counter-based stream keyed by ``(seed, epoch, layer)``: vertex ``v``'s row is the 16-bit words at
``[v * width, (v + 1) * width)``, so a contiguous range of vertices is one vectorised draw (and on
2 cores this is about 2x faster than ``torch.bernoulli_``).
"""

from __future__ import annotations

import numpy as np
import torch

_WORD_BYTES = 2  # 16-bit words: keep probability resolution 1/65536
_BLOCK_BYTES = 32  # Philox4x64 emits 32 bytes per counter step


def dropout_keep_mask(start: int, stop: int, width: int, p: float, seed: int, epoch: int, layer: int) -> torch.Tensor:
    """Boolean ``(stop - start, width)`` mask of kept entries for vertices ``start..stop-1``."""
    if stop <= start:
        return torch.zeros((0, width), dtype=torch.bool)
    bitgen = np.random.Philox(key=np.array([seed & (2**64 - 1), (epoch << 16) | layer], dtype=np.uint64))
    first = start * width * _WORD_BYTES
    bitgen.advance(first // _BLOCK_BYTES)
    skip = first % _BLOCK_BYTES
    raw = np.random.Generator(bitgen).bytes((stop - start) * width * _WORD_BYTES + skip)
    words = np.frombuffer(raw, dtype=np.uint8, offset=skip).view("<u2").reshape(stop - start, width)
    return torch.from_numpy(words >= np.uint16(round(p * 65536)))


def dropout(h: torch.Tensor, p: float, seed: int, epoch: int, layer: int, start: int = 0) -> torch.Tensor:
    """Inverted dropout of rows ``start..start+len(h)-1``; identity when ``p == 0``."""
    if p == 0.0:
        return h
    keep = dropout_keep_mask(start, start + h.shape[0], h.shape[1], p, seed, epoch, layer).to(h.device)
    return h * keep * (1.0 / (1.0 - p))
