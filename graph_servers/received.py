"""The peers' gradient contributions to our vertices' rows, as Gather backward reads them.

Each chunk's ``A[chunk, a peer's vertices]ᵀ dG`` rows are its contribution to that peer
(``GraphState.contributions``). Both holders add parts to a target in the order of their keys, so a
run's bits do not depend on the order the messages came in.

- :class:`NewestParts` (async): each peer chunk sends its own part; its newest replaces its previous
  one, and all are kept (a chunk of ours may read them at any time). With ``smoothing`` gamma > 0 the
  newest is folded into the kept part instead, ``m = gamma m + (1 - gamma) newest`` (PipeGCN's moving
  average of stale gradients): the same memory, and a stale part's noise damped.
- :class:`OrderedSum` (sync): every key contributes exactly once per epoch, so parts are folded into one
  ``(n, width)`` sum as soon as every key before them has come, and dropped. A sender sums its own
  chunks' parts this way (keys: its chunks; each is computed only when its turn comes, ``add_when_due``,
  so none waits as rows) and sends each peer one slice of the sum; a receiver sums
  the peers' slices (keys: ``(peer, ALL_CHUNKS)``). Kept per peer chunk instead, the parts took about
  2 GB a server at 10 M vertices / 200 M edges. Its sum is written again next epoch (``spares.py``:
  fresh arrays are page faults), up to ``SPARE_BYTES`` a sum.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

from dorylus_py.protocol import ProtocolError
from graph_servers.spares import Spares

ALL_CHUNKS = -1  # the chunk a sync-mode sum of all of a peer's chunks' contributions names


def moving_average(kept: np.ndarray, new: np.ndarray, gamma: np.float32) -> np.ndarray:
    """PipeGCN's smoothing of a stale value: ``gamma kept + (1 - gamma) new`` (async only)."""
    return gamma * kept + (np.float32(1) - gamma) * new


class NewestParts:
    def __init__(self, smoothing: float = 0.0):
        self.parts: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.smoothing = np.float32(smoothing)

    def add(self, key: tuple[int, int], local: np.ndarray, rows: np.ndarray) -> None:
        kept = self.parts.get(key)
        if self.smoothing and kept is not None and np.array_equal(kept[0], local):  # a chunk touches the same rows
            rows = moving_average(kept[1], rows, self.smoothing)
        self.parts[key] = (local, rows)

    def add_to(self, a: int, b: int, target: np.ndarray) -> None:
        """Add every kept part's rows ``a..b-1`` to ``target`` (from a snapshot of the keys: the loop
        thread may add parts meanwhile)."""
        for key in sorted(list(self.parts)):
            local, rows = self.parts[key]
            inside = (local >= a) & (local < b)
            target[local[inside] - a] += rows[inside]  # a part never repeats a row


class OrderedSum:
    def __init__(self, n: int, width: int, keys: list[tuple[int, int]]):
        """``keys``: every source that contributes once per epoch (a sender: ``(its rank, chunk)``;
        a receiver: ``(peer, ALL_CHUNKS)``); ``n`` rows of ``width`` (ghosts, or our vertices)."""
        self.n, self.width, self.keys = n, width, sorted(keys)
        self.lock = threading.Lock()  # the loop thread adds; the graph thread reads once all have come
        self.spares = Spares()
        self._reset()

    def _reset(self) -> None:
        self.done = 0  # keys[:done] are in the sum
        self.sum: np.ndarray | None = None
        # key -> its part (local, rows), or what makes it
        self.waiting: dict[tuple[int, int], tuple | Callable[[], tuple[np.ndarray, np.ndarray]]] = {}

    def add(self, key: tuple[int, int], local: np.ndarray, rows: np.ndarray) -> None:
        """Fold ``rows`` (at ``local``) in, or keep them until every key before ``key`` is in (the caller
        does not write ``rows`` again: a peer's slice, as it came)."""
        with self.lock:
            self._refuse_repeat(key)
            self.waiting[key] = (local, rows)
            self._fold_due()

    def add_when_due(self, key: tuple[int, int], make) -> None:
        """Fold the part ``make()`` returns, ``(local, rows)``, once every key before ``key`` is in: until
        then it waits as ``make``, not as rows (``rows`` may be reused once this returns). If ``make``
        raises, ``key`` still waits, and its part is made again at the next call."""
        with self.lock:
            self._refuse_repeat(key)
            self.waiting[key] = make
            self._fold_due()

    def _refuse_repeat(self, key: tuple[int, int]) -> None:
        if key in self.waiting or key in self.keys[: self.done]:
            raise ProtocolError(f"peer {key[0]} chunk {key[1]} contributed twice in one epoch")

    def _fold_due(self) -> None:
        """Fold the waiting parts whose every earlier key is in, in key order (the lock held)."""
        while self.done < len(self.keys) and self.keys[self.done] in self.waiting:
            key = self.keys[self.done]
            part = self.waiting[key]
            local, rows = part() if callable(part) else part
            if self.sum is None:  # the first part in order is written, not added (a fifth of the time)
                self.sum = self.spares.get(self.n * self.width).reshape(self.n, self.width)
                self.sum.fill(0)
                self.sum[local] = rows  # a part never repeats a row
            else:  # torch's index_add: 3x numpy's fancy-indexed add, the same sums (no row repeats)
                torch.from_numpy(self.sum).index_add_(0, torch.from_numpy(local).long(), torch.from_numpy(rows))
            del self.waiting[key]  # only once folded: a part whose making raised waits on
            self.done += 1

    def add_to(self, a: int, b: int, target: np.ndarray) -> None:
        """Add the epoch's whole sum to ``target`` (all rows: sync mode gathers all at once), then
        start the next epoch's."""
        if (a, b) != (0, self.n):
            raise ValueError(f"the peers' sum is read for rows {a}..{b} of {self.n}")
        target += self.take()

    def take(self) -> np.ndarray:
        """The epoch's whole sum (every key in), and a fresh start for the next epoch's (whose sum is
        written into this one's memory once nothing holds it)."""
        with self.lock:
            if self.done < len(self.keys):
                raise ValueError(f"the sum is read with {self.done} of {len(self.keys)} parts in")
            total = np.zeros((self.n, self.width), np.float32) if self.sum is None else self.sum
            if self.sum is not None:
                self.spares.give(self.sum.base)  # the flat buffer the sum is a view of
            self._reset()
            return total

    @property
    def nbytes(self) -> int:
        """Bytes held: the waiting parts and the sum (0 once the epoch's sum is taken)."""
        held = sum(part[0].nbytes + part[1].nbytes for part in self.waiting.values() if not callable(part))
        return held + (0 if self.sum is None else self.sum.nbytes)
