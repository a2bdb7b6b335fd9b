"""One graph server's arrays and its graph work: no sockets, no decisions (those are the scheduler's).

Layer ``l``: tensor tasks compute ``Z_l = dropout(P_l) W_l`` chunk by chunk; each finished chunk's
rows go to the peers that hold them as ghosts (positions in their ghost order, via the send lists);
Gather computes ``G_l = Â_k [Z_l | ghosts]`` with the partition's CSR. ``Z_l`` and its ghosts share
one buffer of ``n_local + n_ghost`` rows, so Gather reads it in place. The loss task turns the logits
``G_{L-1}`` into ``dG_{L-1}``; backward runs the path in reverse: each chunk's ``dG_l`` rows give the
peers their contribution ``Â[chunk, ghosts]ᵀ dG_l[chunk]`` to their vertices' gradients (the newest
contribution of every peer chunk is kept, in ``remote_parts``), and Gather backward is
``dZ_l = Âᵀ[local] dG_l`` plus those contributions. Backward tasks produce ``dG_{l-1}`` and ``dW_l``.

Memory: the partition's arrays stay memory-mapped from the store and are never copied.
``Â`` is held as ``Â_LL`` (local columns) and ``Â_LG`` (ghost columns) (``kernels/sparse.py``
:class:`BlockAdjacency`); each chunk's rows are views of them, ``Â_LL`` serves backward too when it is
symmetric (an undirected graph; else the store's ``Â_LLᵀ`` is mapped), and only ``Â_LGᵀ`` is built,
chunk by chunk, for the contributions: 8 bytes per edge plus 8-12 per cut edge in all. Features are read
and converted to float32 (and row-normalised) one chunk at a time, when a task pulls them. The
process gives freed chunk-sized buffers back to the OS (``dorylus_py/heap.py``).
"""

from __future__ import annotations

import numpy as np
import torch

from dorylus_py.data.graph import row_normalized
from dorylus_py.heap import return_freed_memory
from dorylus_py.kernels.sparse import BlockAdjacency, csr_nbytes
from dorylus_py.partition.layout import Partition
from dorylus_py.pipeline.events import TaskKey
from dorylus_py.protocol import ProtocolError, require


