"""One graph server's arrays and its graph work: no sockets, no decisions (those are the scheduler's).

Every model's layer is ``G_l = A_l Z_l [+ S_l]`` (``models/spec.py``): tensor tasks compute ``Z_l``
(and the self term ``S_l``) chunk by chunk; each finished chunk's ``Z_l`` rows go to the peers that
hold them as ghosts (positions in their ghost order, via the send lists); Gather multiplies by the
partition's rows of ``A_l``, a CSR over ``[local | ghost]`` columns whose values are fixed (GCN:
``Â``; GraphSAGE: the mean ``D⁻¹A``, 0 on the self loop) or come per head from ApplyEdge tasks
(GAT: ``α̃``, ``(H, E)``). ``Z_l`` and its ghosts share one buffer of ``n_local + n_ghost`` rows,
so Gather reads it in place. The loss task turns the logits ``G_{L-1}`` into ``dG_{L-1}``;
backward runs the path in reverse: each chunk's ``dG_l`` rows give the peers their contribution
``A[chunk, ghosts]ᵀ dG_l[chunk]`` to their vertices' gradients (the newest contribution of every
peer chunk is kept), and Gather backward is ``dZ_l = Aᵀ[local] dG_l + remote``. GAT adds, per layer,
the source and destination scores (``(n, H)``), the per-edge ``α̃``, ``dα̃`` and ``ds`` (each
``(H, E)``: nothing per edge is wider than the head count), the SDDMM ``dα̃ = <dG_v, Z_u>``
(``attn_grad``), and the sources' score gradients ``Σ_v ds_uv`` with the peers' parts (``ebwd``).
"""

from __future__ import annotations

import numpy as np
import torch

from dorylus_py.data.graph import row_normalized
from dorylus_py.kernels.heads import EdgeCSR, edge_value_grad, gather_heads, gather_heads_backward, row_sums
from dorylus_py.kernels.sparse import mean_weights
from dorylus_py.models.spec import ModelSpec
from dorylus_py.partition.layout import Partition
from dorylus_py.pipeline.events import TaskKey
from dorylus_py.protocol import ProtocolError


def _zeros(*shape) -> np.ndarray:
    return np.zeros(shape, np.float32)


