"""GraphSAGE's ApplyVertex tasks (mean aggregator) on one chunk of rows, forward and backward.

Layer ``l`` (Hamilton et al., NeurIPS 2017, https://arxiv.org/abs/1706.02216, full batch)::

    h'_v = W_selfᵀ P_v + W_neighᵀ mean_{u -> v} P_u + b     =   M Z + S
    Z = P W_neigh   (R, F_out)   gathered by the graph server along M = D⁻¹A (mean over in-neighbours)
    S = P W_self + b (R, F_out)  the chunk's own term, added by the graph server after Gather

with ``P = dropout(relu(G_{l-1}))`` (``X`` for layer 0). Backward from ``dZ = Mᵀ dOut`` (Gather
backward) and ``dOut`` (the layer output's gradient, which is ``dS``).
"""

from __future__ import annotations

from dorylus_py.kernels.gcn_ops import apply_dropout, input_gradient, layer_input


def apply_vertex_forward(p_raw, w_self, w_neigh, bias, layer: int, keep=None, rate: float = 0.0):
    """``(Z, S)``: ``(R, F_out)`` each."""
    p = apply_dropout(layer_input(p_raw, layer), keep, rate)
    return p @ w_neigh, p @ w_self + bias


def apply_vertex_backward(p_raw, w_self, w_neigh, dz, d_out, layer: int, keep=None, rate: float = 0.0):
    """Gradients of ``W_self``, ``W_neigh``, ``b`` and ``dL/dG_{l-1}`` (None for layer 0)."""
    p = apply_dropout(layer_input(p_raw, layer), keep, rate)
    grads = {"W_self": p.t() @ d_out, "W_neigh": p.t() @ dz, "b": d_out.sum(0)}
    if layer == 0:
        return grads, None
    dp = apply_dropout(dz @ w_neigh.t() + d_out @ w_self.t(), keep, rate)
    return grads, input_gradient(dp, p_raw)
