"""Dropout whose mask is a pure function of ``(seed, epoch, layer, stream, row id, column)``.

A recomputed or relaunched task, on any machine and with any chunking, draws the same mask, so
distributed training reproduces single-process training exactly. The bits come from a Philox
counter-based stream keyed by ``(seed, epoch, stream, layer)``: row ``v``'s entries are the 16-bit
words at ``[v * width, (v + 1) * width)``, so a contiguous range of rows is one vectorised draw (and
on 2 cores this is about 2x faster than ``torch.bernoulli_``). Rows are vertices for the
``VERTEX`` stream (dropout on a layer's input) and edges for ``EDGE`` (GAT's attention dropout).

A mask for rows on a GPU is drawn there, from the same stream (``kernels/philox.py``: the same bits in
torch integer ops); on the host numpy draws it (about 40x faster here than those ops on the CPU).
"""

from __future__ import annotations

import numpy as np
import torch

from dorylus_py.kernels.philox import philox_words16

_WORD_BYTES = 2  # 16-bit words: keep probability resolution 1/65536
_BLOCK_BYTES = 32  # Philox4x64 emits 32 bytes per counter step
VERTEX, EDGE = 0, 1  # streams: a layer's input rows (vertices), attention coefficients (edges)


def dropout_keep_mask(start: int, stop: int, width: int, p: float, seed: int, epoch: int, layer: int,
                      stream: int = VERTEX, device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean ``(stop - start, width)`` mask of kept entries for rows ``start..stop-1``, on ``device``."""
    if stop <= start:
        return torch.zeros((0, width), dtype=torch.bool, device=device)
    if not (0 <= layer < 256 and 0 <= stream < 256):
        raise ValueError(f"dropout keys take layers and streams below 256, got layer {layer} stream {stream}")
    key = (seed & (2**64 - 1), (epoch << 16) | (stream << 8) | layer)
    if torch.device(device).type != "cpu":
        return drawn_by_torch(start, stop, width, p, key, device)
    bitgen = np.random.Philox(key=np.array(key, dtype=np.uint64))
    first = start * width * _WORD_BYTES
    bitgen.advance(first // _BLOCK_BYTES)
    skip = first % _BLOCK_BYTES
    raw = np.random.Generator(bitgen).bytes((stop - start) * width * _WORD_BYTES + skip)
    words = np.frombuffer(raw, dtype=np.uint8, offset=skip).view("<u2").reshape(stop - start, width)
    return torch.from_numpy(words >= np.uint16(round(p * 65536)))


def drawn_by_torch(start: int, stop: int, width: int, p: float, key: tuple[int, int],
                   device: torch.device | str) -> torch.Tensor:
    """The mask :func:`dropout_keep_mask` draws, drawn on ``device`` by torch ops (any device: the tests
    compare it with numpy's on the CPU)."""
    words = philox_words16(start * width, (stop - start) * width, key, device)
    return (words >= round(p * 65536)).reshape(stop - start, width)


def dropout(h: torch.Tensor, p: float, seed: int, epoch: int, layer: int, start: int = 0) -> torch.Tensor:
    """Inverted dropout of rows ``start..start+len(h)-1``; identity when ``p == 0``."""
    if p == 0.0:
        return h
    keep = dropout_keep_mask(start, start + h.shape[0], h.shape[1], p, seed, epoch, layer, device=h.device)
    return h * keep * (1.0 / (1.0 - p))
