"""Result blocks of streamed tasks (``--stream-rows``), held until the task's last message commits them.

A streamed task pushes its per-row outputs a block of rows at a time (``push_block``), as it computes
them, so its uploads overlap its compute and its downloads. Nothing is written into the graph server's
arrays then: a copy may still die part-way, or lose to another copy. Its final ``push_result`` carries
what only the whole chunk gives (weight gradients, loss sums, counts) and marks the result
``streamed``; only then are the blocks taken, whole, and checked and accepted like any result, so a
result still takes effect at once, exactly once.

Every block is checked on arrival (names, widths, dtype, rows inside the chunk and not sent before),
and the staged bytes are capped: past the cap the oldest partial result is dropped, and its copy's
commit is refused (the task is relaunched). A peer can cost us at most the cap.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from dorylus_py.protocol import ProtocolError

CAP_BYTES = 512 << 20


@dataclass
class _Partial:
    arrays: dict[str, np.ndarray]
    seen: np.ndarray  # per row of the chunk: its block came

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values()) + self.seen.nbytes


class BlockStaging:
    def __init__(self, cap_bytes: int = CAP_BYTES):
        self.cap = cap_bytes
        self.nbytes = 0
        self._partial: OrderedDict[tuple, _Partial] = OrderedDict()  # (task key, attempt) -> its blocks, oldest first

    def add(self, task: tuple, rows: int, lo: int, hi: int, tensors: dict, widths: dict[str, int]) -> None:
        """Stage rows ``[lo, hi)`` of a chunk of ``rows`` rows for ``task`` (a key and an attempt);
        ``widths``: each per-row output's name and width."""
        if set(tensors) != set(widths):
            raise ProtocolError(f"result block: expected tensors {sorted(widths)}, got {sorted(tensors)[:4]}")
        for name, t in tensors.items():
            if t.dtype != np.float32 or t.shape != (hi - lo, widths[name]):
                raise ProtocolError(f"result block: {name} must be float32 of shape {(hi - lo, widths[name])}, "
                                    f"got {t.dtype} {t.shape}")
        part = self._partial.get(task)
        if part is None:
            part = _Partial({n: np.empty((rows, w), np.float32) for n, w in widths.items()}, np.zeros(rows, bool))
            self._partial[task] = part
            self.nbytes += part.nbytes
        if part.seen[lo:hi].any():
            raise ProtocolError(f"result block: rows {lo}-{hi} came before")
        for name, t in tensors.items():
            part.arrays[name][lo:hi] = t
        part.seen[lo:hi] = True
        while self.nbytes > self.cap and len(self._partial) > 1:
            self._drop(next(iter(self._partial)))

    def take(self, task: tuple, widths: dict[str, int]) -> dict[str, np.ndarray]:
        """The whole per-row outputs of ``task``, which leave the staging; a ProtocolError when a block
        is missing (never sent, refused, or dropped past the cap)."""
        if not widths:
            return {}
        part = self._partial.get(task)
        if part is None or not part.seen.all():
            missing = "every row" if part is None else f"{int((~part.seen).sum())} rows"
            raise ProtocolError(f"streamed result misses {missing}")
        self._drop(task)
        return part.arrays

    def _drop(self, task: tuple) -> None:
        self.nbytes -= self._partial.pop(task).nbytes

    def __len__(self) -> int:
        return len(self._partial)
