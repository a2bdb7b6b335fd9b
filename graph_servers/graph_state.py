"""One graph server's arrays, their layout and how the graph work uses them: no sockets, no decisions
(those are the scheduler's). The graph stages are ``gather.py``'s, the peer exchange ``ghost_exchange.py``'s.

Every model's layer is ``G_l = A_l Z_l [+ S_l]`` (``models/spec.py``): tensor tasks compute ``Z_l``
(and the self term ``S_l``) chunk by chunk; each finished chunk's ``Z_l`` rows go to the peers that
hold them as ghosts (positions in their ghost order, via the send lists); Gather multiplies by the
partition's rows of ``A_l``, whose values are fixed (GCN: ``Â``; GraphSAGE: the mean ``D⁻¹A``, 0 on
the self loop) or come per head from ApplyEdge tasks (GAT: ``α̃``, ``(H, E)``). ``Z_l`` and its
ghosts share one buffer of ``n_local + n_ghost`` rows, so Gather reads it in place. The loss task
turns the logits ``G_{L-1}`` into ``dG_{L-1}``; backward runs the path in reverse: each chunk's
``dG_l`` rows give the peers their contribution ``A[chunk, ghosts]ᵀ dG_l[chunk]`` to their vertices'
gradients (``received``: summed as they come in sync mode, the newest of every peer chunk kept in
async mode; ``graph_servers/received.py``), and Gather backward is ``dZ_l = Aᵀ[local] dG_l`` plus
those contributions. GAT adds, per layer, the source and
destination scores (``(n, H)``), the per-edge ``α̃``, ``dα̃`` and ``ds`` (each ``(H, E)``), the
SDDMM ``dα̃ = <dG_v, Z_u>`` (``attn_grad``), and the sources' score gradients ``Σ_v ds_uv`` with
the peers' parts (``ebwd``).

Memory: the partition's arrays stay memory-mapped from the store and are never copied. ``A`` is held
in the store's blocks, ``A_LL`` (local columns) and ``A_LG`` (ghost columns); each chunk's rows are
views of them. Fixed values (:class:`~dorylus_py.kernels.sparse.BlockAdjacency`): ``Â_LL`` serves
backward too when it is symmetric (an undirected graph; else the store's ``Â_LLᵀ`` is mapped;
GraphSAGE's mean shares the pattern with values of its own), and only ``A_LGᵀ`` is built, chunk by
chunk, for the contributions: for GCN, 8 bytes per edge plus 8-12 per cut edge. Per-edge values
(:class:`~dorylus_py.kernels.heads.HeadBlocks`): edges are numbered block-wise (the local block's in
CSR order, then the ghost block's), so a chunk's edges are two runs of the per-edge arrays; ``A_LLᵀ``
is built with a map to its edges (int32 columns and edge ids: 8 bytes per local entry). Features are
converted to float32 (and row-normalised) once, at the first pull, and kept (``input_rows``); the
peers' contributions are added up when Gather backward needs them, so no sum of them is kept beside
``dZ``.

Rematerialisation (``remat``, sync mode): tasks always recompute what backward needs of the forward
(a layer's input ``σ(G_{l-1})`` and its dropout mask, from ``G_{l-1}`` and the mask's key), so the
server keeps no activations; ``remat`` also drops what it kept that backward never reads. Sync mode
runs every stage for all chunks before the next, so (1) the evaluation pass, which follows backward,
writes the training pass's buffers (``ZG``, ``G``, ``S``: one buffer per layer for both, views of
its start where widths differ), and no server starts an epoch before every server finished the one
before (the scheduler's ``epoch_gate``: a peer's next training rows would land on our evaluation's
ghosts); (2) ``dZ_l`` is written over ``Z_l``'s rows (dead once Gather ``l`` ran: GCN and GraphSAGE
read them only there, GAT also in ``attn_grad``, which comes before Gather backward); the peers'
ghost rows come after ``n`` (same width), and their evaluation rows only after the backward that
reads ``dZ`` (they follow our contributions); (3) the fused last layer's ``P̃`` is recomputed for its
backward from ``G_{L-2}`` and its mask, since ``dP̃`` now is where it was kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dorylus_py.data.graph import row_normalized
from dorylus_py.heap import return_freed_memory
from dorylus_py.kernels.heads import HeadBlocks
from dorylus_py.kernels.sparse import BlockAdjacency, csr_nbytes
from dorylus_py.models.spec import ModelSpec
from dorylus_py.partition.layout import Partition
from graph_servers.device_rows import DeviceRows
from graph_servers.gather import GatherStages
from graph_servers.ghost_exchange import GhostExchange
from graph_servers.received import ALL_CHUNKS, NewestParts, OrderedSum
from graph_servers.spares import Spares

INPUT_CACHE_BYTES = 2 << 30  # a partition's float32 inputs kept for the job at most (more: made per pull)
INPUT_BLOCK_ROWS = 1 << 16  # rows normalised at once when the inputs are made (bounds the float64 temporaries)


def _sharing(zeros, *shapes: tuple[int, int]) -> list[np.ndarray]:
    """One buffer for arrays of these shapes that are never live at once: each a C-contiguous view of
    its start."""
    flat = zeros(max(r * w for r, w in shapes))
    return [flat[: r * w].reshape(r, w) for r, w in shapes]


def _owned_bytes(arrays) -> int:
    """Bytes of the buffers behind ``arrays``, each counted once however many views share it."""
    roots = {}
    for a in arrays:
        while a.base is not None and isinstance(a.base, np.ndarray):
            a = a.base
        roots[id(a)] = a.nbytes
    return sum(roots.values())


@dataclass(frozen=True)
class FusedInput:
    """GCN's fused last layer: the graph server computes its input ``P̃ = dropout(relu(G_{L-2}))``, with
    the mask a task would draw (keyed by global vertex id: ``id_start`` is our first vertex's)."""

    rate: float
    seed: int
    id_start: int


class GraphState(GatherStages, GhostExchange):
    def __init__(self, part: Partition, model: ModelSpec, chunk_counts: list[int], feature_norm: str, edge_offset: int = 0,
                 fused: FusedInput | None = None, sync: bool = False, remat: bool = False, device: str = "cpu",
                 smoothing: float = 0.0):
        """``chunk_counts``: how many chunks every graph server has (ours included); ``edge_offset``:
        the id of this partition's first edge (edges are numbered across partitions, for dropout keys);
        ``fused``: the last layer runs fused (``pipeline/stages.py``: ``fused_last_layer``), so its
        training buffers are as wide as its input (``Â P̃``), not its output; ``sync``: every epoch is
        synchronous (the peers' contributions are summed as they come); ``remat`` (sync only): keep only
        what backward reads (below); ``device``: where the graph stages compute (``device_rows.py``); ``smoothing`` (async only): the
        peers' training ghost rows and contributions are kept as moving averages (``ghost_exchange.py``)."""
        return_freed_memory()  # before the buffers: chunk-sized temporaries must not pile up in the heap
        self.part, self.model, self.chunk_counts, self.edge_offset = part, model, chunk_counts, edge_offset
        self.fused = fused
        self.n, self.g = n, g = part.num_local, part.num_ghosts
        self.shapes = model.layers
        self.layers = model.num_layers
        self.attention = model.aggregation == "attention"
        self.peers = [p for p in range(part.num_parts) if p != part.index]
        self.feature_norm = feature_norm
        self._input_cache: np.ndarray | bool | None = None  # P_0 of every row, made at the first pull (_inputs)
        self.labels = np.asarray(part.labels).astype(np.int32)  # what loss tasks pull each epoch: half of int64
        self.masks = np.stack([np.asarray(part.train_mask), np.asarray(part.val_mask), np.asarray(part.test_mask)])
        self.nnz_local = len(part.local_indices)
        self.dev = DeviceRows(device)
        _zeros = self.dev.zeros
        host_adj = self._adjacency()
        self.adj = host_adj.to(self.dev.device)  # once; on the CPU the same blocks (the store's arrays)
        self.bounds = np.linspace(0, n, chunk_counts[part.index] + 1).astype(np.int64)
        self.send_ids = [torch.from_numpy(np.array(part.sends_to(p))) for p in range(part.num_parts)]
        self._chunk_layouts(host_adj)
        shapes, edges, hmax = self.shapes, self.nnz_local + len(part.ghost_indices), max(s.heads for s in self.shapes)
        # ZG[train][l]: rows 0..n-1 are Z_l, rows n.. its ghosts; G[train][l]: the layer's output
        # (remat: a layer's training and evaluation buffers are one, dZ_l is Z_l's rows; see the top)
        if remat and not sync:
            raise ValueError("remat needs sync mode: asynchronous chunks read each other's rows at any stage")
        self.remat = remat
        if smoothing and sync:
            raise ValueError("smoothing is for async mode: sync mode reads no stale rows")
        self.smoothing = np.float32(smoothing)
        # smoothing: which training ghost rows have come once (the first is kept as it is), per layer
        self.ghost_seen = [np.zeros(g, bool) for _ in range(self.layers)] if smoothing else None

        def passes(rows: int, column: int) -> dict[bool, list[np.ndarray]]:
            """Per pass (training, evaluation), per layer: a ``rows`` x width buffer (``widths``' ``column``)."""
            pairs = [[(rows, self.widths(t, l)[column]) for t in (True, False)] for l in range(self.layers)]
            bufs = [_sharing(_zeros, *p) if remat else [_zeros(*s) for s in p] for p in pairs]
            return {True: [t for t, _ in bufs], False: [e for _, e in bufs]}

        self.ZG, self.G = passes(n + g, 0), passes(n, 1)
        self.S = None
        if model.self_term:
            self.S = {t: [_zeros(n, s.out_width) for s in shapes] for t in ((True,) if remat else (True, False))}
            self.S.setdefault(False, self.S[True])
        self.dZ = [self.ZG[True][l][:n] if remat else _zeros(n, self.widths(True, l)[0]) for l in range(self.layers)]
        self.dG = [_zeros(n, self.widths(True, l)[1]) for l in range(self.layers)]
        self.phases = ("bwd", "ebwd") if self.attention else ("bwd",)  # what the peers contribute
        # sync: one message per peer, layer and epoch carries the sum of all its chunks' contributions
        self.sync = sync
        width = lambda phase, l: shapes[l].heads if phase == "ebwd" else self.widths(True, l)[0]  # noqa: E731
        self.received = {(phase, l): OrderedSum(n, width(phase, l), [(p, ALL_CHUNKS) for p in self.peers]) if sync
                         else NewestParts(smoothing) for phase in self.phases for l in range(self.layers)}
        ours = [(part.index, c) for c in range(self.chunks)]
        self.outgoing = {(phase, l): OrderedSum(g, width(phase, l), ours) for phase in self.phases
                         for l in range(self.layers)} if sync and self.peers else {}
        self.contrib_scratch = np.empty(0, np.float32)  # where a chunk's contribution is written (sync, CPU)
        self.send_spares = Spares()  # where the rows sent to peers are picked (ghost_exchange.py)
        if self.attention:
            self.SG = {t: [_zeros(n + g, s.heads) for s in shapes] for t in (True, False)}  # source scores, with ghosts
            self.SD = {t: [_zeros(n, s.heads) for s in shapes] for t in (True, False)}  # destination scores
            shared = _zeros(hmax, edges)  # the evaluation forward's α̃: read only by the chunk that wrote it
            self.alpha = {True: [_zeros(s.heads, edges) for s in shapes], False: [shared[: s.heads] for s in shapes]}
            self.dalpha = _zeros(hmax, edges)  # dα̃ of one layer at a time, per chunk: attn_grad -> edge_bwd
            self.ds = [_zeros(s.heads, edges) for s in shapes]
            self.dsrc = [_zeros(n, s.heads) for s in shapes]
            self.ddst = [_zeros(n, s.heads) for s in shapes]
        self.dev.track(self._buffers())

    def _buffers(self, attention: bool = True) -> list[np.ndarray]:
        """Every per-layer buffer, as the graph stages and the tasks' results reach them (GAT's per-edge and
        score buffers only with ``attention``)."""
        per_layer = [d[t] for d in (self.ZG, self.G, self.S) if d is not None for t in (True, False)]
        if attention and self.attention:
            per_layer += [d[t] for d in (self.SG, self.SD, self.alpha) for t in (True, False)]
            per_layer += [self.ds, self.dsrc, self.ddst, [self.dalpha]]
        return [a for layers in per_layer + [self.dG, self.dZ] for a in layers]

    def widths(self, train: bool, layer: int) -> tuple[int, int]:
        """``(width of Z_l and its ghosts, width of G_l)``; the fused last layer's training pass gathers
        ``P̃`` (the layer's input) instead of ``Z``, so both are its input's width there."""
        s = self.shapes[layer]
        if train and self.fused is not None and layer == self.layers - 1:
            return s.d_in, s.d_in
        return s.z_width, s.out_width

    def _adjacency(self) -> BlockAdjacency | HeadBlocks:
        p, n, g = self.part, self.n, self.g
        if self.attention:
            return HeadBlocks.from_arrays(p.local_indptr, p.local_indices, p.ghost_indptr, p.ghost_indices, n, g)
        local, ghost = (p.local_indptr, p.local_indices, p.local_weights), (p.ghost_indptr, p.ghost_indices, p.ghost_weights)
        local_t = None if p.local_symmetric else (p.local_t_indptr, p.local_t_indices, p.local_t_weights)
        if self.model.aggregation == "mean":
            local, ghost, local_t = self._mean_blocks(local, ghost, local_t)
        return BlockAdjacency.from_arrays(local, ghost, local_t, n, g)

    def _mean_blocks(self, local, ghost, local_t):
        """GraphSAGE's ``D⁻¹A`` on the blocks' patterns (``D``: in-degree without the self loop; 0 on the
        self loop): row ``v``'s entries are ``1/deg v``, and ``Aᵀ``'s entries ``1/deg`` of their column."""
        lp, gp = np.asarray(local[0], np.int64), np.asarray(ghost[0], np.int64)
        inv = (1.0 / np.maximum(np.diff(lp) + np.diff(gp) - 1, 1)).astype(np.float32)
        rows = np.repeat(np.arange(self.n), np.diff(lp))
        cols = np.asarray(local[1])
        pattern_t = local if local_t is None else local_t
        rows_t, cols_t = np.repeat(np.arange(self.n), np.diff(np.asarray(pattern_t[0], np.int64))), np.asarray(pattern_t[1])
        return ((local[0], cols, np.where(cols == rows, np.float32(0), inv[rows])),
                (ghost[0], ghost[1], np.repeat(inv, np.diff(gp))),
                (pattern_t[0], cols_t, np.where(cols_t == rows_t, np.float32(0), inv[cols_t])))

    @property
    def edges(self) -> int:
        """In-edges held (both blocks, without the self loops)."""
        return self.nnz_local + len(self.part.ghost_indices) - self.n

    @property
    def structure_bytes(self) -> int:
        """Bytes of graph structure for forward and backward Gather: the blocks (and GAT's edge maps),
        each chunk's new row pointers, and the chunks' ghost transposes."""
        if self.attention:
            views = sum(m.crow.nbytes for r in self.rows_of if r is not self.adj for m in (r.local, r.ghost, r.local_t))
            return self.adj.nbytes() + views + sum(t.nbytes() for t in self.ghost_t)
        return self.adj.nbytes() + sum(r.row_pointer_bytes() for r in self.rows_of) + csr_nbytes(*self.ghost_t)

    @property
    def buffer_bytes(self) -> int:
        """Bytes of the per-layer buffers (``ZG``, ``G``, ``S``, ``dG``, ``dZ``): what ``remat`` lowers."""
        return _owned_bytes(self._buffers(attention=False))

    @property
    def chunks(self) -> int:
        return len(self.bounds) - 1

    def chunk(self, c: int) -> tuple[int, int]:
        return int(self.bounds[c]), int(self.bounds[c + 1])

    def edge_runs(self, c: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The chunk's in-edges as positions of the per-edge arrays: the local block's run, the ghost block's."""
        a, b = self.chunk(c)
        lp, gp, nl = self.part.local_indptr, self.part.ghost_indptr, self.nnz_local
        return (int(lp[a]), int(lp[b])), (nl + int(gp[a]), nl + int(gp[b]))

    def _chunk_layouts(self, host_adj: BlockAdjacency | HeadBlocks) -> None:
        """Per chunk: its rows of the blocks (views), ``A[chunk, ghosts]ᵀ`` for the contributions to the
        ghosts' owners, and which of its rows each peer holds as ghosts."""
        part = self.part
        self.rows_of, self.ghost_t, self.touched, self.send_in_chunk = [], [], [], []
        for c in range(self.chunks):
            a, b = self.chunk(c)
            self.rows_of.append(self.adj.rows(a, b))  # views of the blocks, on the device
            touched, ghost_t = host_adj.rows(a, b).ghost_transpose()  # the ghosts this chunk has edges from, by owner
            self.ghost_t.append(ghost_t.to(self.dev.device))  # (touched, b - a)
            cut = np.searchsorted(touched, np.asarray(part.ghost_offsets))
            self.touched.append({p: (cut[p], cut[p + 1], (touched[cut[p] : cut[p + 1]].astype(np.int64)
                                     - part.ghost_offsets[p]).astype(np.int32)) for p in self.peers})
            per_peer = {}
            for p in self.peers:
                ids = self.send_ids[p].numpy()
                pos = np.nonzero((ids >= a) & (ids < b))[0].astype(np.int32)  # half of int64's bytes on the wire
                per_peer[p] = (pos, ids[pos])
            self.send_in_chunk.append(per_peer)

    def _values(self, train: bool, layer: int) -> torch.Tensor:
        return self.dev.twin(self.alpha[train][layer])

    # --- tensor tasks' inputs (graph_servers/task_io.py) -------------------------------------------

    def input_rows(self, a: int, b: int) -> np.ndarray:
        """Feature rows ``a:b`` as float32, row-normalised if configured (``P_0`` of the chunk): a view of
        the partition's inputs, made once (:meth:`_inputs`), where they fit :data:`INPUT_CACHE_BYTES`."""
        inputs = self._inputs()
        if inputs is not None:
            return inputs[a:b]
        x = self.part.feature_rows(a, b)
        return row_normalized(x) if self.feature_norm == "row" else x

    def _inputs(self) -> np.ndarray | None:
        """Every row's ``P_0``, made at the first pull and kept: layer 0's input never changes, and tasks
        pull it three times a chunk and epoch (on the ``cpu`` backend normalising it again took 55 % of a
        graph server's loop). Stored float32 features need nothing (the store's own rows); narrower or
        normalised ones are converted once, in blocks, unless the partition's float32 rows would take
        more than :data:`INPUT_CACHE_BYTES` (then each pull converts its own rows, as before)."""
        if self._input_cache is None:
            if self.feature_norm != "row" and self.part.feature_dtype == "float32":
                self._input_cache = self.part.feature_rows()
            elif self.n * self.part.features.shape[1] * 4 > INPUT_CACHE_BYTES:
                self._input_cache = False
            else:
                out = np.empty((self.n, self.part.features.shape[1]), np.float32)
                for lo in range(0, self.n, INPUT_BLOCK_ROWS):
                    x = self.part.feature_rows(lo, lo + INPUT_BLOCK_ROWS)
                    out[lo : lo + len(x)] = row_normalized(x) if self.feature_norm == "row" else x
                self._input_cache = out
        return self._input_cache if self._input_cache is not False else None
