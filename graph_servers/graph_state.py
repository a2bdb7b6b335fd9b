"""One graph server's arrays and its graph work: no sockets, no decisions (those are the scheduler's).

Layer ``l``: tensor tasks compute ``Z_l = dropout(P_l) W_l`` chunk by chunk; each finished chunk's
rows go to the peers that hold them as ghosts (positions in their ghost order, via the send lists);
Gather computes ``G_l = Â_k [Z_l | ghosts]`` with the partition's CSR. ``Z_l`` and its ghosts share
one buffer of ``n_local + n_ghost`` rows, so Gather reads it in place. The loss task turns the logits
``G_{L-1}`` into ``dG_{L-1}``; backward runs the path in reverse: each chunk's ``dG_l`` rows give the
peers their contribution ``Â[chunk, ghosts]ᵀ dG_l[chunk]`` to their vertices' gradients (the newest
contribution of every peer chunk is kept, in ``remote_dz``), and Gather backward is
``dZ_l = Âᵀ[local] dG_l + remote_dz_l``. Backward tasks produce ``dG_{l-1}`` and ``dW_l``.
"""

from __future__ import annotations

import numpy as np
import torch

from dorylus_py.data.graph import row_normalized
from dorylus_py.kernels.sparse import NormalizedAdjacency
from dorylus_py.partition.layout import Partition
from dorylus_py.pipeline.events import TaskKey
from dorylus_py.protocol import ProtocolError, require


def _csr(indptr, indices, weights, shape) -> torch.Tensor:
    return NormalizedAdjacency.from_csr(indptr, indices, weights, shape).matrix


