"""GAT's ApplyVertex tasks on one chunk of rows, forward and backward as explicit functions.

Layer ``l`` with ``H`` heads of width ``F``: ``P = dropout(σ(G_{l-1}))`` (``X`` for layer 0, σ = ELU),
``Z = P W`` (``(R, H·F)``), per head the scores ``s_src = <Z_h, a_src_h>`` and ``s_dst = <Z_h, a_dst_h>``
(``(R, H)`` each) that the ApplyEdge tasks turn into attention (``kernels/attention.py``), and the
layer's bias ``b``, which the graph server adds after Gather (its "self term": ``G = Gather(α̃, Z) + b``).
Shapes: ``W`` ``(D, H·F)``, ``a_src``/``a_dst`` ``(H, F)``, ``b`` ``(H·F,)`` (concat) or ``(F,)`` (mean).
"""

from __future__ import annotations

from dorylus_py.kernels.gcn_ops import apply_dropout, input_gradient, layer_input


def apply_vertex_forward(p_raw, w, att_src, att_dst, bias, layer: int, keep=None, rate: float = 0.0):
    """``(Z, s_src, s_dst, self_rows)``: ``(R, H·F)``, ``(R, H)``, ``(R, H)``, ``(1, width)`` (the bias)."""
    heads, f = att_src.shape
    z = apply_dropout(layer_input(p_raw, layer, "elu"), keep, rate) @ w
    zh = z.view(-1, heads, f)
    return z, (zh * att_src).sum(-1), (zh * att_dst).sum(-1), bias.view(1, -1)


def apply_vertex_backward(p_raw, w, att_src, att_dst, dz, d_src, d_dst, d_out, layer: int, keep=None, rate: float = 0.0):
    """Gradients of ``W``, ``a_src``, ``a_dst``, ``b`` and ``dL/dG_{l-1}`` (None for layer 0), given
    ``dZ`` (``(R, H·F)``, from Gather backward), ``d s_src``, ``d s_dst`` (``(R, H)``) and ``dOut``
    (``(R, width)``, the gradient of the layer's output, for the bias)."""
    heads, f = att_src.shape
    p = apply_dropout(layer_input(p_raw, layer, "elu"), keep, rate)
    zh = (p @ w).view(-1, heads, f)
    dzh = dz.view(-1, heads, f) + d_src.unsqueeze(-1) * att_src + d_dst.unsqueeze(-1) * att_dst
    grads = {"W": p.t() @ dzh.reshape(dz.shape), "att_src": (d_src.unsqueeze(-1) * zh).sum(0),
             "att_dst": (d_dst.unsqueeze(-1) * zh).sum(0), "b": d_out.sum(0)}
    if layer == 0:
        return grads, None
    dp = apply_dropout(dzh.reshape(dz.shape) @ w.t(), keep, rate)
    return grads, input_gradient(dp, p_raw, "elu")
