"""The whole graph's in-edge CSR, built from an edge stream with bounded memory and kept on disk.

Edges become keys ``dst * n + src``; an external sort-unique (``data/extsort.py``) groups them by
destination and drops duplicates, and the sorted buckets are written out as the CSR's column array
(``int32`` when ids fit). Only the row pointers (``8 (N + 1)`` bytes) stay in memory; the columns are
memory-mapped and read in row blocks by every later step (partitioner, partition layouts).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dorylus_py.data.extsort import KeyBuckets
from dorylus_py.partition.source import GraphSource

log = logging.getLogger(__name__)

EDGE_BLOCK = 1 << 22  # edges handled at once by every streaming step


@dataclass(frozen=True, eq=False)
class DiskCSR:
    indptr: np.ndarray  # (N + 1,) int64, in memory
    indices: np.ndarray  # (E,) int32 (int64 past 2^31 vertices), memory-mapped: sources of each row's in-edges

    @property
    def num_nodes(self) -> int:
        return len(self.indptr) - 1

    @property
    def num_edges(self) -> int:
        return int(self.indptr[-1])

    def row_ranges(self, edges: int = EDGE_BLOCK):
        """Consecutive row ranges ``(r0, r1)`` of about ``edges`` edges each (one row may hold more)."""
        n, r0 = self.num_nodes, 0
        while r0 < n:
            r1 = int(np.searchsorted(self.indptr, self.indptr[r0] + edges, side="right")) - 1
            r1 = min(n, max(r1, r0 + 1))
            yield r0, r1
            r0 = r1

    def block(self, r0: int, r1: int) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, cols)``: the in-edges of rows ``r0:r1`` (rows as int64 ids, cols as stored)."""
        ptr = self.indptr[r0 : r1 + 1]
        rows = np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(ptr))
        return rows, np.asarray(self.indices[ptr[0] : ptr[-1]])

    def in_degrees(self) -> np.ndarray:
        return np.diff(self.indptr)


def index_dtype(limit: int):
    """The narrowest of int32 / int64 holding ids below ``limit``."""
    return np.int32 if limit < 2**31 else np.int64


def build_csr(source: GraphSource, workdir: Path, progress=None) -> DiskCSR:
    """In-edge CSR of ``source`` without self loops or duplicate edges (both dropped with a warning,
    as :class:`~dorylus_py.data.Graph` does), its columns in ``workdir/indices.bin``."""
    say = progress or (lambda msg: None)
    n = source.num_nodes
    buckets = KeyBuckets(workdir, n * n, source.num_edge_records, name="in-edges")
    loops = 0
    try:
        for done, (src, dst) in enumerate(source.edge_blocks(EDGE_BLOCK)):
            say(f"reading edges: {done * EDGE_BLOCK:,} of {source.num_edge_records:,}")
            keep = src != dst
            loops += len(src) - int(keep.sum())
            buckets.add(dst[keep] * n + src[keep])
        return _write_sorted(buckets, n, workdir / "indices.bin", loops, source.name, say)
    finally:
        buckets.remove()


def symmetrized(csr: DiskCSR, workdir: Path) -> DiskCSR:
    """CSR of ``A + Aᵀ`` (no duplicates, no self loops): the undirected graph METIS needs."""
    n = csr.num_nodes
    buckets = KeyBuckets(workdir, n * n, 2 * csr.num_edges, name="sym")
    try:
        for r0, r1 in csr.row_ranges():
            rows, cols = csr.block(r0, r1)
            buckets.add(rows * n + cols)
            buckets.add(cols.astype(np.int64) * n + rows)
        return _write_sorted(buckets, n, workdir / "sym-indices.bin", 0, None, None)
    finally:
        buckets.remove()


def _write_sorted(buckets: KeyBuckets, n: int, path: Path, loops: int, name: str | None, say) -> DiskCSR:
    degrees = np.zeros(n, dtype=np.int64)
    dtype = index_dtype(n)
    with open(path, "wb") as f:
        for b, keys in buckets.sorted_buckets():
            if say:
                say(f"sorting edges: bucket {b + 1} of {buckets.count}")
            if not len(keys):
                continue
            rows = keys // n
            lo = int(rows[0])
            degrees[lo : int(rows[-1]) + 1] += np.bincount(rows - lo)
            np.subtract(keys, rows * n, out=keys)  # keys become the columns, in place
            f.write(memoryview(keys.astype(dtype)).cast("B"))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degrees, out=indptr[1:])
    dups = buckets.added - int(indptr[-1])
    if name and (loops or dups):
        log.warning("%s: dropped %d self loops and %d duplicate edges (GCN normalisation adds one self loop per vertex)",
                    name, loops, dups)
    indices = np.memmap(path, dtype=dtype, mode="r") if indptr[-1] else np.zeros(0, dtype=dtype)
    return DiskCSR(indptr, indices)