class GraphState:
    def __init__(self, part: Partition, dims: list[int], chunk_counts: list[int], feature_norm: str):
        """``chunk_counts``: how many chunks every graph server has (ours included)."""
        self.part = part
        self.chunk_counts = chunk_counts
        self.n, self.g = part.num_local, part.num_ghosts
        self.dims = dims
        self.layers = len(dims) - 1
        self.peers = [p for p in range(part.num_parts) if p != part.index]
        x = np.asarray(part.features)
        self.x = np.ascontiguousarray(row_normalized(x) if feature_norm == "row" else x, dtype=np.float32)
        self.labels = np.asarray(part.labels)
        self.masks = np.stack([np.asarray(part.train_mask), np.asarray(part.val_mask), np.asarray(part.test_mask)])
        self.adj = NormalizedAdjacency.from_csr(part.indptr, part.indices, part.weights, (self.n, self.n + self.g))
        self.bounds = np.linspace(0, self.n, chunk_counts[part.index] + 1).astype(np.int64)
        self.send_ids = [torch.from_numpy(np.array(part.sends_to(p))) for p in range(part.num_parts)]
        # ZG[train][l]: rows 0..n-1 are Z_l, rows n.. its ghosts; G[train][l]: gathered, (n, d_{l+1})
        self.ZG = {t: [np.zeros((self.n + self.g, d), np.float32) for d in dims[1:]] for t in (True, False)}
        self.G = {t: [np.zeros((self.n, d), np.float32) for d in dims[1:]] for t in (True, False)}
        self.dG = [np.zeros((self.n, d), np.float32) for d in dims[1:]]
        self.dZ = [np.zeros((self.n, d), np.float32) for d in dims[1:]]
        self.remote_dz = [np.zeros((self.n, d), np.float32) for d in dims[1:]]
        self.remote_parts: dict[tuple, tuple] = {}  # (layer, peer, peer chunk) -> (our rows, its last contribution)
        self._chunk_layouts()

    @property
    def chunks(self) -> int:
        return len(self.bounds) - 1

    def chunk(self, c: int) -> tuple[int, int]:
        return int(self.bounds[c]), int(self.bounds[c + 1])

    def _chunk_layouts(self) -> None:
        """Per chunk: its rows of Â, its rows of Âᵀ over local vertices, and ``Â[chunk, ghosts]ᵀ`` for
        the contributions to the ghosts' owners; which of its rows each peer holds as ghosts."""
        part = self.part
        ip, ix, w = np.asarray(part.indptr), np.asarray(part.indices), np.asarray(part.weights)
        tp = self.adj.transpose  # (n + g, n): its first n rows are Âᵀ restricted to local vertices
        t_ptr, t_ix, t_w = tp.crow_indices().numpy(), tp.col_indices().numpy(), tp.values().numpy()
        self.rows_of, self.local_t, self.ghost_t, self.touched, self.send_in_chunk = [], [], [], [], []
        for c in range(self.chunks):
            a, b = self.chunk(c)
            lo, hi = ip[a], ip[b]
            self.rows_of.append(_csr(ip[a : b + 1] - lo, ix[lo:hi], w[lo:hi], (b - a, self.n + self.g)))
            self.local_t.append(_csr(t_ptr[a : b + 1] - t_ptr[a], t_ix[t_ptr[a] : t_ptr[b]], t_w[t_ptr[a] : t_ptr[b]],
                                     (b - a, self.n)))
            ghost = ix[lo:hi] >= self.n
            r = np.repeat(np.arange(b - a), np.diff(ip[a : b + 1]))[ghost]
            gcols = ix[lo:hi][ghost] - self.n
            touched = np.unique(gcols)  # the ghosts this chunk has edges from, sorted (so grouped by owner)
            gm = _csr(np.concatenate([[0], np.cumsum(np.bincount(r, minlength=b - a))]), np.searchsorted(touched, gcols),
                      w[lo:hi][ghost], (b - a, len(touched)))
            self.ghost_t.append(gm.t().to_sparse_csr())  # (touched, b - a)
            cut = np.searchsorted(touched, np.asarray(part.ghost_offsets))
            self.touched.append({p: (cut[p], cut[p + 1], touched[cut[p] : cut[p + 1]] - part.ghost_offsets[p])
                                 for p in self.peers})
            per_peer = {}
            for p in self.peers:
                ids = self.send_ids[p].numpy()
                pos = np.nonzero((ids >= a) & (ids < b))[0]
                per_peer[p] = (pos, ids[pos])
            self.send_in_chunk.append(per_peer)

    # --- graph work (on the graph thread; it touches rows no running task reads) -------------------

    def gather(self, train: bool, layer: int, chunk: int | None) -> None:
        zg = torch.from_numpy(self.ZG[train][layer])
        if chunk is None:
            self.G[train][layer][:] = torch.sparse.mm(self.adj.matrix, zg).numpy()
        else:
            a, b = self.chunk(chunk)
            self.G[train][layer][a:b] = torch.sparse.mm(self.rows_of[chunk], zg).numpy()

    def gather_backward(self, layer: int, chunk: int | None) -> None:
        """``dZ_l`` of the chunk's rows: our own chunks' ``dG_l`` through ``Âᵀ``, plus the peers' parts."""
        dg = torch.from_numpy(self.dG[layer])
        if chunk is None:
            self.dZ[layer][:] = torch.sparse.mm(self.adj.transpose, dg)[: self.n].numpy() + self.remote_dz[layer]
        else:
            a, b = self.chunk(chunk)
            self.dZ[layer][a:b] = torch.sparse.mm(self.local_t[chunk], dg).numpy() + self.remote_dz[layer][a:b]

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
        key, local = (layer, src, src_chunk), self.send_ids[src].numpy()[positions]
        old = self.remote_parts.get(key)
        if old is not None:
            self.remote_dz[layer][old[0]] -= old[1]
        self.remote_dz[layer][local] += rows
        self.remote_parts[key] = (local, np.array(rows))

    # --- tensor tasks ------------------------------------------------------------------------------

    def task_rows(self, key: TaskKey) -> dict[str, np.ndarray]:
        """What a task pulls: the chunk's rows of its inputs."""
        kind, train, _, layer, chunk = key
        a, b = self.chunk(chunk)
        p = (lambda: self.x[a:b] if layer == 0 else self.G[train][layer - 1][a:b])
        if kind == "fwd":
            return {"P": p()}
        if kind == "bwd":
            return {"P": p(), "dZ": self.dZ[layer][a:b]}
        logits = self.G[train][self.layers - 1][a:b]
        if kind == "loss":
            return {"logits": logits, "labels": self.labels[a:b], "train": self.masks[0, a:b]}
        return {"logits": logits, "labels": self.labels[a:b], "masks": self.masks[:, a:b]}

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
