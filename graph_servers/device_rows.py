"""Where a graph server's graph stages compute: its device's twins of the host buffers they read and write.

The host buffers stay the truth: tasks pull their rows from them, and the peers' ghost rows and the
tasks' results land in them (the loop thread writes them). On a GPU every buffer has a twin in device
memory, a view of its root's twin wherever buffers share memory (``remat``). What the loop thread writes
goes to the twin at once, on a copy stream, from pinned host memory (:meth:`DeviceRows.upload`), so it
travels while the graph thread computes another chunk; a graph stage first waits for those copies
(:meth:`DeviceRows.stage`), computes on a stream of its own, and copies what it wrote back the same way
(:meth:`DeviceRows.download`). The partition's sparse blocks go to the device once (``GraphState``).

On the CPU the twin *is* the host buffer: the same code runs, and nothing is copied. With
``DORYLUS_DEVICE_COPIES=1`` (for tests) the CPU keeps separate twins, so the copying path, which a GPU
takes, runs and is checked on machines without one: a missed upload or download shows as a wrong result.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

COPIES_ENV = "DORYLUS_DEVICE_COPIES"


def _root(a: np.ndarray) -> np.ndarray:
    """The array that owns ``a``'s memory (``a`` itself unless it is a view)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class DeviceRows:
    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.copies = self.device.type != "cpu" or os.environ.get(COPIES_ENV) == "1"
        cuda = self.device.type == "cuda"
        self._copy = torch.cuda.Stream(self.device) if cuda else None  # uploads and downloads
        self._compute = torch.cuda.Stream(self.device) if cuda else None  # the graph thread's stages
        self._twins: dict[int, tuple[np.ndarray, torch.Tensor]] = {}  # id(root) -> (root, its flat twin)

    def zeros(self, *shape: int) -> np.ndarray:
        """A zeroed float32 host buffer (page-locked on a GPU, so copies from and to it run asynchronously)."""
        if self._copy is None:
            return np.zeros(shape, np.float32)
        return torch.zeros(shape, dtype=torch.float32, pin_memory=True).numpy()

    def track(self, arrays) -> None:
        """Give every buffer in ``arrays`` (float32, zeroed, as :meth:`zeros` makes them) its twin."""
        if not self.copies:
            return
        for a in arrays:
            root = _root(a)
            if id(root) not in self._twins:
                if root.dtype != np.float32 or not root.flags.c_contiguous:
                    raise ValueError(f"device twins are of C-contiguous float32 buffers, not {root.dtype}")
                self._twins[id(root)] = (root, torch.zeros(root.size, dtype=torch.float32, device=self.device))

    @property
    def twin_bytes(self) -> int:
        """Device memory the twins take (0 on the CPU without copies)."""
        return sum(t.nbytes for _, t in self._twins.values())

    def twin(self, host: np.ndarray) -> torch.Tensor:
        """``host`` as the graph stages see it: the buffer itself on the CPU, else the same view of its
        root's twin."""
        if not self.copies:
            return torch.from_numpy(host)
        root = _root(host)
        if id(root) not in self._twins:
            raise ValueError(f"a {host.shape} buffer has no device twin (GraphState tracks every buffer it makes)")
        flat, item = self._twins[id(root)][1], host.itemsize
        offset = (_address(host) - _address(root)) // item
        return flat.as_strided(host.shape, tuple(s // item for s in host.strides), offset)

    def upload(self, host: np.ndarray, index=slice(None)) -> None:
        """After ``host[index]`` was written on the host: the same part of its twin, on the copy stream."""
        if self.copies:
            src = torch.from_numpy(host)[index]
            with self._on(self._copy):  # a strided part (a run of per-edge columns) goes through a temporary
                self.twin(host)[index].copy_(src, non_blocking=src.is_contiguous())

    def download(self, host: np.ndarray, index=slice(None)) -> None:
        """After a stage wrote ``twin[index]``: ``host[index]``, back before this returns (what the
        stage wrote is read on the host next: by tasks, the peers, or the stage itself)."""
        if not self.copies:
            return
        with self._on(self._copy):
            if self._copy is not None:
                self._copy.wait_stream(self._compute)
            dst = torch.from_numpy(host)[index]
            dst.copy_(self.twin(host)[index], non_blocking=dst.is_contiguous())
        if self._copy is not None:
            self._copy.synchronize()

    @contextlib.contextmanager
    def stage(self):
        """Around a graph stage (on the graph thread): its work on the compute stream, after every upload
        queued so far."""
        if self._compute is None:
            yield
            return
        with torch.cuda.stream(self._compute):
            self._compute.wait_stream(self._copy)
            yield

    @staticmethod
    def _on(stream):
        return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)
