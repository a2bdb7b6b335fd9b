"""Result blocks of streamed tasks (``--stream-rows``), held until the task's last message commits them.

A streamed task pushes its per-row outputs a block of rows at a time (``push_block``), as it computes
them, so its uploads overlap its compute and its downloads. Nothing is written into the graph server's
arrays then: a copy may still die part-way, or lose to another copy. Its final ``push_result`` carries
what only the whole chunk gives (weight gradients, loss sums, counts) and marks the result
``streamed``; only then are the blocks taken, whole, and checked and accepted like any result, so a
result still takes effect at once, exactly once.

A partial result belongs to one run of one copy: the task key, the attempt, and the id the run drew
(an invocation retried by the platform runs twice under one attempt, maybe on other weights). The
server stages blocks only of copies still running, and forgets a copy's blocks when it ends and a
key's when its result is in, so what is staged is bounded by the copies running. Every block is
checked on arrival (names, widths, dtype, rows inside the chunk and not sent before), and the staged
bytes are capped too: past the cap a new partial result is refused (its copy's commit then fails and
the task is relaunched), never one further along.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dorylus_py.protocol import ProtocolError
from graph_servers.spares import Spares

MIN_CAP_BYTES = 512 << 20


@dataclass
class _Partial:
    arrays: dict[str, np.ndarray]
    seen: np.ndarray  # per row of the chunk: its block came

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values()) + self.seen.nbytes


class BlockStaging:
    def __init__(self, cap_bytes: int = MIN_CAP_BYTES):
        self.cap = cap_bytes
        self.nbytes = 0
        self._partial: dict[tuple, _Partial] = {}  # (task key, attempt, run id) -> its blocks so far
        self._spares = Spares()  # arrays handed out by take, reused once nothing else holds them

    def add(self, run: tuple, rows: int, lo: int, hi: int, tensors: dict, widths: dict[str, int]) -> None:
        """Stage rows ``[lo, hi)`` of a chunk of ``rows`` rows for ``run`` (key, attempt, run id);
        ``widths``: each per-row output's name and width."""
        if not widths:
            raise ProtocolError("result block: this task has no per-row outputs")
        if set(tensors) != set(widths):
            raise ProtocolError(f"result block: expected tensors {sorted(widths)}, got {sorted(tensors)[:4]}")
        for name, t in tensors.items():
            if t.dtype != np.float32 or t.shape != (hi - lo, widths[name]):
                raise ProtocolError(f"result block: {name} must be float32 of shape {(hi - lo, widths[name])}, "
                                    f"got {t.dtype} {t.shape}")
        part = self._partial.get(run)
        if part is None:  # np.empty and np.zeros only reserve pages: nothing is touched unless it fits
            part = _Partial({n: self._array(rows, w) for n, w in widths.items()}, np.zeros(rows, bool))
            if self.nbytes + part.nbytes > self.cap:
                raise ProtocolError(f"result block: staging is full ({self.nbytes >> 20} of {self.cap >> 20} MB)")
            self._partial[run] = part
            self.nbytes += part.nbytes
        if part.seen[lo:hi].any():
            raise ProtocolError(f"result block: rows {lo}-{hi} came before")
        for name, t in tensors.items():
            part.arrays[name][lo:hi] = t
        part.seen[lo:hi] = True

    def take(self, run: tuple, widths: dict[str, int]) -> dict[str, np.ndarray]:
        """The whole per-row outputs of ``run``, which leave the staging; a ProtocolError when a block
        is missing (never sent, refused, or its copy's blocks forgotten)."""
        part = self._partial.pop(run, None)
        if part is not None:
            self.nbytes -= part.nbytes
        if not widths:
            return {}
        if part is None or not part.seen.all():
            missing = "every row" if part is None else f"{int((~part.seen).sum())} rows"
            raise ProtocolError(f"streamed result misses {missing}")
        for array in part.arrays.values():
            self._spares.give(array.base)  # the flat buffer the array is a view of
        return part.arrays

    def _array(self, rows: int, width: int) -> np.ndarray:
        """A ``(rows, width)`` array to stage into: a spare one that nothing holds any more (the caller
        copied its rows into the server's arrays), else a new one. A new array's pages are faulted in and
        zeroed by the kernel as the blocks are copied in: on this VM about 10 us a 4 KiB page, and a
        third of the loop thread's page faults on Dorylus's Reddit shape (docs/performance.md)."""
        return self._spares.get(rows * width).reshape(rows, width)

    def forget(self, key, attempt: int | None = None) -> None:
        """Drop the partial results of ``key`` (of its copy ``attempt`` only, if given)."""
        for run in [r for r in self._partial if r[0] == key and (attempt is None or r[1] == attempt)]:
            self.nbytes -= self._partial.pop(run).nbytes

    def __len__(self) -> int:
        return len(self._partial)