class GraphState:
    def __init__(self, part: Partition, dims: list[int], chunk_counts: list[int], feature_norm: str):
        """``chunk_counts``: how many chunks every graph server has (ours included)."""
        return_freed_memory()  # before the buffers: chunk-sized temporaries must not pile up in the heap
        self.part = part
        self.chunk_counts = chunk_counts
        self.n, self.g = part.num_local, part.num_ghosts
        self.dims = dims
        self.layers = len(dims) - 1
        self.peers = [p for p in range(part.num_parts) if p != part.index]
        self.feature_norm = feature_norm
        self.labels = np.asarray(part.labels)
        self.masks = np.stack([np.asarray(part.train_mask), np.asarray(part.val_mask), np.asarray(part.test_mask)])
        local_t = None if part.local_symmetric else (part.local_t_indptr, part.local_t_indices, part.local_t_weights)
        self.adj = BlockAdjacency.from_arrays((part.local_indptr, part.local_indices, part.local_weights),
                                              (part.ghost_indptr, part.ghost_indices, part.ghost_weights),
                                              local_t, self.n, self.g)
        self.bounds = np.linspace(0, self.n, chunk_counts[part.index] + 1).astype(np.int64)
        self.send_ids = [torch.from_numpy(np.array(part.sends_to(p))) for p in range(part.num_parts)]
        # ZG[train][l]: rows 0..n-1 are Z_l, rows n.. its ghosts; G[train][l]: gathered, (n, d_{l+1})
        self.ZG = {t: [np.zeros((self.n + self.g, d), np.float32) for d in dims[1:]] for t in (True, False)}
        self.G = {t: [np.zeros((self.n, d), np.float32) for d in dims[1:]] for t in (True, False)}
        self.dG = [np.zeros((self.n, d), np.float32) for d in dims[1:]]
        self.dZ = [np.zeros((self.n, d), np.float32) for d in dims[1:]]
        # (layer, peer, peer chunk) -> (our rows, int32; its newest contribution to them): added up only
        # when Gather backward needs them, so no (n, d) sum of them is kept beside dZ
        self.remote_parts: dict[tuple, tuple] = {}
        self._chunk_layouts()

    @property
    def edges(self) -> int:
        """In-edges held (both blocks, without the self loops)."""
        return int(len(self.part.local_indices) + len(self.part.ghost_indices)) - self.n

    @property
    def structure_bytes(self) -> int:
        """Bytes of graph structure for forward and backward Gather: the blocks, each chunk's new row
        pointers, and the chunks' ghost transposes."""
        chunks = sum(r.row_pointer_bytes() for r in self.rows_of) + csr_nbytes(*self.ghost_t)
        return self.adj.nbytes() + chunks

    @property
    def chunks(self) -> int:
        return len(self.bounds) - 1

    def chunk(self, c: int) -> tuple[int, int]:
        return int(self.bounds[c]), int(self.bounds[c + 1])

    def _chunk_layouts(self) -> None:
        """Per chunk: its rows of the blocks (views), ``Â[chunk, ghosts]ᵀ`` for the contributions to the
        ghosts' owners, and which of its rows each peer holds as ghosts."""
        part = self.part
        self.rows_of, self.ghost_t, self.touched, self.send_in_chunk = [], [], [], []
        for c in range(self.chunks):
            a, b = self.chunk(c)
            rows = self.adj.rows(a, b)
            self.rows_of.append(rows)
            touched, ghost_t = rows.ghost_transpose()  # the ghosts this chunk has edges from, grouped by owner
            self.ghost_t.append(ghost_t)  # (touched, b - a)
            cut = np.searchsorted(touched, np.asarray(part.ghost_offsets))
            self.touched.append({p: (cut[p], cut[p + 1], touched[cut[p] : cut[p + 1]].astype(np.int64)
                                     - part.ghost_offsets[p]) for p in self.peers})
            per_peer = {}
            for p in self.peers:
                ids = self.send_ids[p].numpy()
                pos = np.nonzero((ids >= a) & (ids < b))[0]
                per_peer[p] = (pos, ids[pos])
            self.send_in_chunk.append(per_peer)

    # --- graph work (on the graph thread; it touches rows no running task reads) -------------------

    def gather(self, train: bool, layer: int, chunk: int | None) -> None:
        """``G_l`` of the chunk's rows (all rows for None), written in place."""
        a, b = (0, self.n) if chunk is None else self.chunk(chunk)
        rows = self.adj if chunk is None else self.rows_of[chunk]
        rows.gather(torch.from_numpy(self.ZG[train][layer]), out=torch.from_numpy(self.G[train][layer][a:b]))

    def gather_backward(self, layer: int, chunk: int | None) -> None:
        """``dZ_l`` of the chunk's rows: our own chunks' ``dG_l`` through ``Âᵀ``, plus the peers' parts."""
        a, b = (0, self.n) if chunk is None else self.chunk(chunk)
        rows = self.adj if chunk is None else self.rows_of[chunk]
        dz = self.dZ[layer][a:b]
        rows.gather_t(torch.from_numpy(self.dG[layer]), out=torch.from_numpy(dz))
        # the peers' parts in a fixed order (the same bits every run), from a snapshot of the keys (the loop
        # thread may add parts meanwhile)
        for key in sorted(k for k in list(self.remote_parts) if k[0] == layer):
            local, contribution = self.remote_parts[key]
            inside = (local >= a) & (local < b)
            dz[local[inside] - a] += contribution[inside]  # a part never repeats a row

    # --- what goes to the peers --------------------------------------------------------------------

    def rows_for_peers(self, train: bool, layer: int, chunk: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Peer -> (positions in its ghost slice, rows): the chunk's fresh ``Z_l`` rows it holds."""
        z = self.ZG[train][layer]
        return {p: (pos, z[rows]) for p, (pos, rows) in self.send_in_chunk[chunk].items()}

    def contributions(self, layer: int, chunk: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Peer -> (positions in its send list to us, rows): ``Â[chunk, its ghosts]ᵀ dG_l[chunk]``."""
        if not self.peers:
            return {}
        a, b = self.chunk(chunk)
        contrib = torch.sparse.mm(self.ghost_t[chunk], torch.from_numpy(self.dG[layer][a:b])).numpy()
        return {p: (positions, contrib[lo:hi]) for p, (lo, hi, positions) in self.touched[chunk].items()}

    def store_peer_rows(self, phase: str, src: int, layer: int, src_chunk: int, positions: np.ndarray,
                        rows: np.ndarray) -> None:
        """Keep a peer's rows (checked first: nothing out of range is written)."""
        if (src not in self.peers or not 0 <= layer < self.layers or phase not in ("fwd", "efwd", "bwd")
                or not 0 <= src_chunk < self.chunk_counts[src]):
            raise ProtocolError(f"rows from {src} chunk {src_chunk} for layer {layer} phase {phase!r} are not expected")
        sl = self.part.ghosts_from(src)
        limit = len(self.send_ids[src]) if phase == "bwd" else sl.stop - sl.start
        if positions.dtype != np.int64 or positions.shape != (len(rows),):
            raise ProtocolError("ghost positions must be int64, one per row")
        if rows.ndim != 2 or rows.shape[1] != self.dims[layer + 1] or rows.dtype != np.float32:
            raise ProtocolError(f"ghost rows must be float32 of width {self.dims[layer + 1]}")
        if len(positions) and (positions.min() < 0 or positions.max() >= limit):
            raise ProtocolError(f"ghost positions out of range [0, {limit})")
        if phase != "bwd":
            self.ZG[phase == "fwd"][layer][self.n + sl.start + positions] = rows
            return
        if len(np.unique(positions)) != len(positions):
            raise ProtocolError("contribution positions repeat")
        # this peer chunk's newest contribution replaces its previous one
        self.remote_parts[(layer, src, src_chunk)] = (self.send_ids[src].numpy()[positions].astype(np.int32), np.array(rows))

    # --- tensor tasks ------------------------------------------------------------------------------

    def task_rows(self, key: TaskKey) -> dict[str, np.ndarray]:
        """What a task pulls: the chunk's rows of its inputs."""
        kind, train, _, layer, chunk = key
        a, b = self.chunk(chunk)
        p = (lambda: self.input_rows(a, b) if layer == 0 else self.G[train][layer - 1][a:b])
        if kind == "fwd":
            return {"P": p()}
        if kind == "bwd":
            return {"P": p(), "dZ": self.dZ[layer][a:b]}
        logits = self.G[train][self.layers - 1][a:b]
        if kind == "loss":
            return {"logits": logits, "labels": self.labels[a:b], "train": self.masks[0, a:b]}
        return {"logits": logits, "labels": self.labels[a:b], "masks": self.masks[:, a:b]}

    def input_rows(self, a: int, b: int) -> np.ndarray:
        """Feature rows ``a:b`` as float32, row-normalised if configured (``P_0`` of the chunk)."""
        x = self.part.feature_rows(a, b)
        return row_normalized(x) if self.feature_norm == "row" else x

    def check_result(self, key: TaskKey, msg) -> None:
        kind, _, _, layer, chunk = key
        a, b = self.chunk(chunk)
        if kind == "fwd":
            require(msg, "version", shapes={"Z": (b - a, self.dims[layer + 1])})
        elif kind == "bwd":
            require(msg, "version", shapes={"dW": (self.dims[layer], self.dims[layer + 1])})
            if layer > 0:
                require(msg, shapes={"dG": (b - a, self.dims[layer])})
        elif kind == "loss":
            require(msg, "loss_sum", shapes={"dG": (b - a, self.dims[-1])})
            if not isinstance(msg["loss_sum"], (int, float)) or not np.isfinite(msg["loss_sum"]):
                raise ProtocolError("loss result: 'loss_sum' must be a finite number")
        elif kind == "eval":
            require(msg, "correct")
            c = msg["correct"]
            if not (isinstance(c, list) and len(c) == 3 and all(isinstance(v, int) and 0 <= v <= self.n for v in c)):
                raise ProtocolError("eval result: 'correct' must be three counts")
        if kind in ("fwd", "bwd") and (not isinstance(msg["version"], int) or isinstance(msg["version"], bool)
                                       or not 0 <= msg["version"] < 2**53):
            raise ProtocolError(f"{kind} result: 'version' must be a non-negative integer")

    def apply_result(self, key: TaskKey, tensors: dict[str, np.ndarray]) -> None:
        kind, train, _, layer, chunk = key
        a, b = self.chunk(chunk)
        if kind == "fwd":
            self.ZG[train][layer][a:b] = tensors["Z"]
        elif kind == "bwd" and layer > 0:
            self.dG[layer - 1][a:b] = tensors["dG"]
        elif kind == "loss":
            self.dG[self.layers - 1][a:b] = tensors["dG"]

