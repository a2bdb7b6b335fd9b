"""A warm container's cache of static rows: the input features it pulled, kept for its next tasks.

Layer 0's input rows never change in training, and each chunk's are pulled by three tasks an epoch
(the training forward, the evaluation forward, the backward); at 128 features they are most of the
bytes a worker pulls. A warm Lambda container keeps its module-level state between invocations, so it
keeps those rows too, and names them in its next pull of the same chunk (``have``); the graph server
leaves them out when its own token for the chunk is one of those named (``graph_servers/task_io.py``).
The token stands for the rows' contents (features' checksum, server, chunk bounds, normalisation): the
cache never decides whether rows are still right, the graph server does.

Bounded by bytes (``row_cache_mb`` in the event). Once full it keeps what it holds and does not take
new chunks' rows: a worker meets its server's chunks in a cycle every epoch, and a least-recently-used
cache smaller than the cycle evicts each chunk just before it comes round again (at 10 M vertices,
1.3 GB of features a server against 752 MB a worker, LRU hit little and held 3 GB). A new token for a
chunk it holds replaces its rows; a smaller cap drops the oldest. The cached arrays are the received
frames themselves (no copy), which kernels only read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

Slot = tuple  # (graph server address, its rank, chunk): where a task's rows come from


class RowCache:
    def __init__(self, cap_bytes: int = 0):
        self.cap = cap_bytes
        self.nbytes = 0
        # token -> (slot, tensor name, rows), oldest first
        self._rows: OrderedDict[str, tuple[Slot, str, np.ndarray]] = OrderedDict()
        self._slots: dict[Slot, dict[str, str]] = {}  # slot -> tensor name -> token of the rows held for it
        self._lock = threading.Lock()  # in-process workers share the module (they run with the cache off)

    def resize(self, cap_bytes: int) -> None:
        """The cap the latest event asks for (0 empties the cache)."""
        with self._lock:
            self.cap = max(0, cap_bytes)
            self._evict()

    def held(self, slot: Slot) -> dict[str, tuple[str, np.ndarray]]:
        """Tensor name -> (token, rows) of what is held for ``slot``: references the caller keeps until
        its reply is in, so an eviction meanwhile cannot take rows the graph server was told not to send."""
        with self._lock:
            return {name: (token, self._rows[token][2]) for name, token in self._slots.get(slot, {}).items()}

    def keep(self, slot: Slot, name: str, token: str, rows: np.ndarray) -> None:
        """Hold ``rows`` (the static tensor ``name`` of ``slot``) under ``token``, replacing the slot's
        previous rows of that name; rows that do not fit in what the cap leaves are not kept."""
        with self._lock:
            old = self._slots.get(slot, {}).get(name)
            if old is not None:
                self._drop(old)
            if token in self._rows:
                self._drop(token)
            if self.nbytes + rows.nbytes > self.cap:
                return
            self._rows[token] = (slot, name, rows)
            self._slots.setdefault(slot, {})[name] = token
            self.nbytes += rows.nbytes

    def tokens(self, where: str) -> list[str]:
        """The tokens of every rows held for slots of the graph server at ``where`` (the first part of a slot)."""
        with self._lock:
            return [token for slot, names in self._slots.items() if slot[0] == where for token in names.values()]

    def _evict(self) -> None:
        while self.nbytes > self.cap and self._rows:
            self._drop(next(iter(self._rows)))

    def _drop(self, token: str) -> None:
        slot, name, rows = self._rows.pop(token)
        self.nbytes -= rows.nbytes
        names = self._slots[slot]
        del names[name]
        if not names:
            del self._slots[slot]

    def __len__(self) -> int:
        return len(self._rows)
