"""The per-partition layout a graph server works on (store format version 2).

Partition ``k`` owns the vertices ``global_ids`` (sorted); local row ``i`` is vertex ``global_ids[i]``.
Its rows of ``Â`` are kept as two CSR blocks, so that backward needs no second full copy:

- ``local_*``: ``Â_LL`` (n_local x n_local), the in-edges from owned vertices, self loop included;
- ``ghost_*``: ``Â_LG`` (n_local x n_ghost), the in-edges from ghosts (remote in-neighbours);
- ``local_t_*``: ``Â_LLᵀ``, stored only when ``Â_LL`` is not symmetric (a directed graph); on an
  undirected graph ``Â_LL`` serves both directions.

Forward Gather is ``Â_LL Z + Â_LG Z_ghost``; backward is ``Â_LLᵀ dG`` for the local rows and
``Â_LGᵀ dG`` for the ghosts' owners, the latter built by the graph server chunk by chunk (its chunks
are a training setting). So an undirected graph's structure costs 8 bytes per edge plus 8 per cut
edge, not 16 per edge. Indices are int32 wherever the counts allow, weights float32.
Ghosts are sorted by owner, then by global id, so ghosts owned by peer ``p`` occupy the contiguous
slice ``ghost_offsets[p]:ghost_offsets[p+1]``. The send list for peer ``p``
(``send_ids[send_offsets[p]:send_offsets[p+1]]``) names the local rows ``p`` needs, in the order of
``p``'s ghost slice for ``k``: rows sent in that order land in place, with no index exchange.
Features may be stored as float16 or bfloat16 (``FEATURE_DTYPES``); :meth:`Partition.feature_rows`
always returns float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FEATURE_DTYPES = ("float32", "float16", "bfloat16")  # bfloat16 is stored as its uint16 bit pattern


@dataclass(frozen=True, eq=False)
class Partition:
    index: int  # k
    num_parts: int  # K
    global_ids: np.ndarray  # (n_local,) int64, sorted
    local_indptr: np.ndarray  # (n_local + 1,) int32/int64: Â_LL rows
    local_indices: np.ndarray  # (nnz_local,) local columns in [0, n_local)
    local_weights: np.ndarray  # (nnz_local,) float32
    ghost_indptr: np.ndarray  # (n_local + 1,): Â_LG rows
    ghost_indices: np.ndarray  # (nnz_ghost,) ghost columns in [0, n_ghost)
    ghost_weights: np.ndarray  # (nnz_ghost,) float32
    local_t_indptr: np.ndarray  # (n_local + 1,) or (0,) when Â_LL is symmetric
    local_t_indices: np.ndarray  # (nnz_local,) or (0,)
    local_t_weights: np.ndarray  # (nnz_local,) or (0,)
    ghost_ids: np.ndarray  # (n_ghost,) int64, global ids, grouped by owner
    ghost_offsets: np.ndarray  # (K + 1,) int64, ghost slice per owner
    send_ids: np.ndarray  # (n_send,) int64, local rows to send, grouped by peer
    send_offsets: np.ndarray  # (K + 1,) int64, send slice per peer
    features: np.ndarray  # (n_local, F) float32, float16, or uint16 (bfloat16 bits)
    labels: np.ndarray  # (n_local,) int64
    train_mask: np.ndarray  # (n_local,) bool
    val_mask: np.ndarray  # (n_local,) bool
    test_mask: np.ndarray  # (n_local,) bool
    feature_dtype: str = "float32"  # how `features` is stored (FEATURE_DTYPES)

    ARRAYS = (
        "global_ids", "local_indptr", "local_indices", "local_weights", "ghost_indptr", "ghost_indices",
        "ghost_weights", "local_t_indptr", "local_t_indices", "local_t_weights", "ghost_ids", "ghost_offsets",
        "send_ids", "send_offsets",
        "features", "labels", "train_mask", "val_mask", "test_mask",
    )  # fmt: skip
    STRUCTURE = tuple(a for a in ARRAYS if a.startswith(("local_", "ghost_")) and a not in ("ghost_ids", "ghost_offsets"))

    @property
    def num_local(self) -> int:
        return len(self.global_ids)

    @property
    def num_ghosts(self) -> int:
        return len(self.ghost_ids)

    @property
    def local_symmetric(self) -> bool:
        """``Â_LL`` is its own transpose (no ``local_t_*`` stored)."""
        return len(self.local_t_indptr) == 0

    def ghosts_from(self, peer: int) -> slice:
        return slice(int(self.ghost_offsets[peer]), int(self.ghost_offsets[peer + 1]))

    def sends_to(self, peer: int) -> np.ndarray:
        return self.send_ids[self.send_offsets[peer] : self.send_offsets[peer + 1]]

    def structure_bytes(self) -> int:
        """Bytes of graph structure as stored (a server adds ``Â_LGᵀ``: 8 bytes per cut edge)."""
        return sum(int(getattr(self, a).nbytes) for a in self.STRUCTURE)

    def feature_rows(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Feature rows ``start:stop`` as float32 (a copy only when stored narrower)."""
        return decode_features(self.features[start:stop], self.feature_dtype)

    def combined_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(indptr, indices, weights)`` of ``Â`` over the columns ``[local | ghost]`` (int64; a copy,
        for tests and for reassembling a graph, not for servers)."""
        lp, gp = np.asarray(self.local_indptr, np.int64), np.asarray(self.ghost_indptr, np.int64)
        rows = np.concatenate([np.repeat(np.arange(self.num_local), np.diff(lp)),
                               np.repeat(np.arange(self.num_local), np.diff(gp))])
        cols = np.concatenate([np.asarray(self.local_indices, np.int64),
                               self.num_local + np.asarray(self.ghost_indices, np.int64)])
        weights = np.concatenate([np.asarray(self.local_weights), np.asarray(self.ghost_weights)])
        order = np.argsort(rows, kind="stable")
        return lp + gp, cols[order], weights[order]


def encode_features(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 rows in the storage ``dtype`` (bfloat16: round to nearest even, kept as uint16 bits)."""
    if dtype == "float32":
        return np.asarray(x, dtype=np.float32)
    if dtype == "float16":
        return np.asarray(x, dtype=np.float16)
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def decode_features(stored: np.ndarray, dtype: str) -> np.ndarray:
    """Stored feature rows as float32."""
    if dtype == "bfloat16":
        return (np.asarray(stored, dtype=np.uint32) << 16).view(np.float32)
    return np.asarray(stored, dtype=np.float32)


def storage_dtype(dtype: str):
    return {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[dtype]
