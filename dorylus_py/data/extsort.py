"""External sort-unique of int64 keys: range buckets on disk, each sorted in memory in turn.

Edges are keys (``row * n + col``); sorting them groups a CSR's rows, and de-duplicating them drops
repeated edges. A graph of 200 M edges is 1.6 GB of keys, more than a streaming step may hold, so
keys are appended to ``buckets`` files by key range as they arrive (``add``), and then each bucket
alone is loaded, sorted and de-duplicated (``compact``, ``sorted_buckets``). Memory is one bucket
(``BUCKET_KEYS`` keys, 64 MB) plus the block being added, whatever the number of keys;
the buckets come out in key order, so concatenated they are the sorted unique keys.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

BUCKET_KEYS = 1 << 23  # keys per bucket aimed at: 64 MB


class KeyBuckets:
    def __init__(self, folder: Path, limit: int, expected: int, name: str = "keys", bucket_keys: int | None = None):
        """Keys lie in ``[0, limit)``; about ``expected`` of them will be added."""
        bucket_keys = bucket_keys or BUCKET_KEYS
        self.count = max(1, min(1 << 15, math.ceil(max(expected, 1) / bucket_keys)))
        self.width = max(1, math.ceil(max(limit, 1) / self.count))
        self.paths = [Path(folder) / f"{name}-{b:05d}.bin" for b in range(self.count)]
        self.files = [open(p, "wb") for p in self.paths]
        self.added = 0
        self.sizes = np.zeros(self.count, dtype=np.int64)  # keys per bucket after the last compact

    def add(self, keys: np.ndarray) -> None:
        """Append ``keys`` (any order, duplicates allowed) to their buckets."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if not len(keys):
            return
        if keys.min() < 0 or keys.max() >= self.count * self.width:
            raise ValueError(f"key out of range [0, {self.count * self.width})")
        self.added += len(keys)
        if self.count == 1:
            self._file(0).write(memoryview(keys).cast("B"))
            return
        bucket = (keys // self.width).astype(np.uint16)
        keys = keys[np.argsort(bucket, kind="stable")]  # radix sort on small integers: linear time
        counts = np.bincount(bucket, minlength=self.count)
        ends = np.cumsum(counts)
        for b in np.nonzero(counts)[0]:
            self._file(b).write(memoryview(keys[ends[b] - counts[b] : ends[b]]).cast("B"))

    def _file(self, b: int):
        if self.files[b] is None:
            self.files[b] = open(self.paths[b], "ab")
        return self.files[b]

    def _close(self) -> None:
        for i, f in enumerate(self.files):
            if f is not None:
                f.close()
                self.files[i] = None

    def load(self, b: int) -> np.ndarray:
        """Bucket ``b``'s keys as they are on disk (sorted and unique after :meth:`compact`)."""
        self._close()
        return np.fromfile(self.paths[b], dtype=np.int64)

    def store(self, b: int, keys: np.ndarray) -> None:
        """Replace bucket ``b``'s keys (e.g. after dropping some)."""
        self._close()
        np.ascontiguousarray(keys, dtype=np.int64).tofile(self.paths[b])
        self.sizes[b] = len(keys)

    def compact(self) -> int:
        """Sort and de-duplicate every bucket in place; return the number of distinct keys."""
        for b in range(self.count):
            self.store(b, sort_unique(self.load(b)))
        return int(self.sizes.sum())

    def sorted_buckets(self):
        """Yield ``(b, keys)``: each bucket sorted and de-duplicated, in key order."""
        for b in range(self.count):
            keys = sort_unique(self.load(b))
            self.sizes[b] = len(keys)
            yield b, keys

    def remove(self) -> None:
        self._close()
        for p in self.paths:
            if p.exists():
                os.unlink(p)


def sort_unique(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct values of ``keys``, sorting it in place (several times faster than ``np.unique``
    on int64 keys here, which hashes first)."""
    keys.sort()
    if len(keys) < 2:
        return keys
    fresh = np.empty(len(keys), dtype=bool)
    fresh[0] = True
    np.not_equal(keys[1:], keys[:-1], out=fresh[1:])
    return keys[fresh]
