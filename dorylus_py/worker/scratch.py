"""A tensor thread's reused copy of a task's rows (``cpu``/``gpu`` backends, ``graph_servers/direct.py``).

A graph server's own tensor threads copy each task's rows out of the server's arrays before use (a
later write must not reach a thread that still holds them). A fresh array per task is fresh pages:
above glibc's mmap threshold (``heap.py``: 128 KiB) every 4 KiB of it is faulted in and zeroed, about
10 us a page here, a quarter of the ``cpu`` backend's page faults on Dorylus's Reddit shape. One buffer
a thread, grown to the largest task's rows and written again by the next task, faults once.

The copies are good until the thread's next task: whatever outlives the task (its result) must not
share them, so :meth:`RowScratch.owned` copies out a result that does (a kernel that passes rows
through unchanged).
"""

from __future__ import annotations

import numpy as np
import torch

ALIGN = 64  # each copy starts on a cache line


class RowScratch:
    def __init__(self):
        self._buf = np.empty(0, np.uint8)

    def copy(self, tensors: dict) -> dict[str, np.ndarray]:
        """``tensors`` (name -> array) copied into this buffer, same shapes and dtypes."""
        arrays = {k: np.asarray(v) for k, v in tensors.items()}
        starts, end = {}, 0
        for k, a in arrays.items():
            starts[k] = end
            end += -(-a.nbytes // ALIGN) * ALIGN
        if end + ALIGN > self._buf.nbytes:  # room for the copies after any start (malloc aligns to 16 only)
            self._buf = np.empty(end + ALIGN, np.uint8)  # a new buffer: copies a caller still holds stay intact
        base = -self._buf.ctypes.data % ALIGN
        out = {}
        for k, a in arrays.items():
            lo = base + starts[k]
            out[k] = self._buf[lo : lo + a.nbytes].view(a.dtype).reshape(a.shape)
            np.copyto(out[k], a)
        return out

    def owned(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``tensors`` with every one that shares this buffer's memory replaced by a copy of it."""
        lo, hi = self._buf.ctypes.data, self._buf.ctypes.data + self._buf.nbytes
        return {k: v.clone() if _within(v, lo, hi) else v for k, v in tensors.items()}


def _within(t: torch.Tensor, lo: int, hi: int) -> bool:
    if t.device.type != "cpu" or t.numel() == 0:
        return False
    start = t.data_ptr()
    end = start + ((np.array(t.shape) - 1) * np.array(t.stride())).clip(0).sum() * t.element_size() + t.element_size()
    return start < hi and end > lo