class GraphState:
    def __init__(self, part: Partition, model: ModelSpec, chunk_counts: list[int], feature_norm: str, edge_offset: int = 0):
        """``chunk_counts``: how many chunks every graph server has (ours included); ``edge_offset``:
        the id of this partition's first edge (edges are numbered across partitions, for dropout keys)."""
        self.part, self.model, self.chunk_counts, self.edge_offset = part, model, chunk_counts, edge_offset
        self.n, self.g = n, g = part.num_local, part.num_ghosts
        self.shapes = model.layers
        self.layers = model.num_layers
        self.attention = model.aggregation == "attention"
        self.peers = [p for p in range(part.num_parts) if p != part.index]
        x = np.asarray(part.features)
        self.x = np.ascontiguousarray(row_normalized(x) if feature_norm == "row" else x, dtype=np.float32)
        self.labels = np.asarray(part.labels)
        self.masks = np.stack([np.asarray(part.train_mask), np.asarray(part.val_mask), np.asarray(part.test_mask)])
        self.indptr = np.asarray(part.indptr)
        self.bounds = np.linspace(0, n, chunk_counts[part.index] + 1).astype(np.int64)
        self.send_ids = [torch.from_numpy(np.array(part.sends_to(p))) for p in range(part.num_parts)]
        self.fixed = None  # (1, E) values of A for GCN and GraphSAGE; GAT's come from the tasks
        if not self.attention:
            w = part.weights if model.aggregation == "gcn" else mean_weights(self.indptr, part.indices)
            self.fixed = torch.from_numpy(np.array(w, dtype=np.float32)).reshape(1, -1)
        self._layouts()
        shapes, nnz, hmax = self.shapes, len(part.indices), max(s.heads for s in self.shapes)
        # ZG[train][l]: rows 0..n-1 are Z_l, rows n.. its ghosts; G[train][l]: the layer's output
        self.ZG = {t: [_zeros(n + g, s.z_width) for s in shapes] for t in (True, False)}
        self.G = {t: [_zeros(n, s.out_width) for s in shapes] for t in (True, False)}
        self.S = {t: [_zeros(n, s.out_width) for s in shapes] for t in (True, False)} if model.self_term else None
        self.dG = [_zeros(n, s.out_width) for s in shapes]
        self.dZ = [_zeros(n, s.z_width) for s in shapes]
        self.remote = {"bwd": [_zeros(n, s.z_width) for s in shapes]}  # the peers' parts of dZ (and of dsrc)
        self.remote_parts: dict[tuple, tuple] = {}  # (phase, layer, peer, peer chunk) -> (our rows, its last part)
        if self.attention:
            self.SG = {t: [_zeros(n + g, s.heads) for s in shapes] for t in (True, False)}  # source scores, with ghosts
            self.SD = {t: [_zeros(n, s.heads) for s in shapes] for t in (True, False)}  # destination scores
            shared = _zeros(hmax, nnz)  # the evaluation forward's α̃: read only by the chunk that wrote it
            self.alpha = {True: [_zeros(s.heads, nnz) for s in shapes], False: [shared[: s.heads] for s in shapes]}
            self.dalpha = _zeros(hmax, nnz)  # dα̃ of one layer at a time, per chunk: attn_grad -> edge_bwd
            self.ds = [_zeros(s.heads, nnz) for s in shapes]
            self.dsrc = [_zeros(n, s.heads) for s in shapes]
            self.ddst = [_zeros(n, s.heads) for s in shapes]
            self.remote["ebwd"] = [_zeros(n, s.heads) for s in shapes]

    @property
    def chunks(self) -> int:
        return len(self.bounds) - 1

    def chunk(self, c: int) -> tuple[int, int]:
        return int(self.bounds[c]), int(self.bounds[c + 1])

    def edges_of(self, c: int) -> tuple[int, int]:
        """The chunk's in-edges: positions ``lo..hi`` of the partition's CSR (and of per-edge arrays)."""
        a, b = self.chunk(c)
        return int(self.indptr[a]), int(self.indptr[b])

    def _fix(self, m: EdgeCSR) -> EdgeCSR:
        return m if self.fixed is None else m.fix(self.fixed)

    def _layouts(self) -> None:
        """``A`` and ``Aᵀ`` over local vertices, and per chunk: its rows of ``A``, its rows of ``Aᵀ``, and
        ``A[chunk, ghosts]ᵀ`` for the contributions to the ghosts' owners; which of its rows each peer
        holds as ghosts."""
        part, n = self.part, self.n
        ip, ix = self.indptr, np.asarray(part.indices)
        adj = EdgeCSR.from_csr(ip, ix, n + self.g)
        adj_t = adj.transpose().rows(0, n)  # (n, n): Aᵀ restricted to local sources
        self.adj, self.adj_t = self._fix(adj), self._fix(adj_t)
        self.rows_of, self.local_t, self.ghost_t, self.touched, self.send_in_chunk = [], [], [], [], []
        for c in range(self.chunks):
            a, b = self.chunk(c)
            lo, hi = ip[a], ip[b]
            self.rows_of.append(self._fix(adj.rows(a, b)))
            self.local_t.append(self._fix(adj_t.rows(a, b)))
            ghost = ix[lo:hi] >= n
            r = np.repeat(np.arange(b - a), np.diff(ip[a : b + 1]))[ghost]
            gcols = ix[lo:hi][ghost] - n
            touched = np.unique(gcols)  # the ghosts this chunk has edges from, sorted (so grouped by owner)
            tcol = np.searchsorted(touched, gcols)
            order = np.argsort(tcol, kind="stable")
            crow = np.concatenate([[0], np.cumsum(np.bincount(tcol, minlength=len(touched)))])
            edges = np.arange(lo, hi)[ghost][order]
            self.ghost_t.append(self._fix(EdgeCSR(torch.from_numpy(crow), torch.from_numpy(r[order]),
                                                  (len(touched), b - a), torch.from_numpy(edges))))
            cut = np.searchsorted(touched, np.asarray(part.ghost_offsets))
            self.touched.append({p: (cut[p], cut[p + 1], touched[cut[p] : cut[p + 1]] - part.ghost_offsets[p])
                                 for p in self.peers})
            per_peer = {}
            for p in self.peers:
                ids = self.send_ids[p].numpy()
                pos = np.nonzero((ids >= a) & (ids < b))[0]
                per_peer[p] = (pos, ids[pos])
            self.send_in_chunk.append(per_peer)

    def _values(self, train: bool, layer: int) -> torch.Tensor | None:
        return None if self.fixed is not None else torch.from_numpy(self.alpha[train][layer])

    # --- graph work (on the graph thread; it touches rows no running task reads) -------------------

    def run_graph(self, stage: str, layer: int, chunk: int | None) -> None:
        """The graph stage ``stage`` of layer ``layer`` for one chunk's rows, or all rows (``chunk`` None)."""
        if stage in ("gather", "egather"):
            self.gather(stage == "gather", layer, chunk)
        elif stage == "gather_bwd":
            self.gather_backward(layer, chunk)
        elif stage == "attn_grad":
            self.attention_grad(layer, chunk)
        else:
            raise ValueError(f"unknown graph stage {stage!r}")

    def _rows(self, chunk: int | None) -> tuple[int, int]:
        return (0, self.n) if chunk is None else self.chunk(chunk)

    def gather(self, train: bool, layer: int, chunk: int | None) -> None:
        s, (a, b) = self.shapes[layer], self._rows(chunk)
        m = self.adj if chunk is None else self.rows_of[chunk]
        out = gather_heads(m, self._values(train, layer), torch.from_numpy(self.ZG[train][layer]), s.heads, s.concat)
        self.G[train][layer][a:b] = out.numpy() + self.S[train][layer][a:b] if self.S else out.numpy()

    def gather_backward(self, layer: int, chunk: int | None) -> None:
        """``dZ_l`` of the chunk's rows: our own chunks' ``dG_l`` through ``Aᵀ``, plus the peers' parts
        (GAT: also the sources' score gradients, from our edges' ``ds`` and the peers' parts)."""
        s, (a, b) = self.shapes[layer], self._rows(chunk)
        m = self.adj_t if chunk is None else self.local_t[chunk]
        if chunk is None:  # sync: the peers' parts summed afresh in a fixed order (the same bits every run)
            for phase in self.remote:
                self._sum_remote(phase, layer)
        dz = gather_heads_backward(m, self._values(True, layer), torch.from_numpy(self.dG[layer]), s.heads, s.concat)
        self.dZ[layer][a:b] = dz.numpy() + self.remote["bwd"][layer][a:b]
        if self.attention:
            self.dsrc[layer][a:b] = row_sums(m, torch.from_numpy(self.ds[layer])).numpy() + self.remote["ebwd"][layer][a:b]

    def attention_grad(self, layer: int, chunk: int | None) -> None:
        """GAT: ``dα̃`` of the chunk's in-edges, ``<dG_l[v], Z_l[u]>`` per head (an SDDMM)."""
        s, (a, b) = self.shapes[layer], self._rows(chunk)
        m = self.adj if chunk is None else self.rows_of[chunk]
        lo, hi = int(self.indptr[a]), int(self.indptr[b])
        d = edge_value_grad(m, torch.from_numpy(self.dG[layer][a:b]), torch.from_numpy(self.ZG[True][layer]), s.heads,
                            s.concat)
        self.dalpha[: s.heads, lo:hi] = d.numpy()

    def _sum_remote(self, phase: str, layer: int) -> None:
        remote = self.remote[phase][layer]
        remote[:] = 0
        for key in sorted(k for k in self.remote_parts if k[:2] == (phase, layer)):
            rows, part = self.remote_parts[key]
            remote[rows] += part

    # --- what goes to the peers --------------------------------------------------------------------

    def rows_for_peers(self, train: bool, layer: int, chunk: int) -> dict[int, tuple[np.ndarray, dict]]:
        """Peer -> (positions in its ghost slice, tensors): the chunk's fresh ``Z_l`` rows it holds (GAT:
        and their source scores)."""
        z = self.ZG[train][layer]
        out = {}
        for p, (pos, rows) in self.send_in_chunk[chunk].items():
            out[p] = (pos, {"rows": z[rows]} | ({"scores": self.SG[train][layer][rows]} if self.attention else {}))
        return out

    def contributions(self, phase: str, layer: int, chunk: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Peer -> (positions in its send list to us, rows): ``bwd``: ``A[chunk, its ghosts]ᵀ dG_l[chunk]``;
        ``ebwd`` (GAT): per head, the sum of ``ds`` over the chunk's edges from each of its vertices."""
        if not self.peers:
            return {}
        s, (a, b), m = self.shapes[layer], self.chunk(chunk), self.ghost_t[chunk]
        if phase == "bwd":
            contrib = gather_heads_backward(m, self._values(True, layer), torch.from_numpy(self.dG[layer][a:b]), s.heads,
                                            s.concat).numpy()
        else:
            contrib = row_sums(m, torch.from_numpy(self.ds[layer])).numpy()
        return {p: (positions, contrib[lo:hi]) for p, (lo, hi, positions) in self.touched[chunk].items()}

    def store_peer_rows(self, phase: str, src: int, layer: int, src_chunk: int, tensors: dict[str, np.ndarray]) -> None:
        """Keep a peer's rows (checked first: nothing out of range is written)."""
        if (src not in self.peers or not 0 <= layer < self.layers or phase not in ("fwd", "efwd", *self.remote)
                or not 0 <= src_chunk < self.chunk_counts[src]):
            raise ProtocolError(f"rows from {src} chunk {src_chunk} for layer {layer} phase {phase!r} are not expected")
        s = self.shapes[layer]
        positions, rows = tensors.get("positions"), tensors.get("rows")
        sl = self.part.ghosts_from(src)
        backward = phase in self.remote
        limit = len(self.send_ids[src]) if backward else sl.stop - sl.start
        if positions is None or positions.dtype != np.int64 or positions.ndim != 1:
            raise ProtocolError("ghost positions must be int64, one per row")
        named = {"rows": s.heads if phase == "ebwd" else s.z_width} | ({"scores": s.heads} if self.attention and not backward else {})
        for name, width in named.items():
            t = tensors.get(name)
            if t is None or t.dtype != np.float32 or t.shape != (len(positions), width):
                raise ProtocolError(f"ghost {name} must be float32, {len(positions)} x {width}")
        if len(positions) and (positions.min() < 0 or positions.max() >= limit):
            raise ProtocolError(f"ghost positions out of range [0, {limit})")
        if not backward:
            train, at = phase == "fwd", self.n + sl.start + positions
            self.ZG[train][layer][at] = rows
            if self.attention:
                self.SG[train][layer][at] = tensors["scores"]
            return
        if len(np.unique(positions)) != len(positions):
            raise ProtocolError("contribution positions repeat")
        # this peer chunk's newest contribution replaces its previous one
        key, local = (phase, layer, src, src_chunk), self.send_ids[src].numpy()[positions]
        old = self.remote_parts.get(key)
        target = self.remote[phase][layer]
        if old is not None:
            target[old[0]] -= old[1]
        target[local] += rows
        self.remote_parts[key] = (local, np.array(rows))
