"""The per-partition layout a graph server works on.

Partition ``k`` owns the vertices ``global_ids`` (sorted); local row ``i`` is vertex ``global_ids[i]``.
Its Gather matrix is the rows of ``Â`` for those vertices, an in-edge CSR over the columns
``[local | ghost]``: column ``j < n_local`` is local row ``j``; column ``n_local + g`` is ghost ``g``.
Ghosts (remote in-neighbours) are sorted by owner, then by global id, so ghosts owned by peer ``p``
occupy the contiguous slice ``ghost_offsets[p]:ghost_offsets[p+1]``. The send list for peer ``p``
(``send_ids[send_offsets[p]:send_offsets[p+1]]``) names the local rows ``p`` needs, in the order of
``p``'s ghost slice for ``k``: rows sent in that order land in place, with no index exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dorylus_py.data.graph import Graph
from dorylus_py.kernels.sparse import gcn_norm_weights


@dataclass(frozen=True, eq=False)
class Partition:
    index: int  # k
    num_parts: int  # K
    global_ids: np.ndarray  # (n_local,) int64, sorted
    indptr: np.ndarray  # (n_local + 1,) int64, CSR rows of Â for the local vertices
    indices: np.ndarray  # (nnz,) int64, columns in [0, n_local + n_ghost)
    weights: np.ndarray  # (nnz,) float32, entries of Â
    ghost_ids: np.ndarray  # (n_ghost,) int64, global ids, grouped by owner
    ghost_offsets: np.ndarray  # (K + 1,) int64, ghost slice per owner
    send_ids: np.ndarray  # (n_send,) int64, local rows to send, grouped by peer
    send_offsets: np.ndarray  # (K + 1,) int64, send slice per peer
    features: np.ndarray  # (n_local, F) float32
    labels: np.ndarray  # (n_local,) int64
    train_mask: np.ndarray  # (n_local,) bool
    val_mask: np.ndarray  # (n_local,) bool
    test_mask: np.ndarray  # (n_local,) bool

    ARRAYS = (
        "global_ids", "indptr", "indices", "weights", "ghost_ids", "ghost_offsets", "send_ids",
        "send_offsets", "features", "labels", "train_mask", "val_mask", "test_mask",
    )  # fmt: skip

    @property
    def num_local(self) -> int:
        return len(self.global_ids)

    @property
    def num_ghosts(self) -> int:
        return len(self.ghost_ids)

    def ghosts_from(self, peer: int) -> slice:
        return slice(int(self.ghost_offsets[peer]), int(self.ghost_offsets[peer + 1]))

    def sends_to(self, peer: int) -> np.ndarray:
        return self.send_ids[self.send_offsets[peer] : self.send_offsets[peer + 1]]


def build_partitions(graph: Graph, owner: np.ndarray) -> list[Partition]:
    """Split ``graph`` by ``owner`` into :class:`Partition` layouts, with ``Â`` weights from the whole graph."""
    n, k_parts = graph.num_nodes, int(owner.max()) + 1
    a_indptr, a_indices, a_weights = gcn_norm_weights(graph.indptr, graph.indices)
    local_index = np.empty(n, dtype=np.int64)
    members = [np.nonzero(owner == k)[0] for k in range(k_parts)]
    for ids in members:
        local_index[ids] = np.arange(len(ids))

    partial = []
    for k, gids in enumerate(members):
        pos = _row_positions(a_indptr, gids)
        cols = a_indices[pos]
        lens = a_indptr[gids + 1] - a_indptr[gids]
        remote = owner[cols] != k
        ghost_keys = np.unique(owner[cols[remote]] * n + cols[remote])  # sorted by (owner, gid)
        new_cols = local_index[cols]
        new_cols[remote] = len(gids) + np.searchsorted(ghost_keys, owner[cols[remote]] * n + cols[remote])
        rows = np.repeat(np.arange(len(gids), dtype=np.int64), lens)
        order = np.lexsort((new_cols, rows))
        ghost_owner = ghost_keys // n
        partial.append(
            dict(
                index=k,
                num_parts=k_parts,
                global_ids=gids,
                indptr=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                indices=new_cols[order],
                weights=a_weights[pos][order],
                ghost_ids=ghost_keys - ghost_owner * n,
                ghost_offsets=np.searchsorted(ghost_owner, np.arange(k_parts + 1)).astype(np.int64),
                features=graph.features[gids],
                labels=graph.labels[gids],
                train_mask=graph.train_mask[gids],
                val_mask=graph.val_mask[gids],
                test_mask=graph.test_mask[gids],
            )
        )
    for k, part in enumerate(partial):
        wanted = [partial[p]["ghost_ids"][partial[p]["ghost_offsets"][k] : partial[p]["ghost_offsets"][k + 1]] for p in range(k_parts)]
        part["send_ids"] = local_index[np.concatenate(wanted)] if wanted else np.zeros(0, np.int64)
        part["send_offsets"] = np.concatenate([[0], np.cumsum([len(w) for w in wanted])]).astype(np.int64)
    return [Partition(**p) for p in partial]


def edge_cut(graph: Graph, owner: np.ndarray) -> int:
    """Directed edges whose ends lie in different partitions."""
    src, dst = graph.edges()
    return int((owner[src] != owner[dst]).sum())


def _row_positions(indptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Positions in the CSR arrays of all entries of ``rows``, row by row (vectorised ranges)."""
    starts, lens = indptr[rows], indptr[rows + 1] - indptr[rows]
    total = int(lens.sum())
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
    return offsets + np.arange(total, dtype=np.int64)
