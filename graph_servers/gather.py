"""The graph stages of a graph server's arrays, run on its graph thread (``graph_thread.py``): Gather
forward and backward, GAT's attention gradient, the fused last layer's activation and its backward.

Each works on one chunk's rows, or on all rows (sync mode), and touches only rows that no running task
reads (the scheduler's rule). The arrays and what they hold are :class:`~graph_servers.graph_state.GraphState`'s;
the stages compute on their device twins (``device_rows.py``: the arrays themselves on the CPU) and copy
back what they wrote.
"""

from __future__ import annotations

import torch

from dorylus_py.kernels import gcn_ops
from dorylus_py.kernels.dropout import dropout_keep_mask
from dorylus_py.kernels.heads import row_sums


class GatherStages:
    """A part of :class:`~graph_servers.graph_state.GraphState`: it reads and writes the state's buffers."""

    def run_graph(self, stage: str, epoch: int, layer: int, chunk: int | None) -> None:
        """The graph stage ``stage`` of layer ``layer`` for one chunk's rows, or all rows (``chunk`` None)."""
        with self.dev.stage():
            self._run_graph(stage, epoch, layer, chunk)

    def _run_graph(self, stage: str, epoch: int, layer: int, chunk: int | None) -> None:
        if stage in ("gather", "egather"):
            self.gather(stage == "gather", layer, chunk)
        elif stage == "gather_bwd":
            self.gather_backward(layer, chunk)
        elif stage == "attn_grad":
            self.attention_grad(layer, chunk)
        elif stage in ("activate", "activate_bwd") and self.fused is not None and layer == self.layers - 1:
            for c in range(self.chunks) if chunk is None else (chunk,):  # a chunk at a time: bounded temporaries
                self.activate(epoch, c) if stage == "activate" else self.activate_backward(epoch, c)
        else:
            raise ValueError(f"unknown graph stage {stage!r} for layer {layer}")

    def _rows(self, chunk: int | None):
        """``((a, b), blocks)``: the chunk's row range and its rows of ``A`` (all rows for None)."""
        return ((0, self.n), self.adj) if chunk is None else (self.chunk(chunk), self.rows_of[chunk])

    def gather(self, train: bool, layer: int, chunk: int | None) -> None:
        """``G_l`` of the chunk's rows, written in place."""
        s, ((a, b), m), on = self.shapes[layer], self._rows(chunk), self.dev.twin
        out, zg = on(self.G[train][layer])[a:b], on(self.ZG[train][layer])
        if self.attention:
            out[:] = m.gather(self._values(train, layer), zg, s.heads, s.concat)
        else:
            m.gather(zg, out=out)
        if self.S:
            out += on(self.S[train][layer])[a:b]
        self.dev.download(self.G[train][layer], slice(a, b))

    def gather_backward(self, layer: int, chunk: int | None) -> None:
        """``dZ_l`` of the chunk's rows: our own chunks' ``dG_l`` through ``Aᵀ``, plus the peers' parts
        (GAT: also the sources' score gradients, from our edges' ``ds`` and the peers' parts)."""
        s, ((a, b), m), on = self.shapes[layer], self._rows(chunk), self.dev.twin
        dz, dg = on(self.dZ[layer])[a:b], on(self.dG[layer])
        if self.attention:
            dz[:] = m.gather_t(self._values(True, layer), dg, s.heads, s.concat)
            on(self.dsrc[layer])[a:b] = row_sums(m.local_t, on(self.ds[layer]))
        else:
            m.gather_t(dg, out=dz)
        outputs = {"bwd": self.dZ[layer]} | ({"ebwd": self.dsrc[layer]} if self.attention else {})
        for phase, rows in outputs.items():  # the peers' parts are added on the host, where they came
            self.dev.download(rows, slice(a, b))
            self.received[(phase, layer)].add_to(a, b, rows[a:b])
            self.dev.upload(rows, slice(a, b))

    def activate(self, epoch: int, chunk: int) -> None:
        """The fused last layer's input ``P̃ = dropout(relu(G_{L-2}))`` of the chunk's rows (into ``ZG``,
        from where the chunk's rows go to the peers that hold them as ghosts)."""
        a, b = self.chunk(chunk)
        zg = self.ZG[True][self.layers - 1]
        self.dev.twin(zg)[a:b] = self._fused_input(epoch, a, b)
        self.dev.download(zg, slice(a, b))

    def _fused_input(self, epoch: int, a: int, b: int) -> torch.Tensor:
        f, l = self.fused, self.layers - 1
        g = self.dev.twin(self.G[True][l - 1])[a:b]
        keep = (dropout_keep_mask(f.id_start + a, f.id_start + b, g.shape[1], f.rate, f.seed, epoch, l, device=g.device)
                if f.rate > 0 else None)
        return gcn_ops.apply_vertex_input(g, l, keep, f.rate)

    def activate_backward(self, epoch: int, chunk: int) -> None:
        """``dG_{L-2}`` of the chunk's rows from ``dP̃`` (Gather backward's ``dZ_{L-1}``) and ``P̃`` (kept in
        ``ZG``; with ``remat``, where ``dP̃`` now is, recomputed from ``G_{L-2}`` and the same mask)."""
        l, (a, b), on = self.layers - 1, self.chunk(chunk), self.dev.twin
        dp = on(self.dZ[l])[a:b]
        p = self._fused_input(epoch, a, b) if self.remat else on(self.ZG[True][l])[a:b]
        on(self.dG[l - 1])[a:b] = gcn_ops.activation_backward(dp, p, self.fused.rate)
        self.dev.download(self.dG[l - 1], slice(a, b))

    def attention_grad(self, layer: int, chunk: int | None) -> None:
        """GAT: ``dα̃`` of the chunk's in-edges, ``<dG_l[v], Z_l[u]>`` per head (an SDDMM per block)."""
        s, ((a, b), m), on = self.shapes[layer], self._rows(chunk), self.dev.twin
        local, ghost = m.value_grads(on(self.dG[layer])[a:b], on(self.ZG[True][layer]), s.heads, s.concat)
        for (lo, hi), values in zip(m.edge_runs(), (local, ghost), strict=True):
            on(self.dalpha)[: s.heads, lo:hi] = values
            self.dev.download(self.dalpha, (slice(0, s.heads), slice(lo, hi)))
