"""What a graph server's arrays give to its peers and take from them: forward, the fresh ``Z_l`` rows of a
chunk that each peer holds as ghosts; backward, each chunk's contribution ``A[chunk, ghosts]ᵀ dG_l`` to
the peers' vertices' gradients (in sync mode summed over our chunks first, one message per peer); and
the peers' rows and contributions, checked before anything is stored.
"""

from __future__ import annotations

import numpy as np
import torch

from dorylus_py.kernels.heads import gather_heads_backward, row_sums
from dorylus_py.protocol import ProtocolError
from graph_servers.received import ALL_CHUNKS, moving_average


class GhostExchange:
    """A part of :class:`~graph_servers.graph_state.GraphState`: it reads and writes the state's buffers."""

    def rows_for_peers(self, train: bool, layer: int, chunk: int) -> dict[int, tuple[np.ndarray, dict]]:
        """Peer -> (positions in its ghost slice, tensors): the chunk's fresh ``Z_l`` rows it holds (GAT:
        and their source scores)."""
        z = self.ZG[train][layer]
        out = {}
        for p, (pos, rows) in self.send_in_chunk[chunk].items():
            out[p] = (pos, {"rows": self._picked(z, rows)} | ({"scores": self.SG[train][layer][rows]} if self.attention else {}))
        return out

    def _picked(self, source: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``source[rows]``, written into a buffer of a previous send that nothing holds any more (a fresh
        array per chunk and peer is page faults: ``spares.py``)."""
        if source.dtype != np.float32 or source.ndim != 2:
            return source[rows]
        size = len(rows) * source.shape[1]
        buffer = self.send_spares.get(size)
        picked = buffer.reshape(len(rows), source.shape[1])
        np.take(source, rows, axis=0, out=picked, mode="clip")  # the rows are ours (clip: no buffered copy)
        self.send_spares.give(buffer)  # reused once the message that carries ``picked`` is gone
        return picked

    def contributions(self, phase: str, layer: int, chunk: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Peer -> (positions in its send list to us, rows): ``bwd``: ``A[chunk, its ghosts]ᵀ dG_l[chunk]``;
        ``ebwd`` (GAT): per head, the sum of ``ds`` over the chunk's edges from each of its vertices."""
        if not self.peers:
            return {}
        contrib = self._contribution(phase, layer, chunk)
        return {p: (positions, contrib[lo:hi]) for p, (lo, hi, positions) in self.touched[chunk].items()}

    def summed_contributions(self, phase: str, layer: int, chunk: int) -> dict[int, tuple[np.ndarray, np.ndarray]] | None:
        """Sync mode: ``chunk``'s ``dG_l`` rows are in; add the contributions of every chunk that is in and
        follows the ones already summed, in chunk order (as the receiver sums); once every chunk of ours
        is in, peer -> (positions, rows) of the sum, one message per peer instead of one per chunk (at
        10 M / 200 M, 34 chunks each touched about 0.77 M of the peer's 4.85 M ghosts here: 5.4 times the
        rows of the sum), else None. A chunk that comes early is computed when its turn comes, from what
        its contribution reads (``dG_l``; GAT: also ``α̃`` and ``ds``), each written once for the chunk in
        an epoch's backward: computed early, it had to wait as a copy of the ghosts' rows it touches, one
        live per chunk that came out of order (with Lambdas, most of them; at 10 M / 200 M, up to 33
        copies of about 0.77 M rows). The price: the products of chunks that came before chunk 0 run
        after it, on the loop thread."""
        if not self.peers:
            return {}
        total = self.outgoing[(phase, layer)]
        total.add_when_due((self.part.index, chunk), lambda: self._contribution_part(phase, layer, chunk))
        if total.done < len(total.keys):
            return None
        rows, offsets = total.take(), self.part.ghost_offsets
        return {p: (np.arange(offsets[p + 1] - offsets[p], dtype=np.int32), rows[offsets[p]: offsets[p + 1]])
                for p in self.peers}

    def _contribution_part(self, phase: str, layer: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ghosts, rows)``: the chunk's contribution, each row with its ghost index (the rows in the
        scratch buffer where there is one: folded before the next chunk's are written there)."""
        contrib = self._contribution(phase, layer, chunk, self._scratch(phase, layer, chunk))
        ghosts = np.empty(len(contrib), np.int32)
        for p, (lo, hi, positions) in self.touched[chunk].items():
            ghosts[lo:hi] = positions + self.part.ghost_offsets[p]
        return ghosts, contrib

    def _scratch(self, phase: str, layer: int, chunk: int) -> np.ndarray | None:
        """Sync mode on the CPU, GCN and GraphSAGE: the buffer each chunk's contribution is
        written into and at once added to the sum (every part comes in its turn: none is copied). Two fresh arrays
        per chunk (a zeroed output, MKL's result copied in) cost the loop thread a page fault and a
        zeroing per 4 KiB: over half of its page faults, which were a third of its CPU on Dorylus's
        Reddit shape (docs/performance.md). None elsewhere (async sends the rows themselves, a GPU
        computes them on the device). Every layer shares the one buffer: each contribution is used up
        before the call returns."""
        if self.attention or self.dev.copies or phase != "bwd":
            return None
        rows, width = self.ghost_t[chunk].shape[0], self.dG[layer].shape[1]
        if self.contrib_scratch.size < rows * width:  # the first call: sized for the largest chunk and layer
            most = max(m.shape[0] for m in self.ghost_t) * max(g.shape[1] for g in self.dG)
            self.contrib_scratch = np.empty(most, np.float32)
        return self.contrib_scratch[: rows * width].reshape(rows, width)

    def _contribution(self, phase: str, layer: int, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        """The chunk's contribution rows, one per ghost it touches (in ghost order), computed on the device
        (written into ``out`` when given: the CPU, GCN and GraphSAGE)."""
        s, (a, b), m = self.shapes[layer], self.chunk(chunk), self.ghost_t[chunk]
        with self.dev.stage():
            dg = self.dev.twin(self.dG[layer])[a:b]
            if out is not None:
                target = torch.from_numpy(out)
                torch.addmm(target, m, dg, beta=0, out=target)  # beta 0: its old values are ignored
                return out
            if not self.attention:
                contrib = torch.sparse.mm(m, dg)
            elif phase == "bwd":
                contrib = gather_heads_backward(m, self._values(True, layer), dg, s.heads, s.concat)
            else:
                contrib = row_sums(m, self.dev.twin(self.ds[layer]))
            return contrib.cpu().numpy()

    def _smoothed(self, buf: np.ndarray, at: np.ndarray, rows: np.ndarray, first: np.ndarray | None) -> np.ndarray:
        """``rows`` as the moving average ``gamma m + (1 - gamma) rows`` of what ``buf`` holds at ``at`` (PipeGCN's
        smoothing of stale boundary rows); rows never seen before (``first``) and unsmoothed passes (None) as they are."""
        if first is None:
            return rows
        return np.where(first[:, None], rows, moving_average(buf[at], rows, self.smoothing))

    def store_peer_rows(self, phase: str, src: int, layer: int, src_chunk: int, tensors: dict[str, np.ndarray]) -> None:
        """Keep a peer's rows (checked first: nothing out of range is written)."""
        summed = self.sync and phase in self.phases  # sync contributions come summed over the peer's chunks
        if (src not in self.peers or not 0 <= layer < self.layers or phase not in ("fwd", "efwd", *self.phases)
                or not (src_chunk == ALL_CHUNKS if summed else 0 <= src_chunk < self.chunk_counts[src])):
            raise ProtocolError(f"rows from {src} chunk {src_chunk} for layer {layer} phase {phase!r} are not expected")
        s = self.shapes[layer]
        positions = tensors.get("positions")
        sl = self.part.ghosts_from(src)
        backward = phase in self.phases
        limit = len(self.send_ids[src]) if backward else sl.stop - sl.start
        if positions is None or positions.dtype not in (np.int32, np.int64) or positions.ndim != 1:
            raise ProtocolError("ghost positions must be int32 or int64, one per row")
        width = s.heads if phase == "ebwd" else self.widths(phase != "efwd", layer)[0]
        named = {"rows": width} | ({"scores": s.heads} if self.attention and not backward else {})
        for name, width in named.items():
            t = tensors.get(name)
            if t is None or t.dtype != np.float32 or t.shape != (len(positions), width):
                raise ProtocolError(f"ghost {name} must be float32, {len(positions)} x {width}")
        if len(positions) and (positions.min() < 0 or positions.max() >= limit):
            raise ProtocolError(f"ghost positions out of range [0, {limit})")
        if not backward:
            train, at = phase == "fwd", self.n + sl.start + positions
            written = slice(int(at.min()), int(at.max()) + 1) if len(at) else slice(0, 0)  # positions may skip
            smooth = train and self.ghost_seen is not None
            first = ~self.ghost_seen[layer][at - self.n] if smooth else None
            self.ZG[train][layer][at] = self._smoothed(self.ZG[train][layer], at, tensors["rows"], first)
            self.dev.upload(self.ZG[train][layer], written)
            if smooth:
                self.ghost_seen[layer][at - self.n] = True
            if self.attention:
                self.SG[train][layer][at] = self._smoothed(self.SG[train][layer], at, tensors["scores"], first)
                self.dev.upload(self.SG[train][layer], written)
            return
        increasing = bool(np.all(positions[1:] > positions[:-1]))  # as senders send them: no sort needed
        if not increasing and len(np.unique(positions)) != len(positions):
            raise ProtocolError("contribution positions repeat")
        local = self.send_ids[src].numpy()[positions].astype(np.int32)
        self.received[(phase, layer)].add((src, src_chunk), local, tensors["rows"])
