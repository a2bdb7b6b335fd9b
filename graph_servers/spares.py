"""Flat float32 buffers an owner writes into again once nothing else holds them.

``heap.py`` fixes glibc's mmap threshold at 128 KiB, so every fresh array above that is fresh pages,
faulted in and zeroed by the kernel 4 KiB at a time (about 10 us a page on this VM under cgroup v1's
accounting). Where an owner makes the same large arrays every epoch (a sync sum of contributions, the
copies of parts that wait for it), keeping the old ones and writing into them again costs no faults.
A buffer handed out may still be read elsewhere (a slice sent zero-copy on a socket); ``sys.getrefcount``
says when nothing holds it, exactly on CPython with its GIL (``EXACT_REFCOUNTS``), where alone they are
reused.
"""

from __future__ import annotations

import sys

import numpy as np

# whether sys.getrefcount tells that nothing else holds an array: CPython with its GIL (not PyPy, not a
# free-threaded build, whose counts are deferred)
EXACT_REFCOUNTS = sys.implementation.name == "cpython" and getattr(sys, "_is_gil_enabled", lambda: True)()
SPARE_BYTES = 64 << 20  # kept by one owner, at most (Dorylus's Reddit shape: a sum and its waiting parts, 8 x 7.7 MB)


class Spares:
    def __init__(self, cap_bytes: int = SPARE_BYTES):
        """Keep at most ``cap_bytes`` of buffers (the newest kept first)."""
        self.cap_bytes = cap_bytes
        self._kept: list[np.ndarray] = []

    def get(self, size: int) -> np.ndarray:
        """A flat float32 buffer of ``size`` elements: a kept one of that size that nothing holds, else
        new (of exactly that size, so what its owner counts is what it holds). Its contents are whatever
        was last written."""
        for i in range(len(self._kept) if EXACT_REFCOUNTS else 0):
            if self._kept[i].size == size and sys.getrefcount(self._kept[i]) == 2:  # the list's, the call's
                return self._kept.pop(i)
        return np.empty(size, np.float32)

    def give(self, buffer: np.ndarray) -> None:
        """Keep ``buffer`` (a flat one from :meth:`get`) for a later :meth:`get`, once nothing holds it."""
        if buffer.nbytes > self.cap_bytes:
            return
        self._kept.insert(0, buffer)
        while sum(b.nbytes for b in self._kept) > self.cap_bytes:
            self._kept.pop()

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._kept)
