"""The stages a chunk walks each epoch, as data: what a model's pipeline is made of.

A :class:`Stage` is either a **tensor task** (``task`` names the kind a worker runs: ApplyVertex
``fwd``/``bwd``, ApplyEdge ``edge_fwd``/``edge_bwd``, ``loss``, ``fused``, ``eval``) or **graph work** done by
the server itself (``task`` None: ``gather``, ``egather``, ``gather_bwd``, ``attn_grad``,
``activate``, ``activate_bwd``). The scheduler knows nothing else about a model: what a stage reads
from the peers (``needs``: sync mode waits until every peer chunk's message of those phases has come),
what a finished stage sends them (``sends``), which weights it pulls (``weights``) and whether its
result carries a weight gradient (``gradient``) are all written here, so a new model or task kind is
a new stage list, not a new scheduler. Every model's list has the same frame: a training forward, the
loss, the backward in reverse layer order, then an evaluation forward (no dropout, newest weights) and
``eval``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str  # unique per layer within a list; graph stages name the graph job
    layer: int
    task: str | None = None  # the tensor task kind (TaskKey.kind); None: graph work on the server
    train: bool = True  # False: the evaluation forward
    needs: tuple[str, ...] = ()  # phases of peer messages it reads (sync waits for all of this layer's)
    sends: tuple[tuple[str, int], ...] = ()  # after its result or graph job: (phase, layer) messages to peers
    weights: str | None = None  # hold: newest, held for the backward (async) | stashed: the forward's | newest
    gradient: bool = False  # its result carries a weight gradient, forwarded to the weight servers


def vertex_stages(layers: int, fused: bool = False) -> list[Stage]:
    """ApplyVertex then Gather per layer (GCN, GraphSAGE)::

        fwd 0, gather 0, ..., fwd L-1, gather L-1, loss,
        gather_bwd L-1, bwd L-1, ..., gather_bwd 0, bwd 0,
        efwd 0, egather 0, ..., efwd L-1, egather L-1, eval

    ``fused`` (GCN, ``layers >= 2``): the last layer runs in Gather-then-ApplyVertex order, so one
    task does its forward, the loss and its first backward step (:func:`fused_last_layer`).
    """
    if fused and layers < 2:
        raise ValueError("the fused last layer needs at least 2 layers")
    last = layers - 1 if fused else layers
    fwd = [s for l in range(last) for s in (
        Stage("fwd", l, "fwd", sends=(("fwd", l),), weights="hold"),
        Stage("gather", l, needs=("fwd",)))]
    bwd = [s for l in reversed(range(last)) for s in (
        Stage("gather_bwd", l, needs=("bwd",)),
        Stage("bwd", l, "bwd", sends=(("bwd", l - 1),) if l else (), weights="stashed", gradient=True))]
    ev = [s for l in range(layers) for s in (
        Stage("efwd", l, "fwd", train=False, sends=(("efwd", l),), weights="newest"),
        Stage("egather", l, train=False, needs=("efwd",)))]
    middle = fused_last_layer(layers) if fused else [_loss(layers)]
    return fwd + middle + bwd + ev + [_eval(layers)]


def fused_last_layer(layers: int) -> list[Stage]:
    """GCN's last layer ``logits = (Â P̃) W`` with ``P̃ = dropout(σ(G_{L-2}))`` computed by the graph
    server, its rows (width hidden) exchanged with the peers as ``Z`` is elsewhere::

        activate L-1 (P̃), gather L-1 (Â P̃),
        fused L-1 (logits, loss, dlogits, dW, dA = dlogits Wᵀ: one task instead of fwd, loss and bwd),
        gather_bwd L-1 (dP̃ = Âᵀ dA), activate_bwd L-1 (dG_{L-2} through the mask and σ')

    The fused task pulls the weights once, so its forward and its gradient use the same version:
    nothing is held for it (``newest``; sync mode: the epoch's, as every training task).
    """
    l = layers - 1
    return [Stage("activate", l, sends=(("fwd", l),)),
            Stage("gather", l, needs=("fwd",)),
            Stage("fused", l, "fused", sends=(("bwd", l),), weights="newest", gradient=True),
            Stage("gather_bwd", l, needs=("bwd",)),
            Stage("activate_bwd", l, sends=(("bwd", l - 1),))]


def attention_stages(layers: int) -> list[Stage]:
    """ApplyVertex, ApplyEdge, then Gather with the edge values per layer (GAT)::

        fwd l (Z, scores), edge_fwd l (attention per in-edge), gather l      (per layer)
        loss
        attn_grad l (dα per in-edge), edge_bwd l (scores' gradient per edge), (per layer, reversed)
        gather_bwd l (dZ and the sources' score gradients), bwd l
        efwd l, eedge_fwd l, egather l ..., eval

    ``edge_fwd`` reads the source scores of ghost in-neighbours, so sync mode starts it only once every
    peer's rows have come; ``edge_bwd`` sends the peers the score gradients of their vertices (``ebwd``).
    """
    fwd = [s for l in range(layers) for s in (
        Stage("fwd", l, "fwd", sends=(("fwd", l),), weights="hold"),
        Stage("edge_fwd", l, "edge_fwd", needs=("fwd",)),
        Stage("gather", l, needs=("fwd",)))]
    bwd = [s for l in reversed(range(layers)) for s in (
        Stage("attn_grad", l),
        Stage("edge_bwd", l, "edge_bwd", sends=(("ebwd", l),)),
        Stage("gather_bwd", l, needs=("bwd", "ebwd")),
        Stage("bwd", l, "bwd", sends=(("bwd", l - 1),) if l else (), weights="stashed", gradient=True))]
    ev = [s for l in range(layers) for s in (
        Stage("efwd", l, "fwd", train=False, sends=(("efwd", l),), weights="newest"),
        Stage("eedge_fwd", l, "edge_fwd", train=False, needs=("efwd",)),
        Stage("egather", l, train=False, needs=("efwd",)))]
    return fwd + [_loss(layers)] + bwd + ev + [_eval(layers)]


def _loss(layers: int) -> Stage:
    return Stage("loss", layers - 1, "loss", sends=(("bwd", layers - 1),))


def _eval(layers: int) -> Stage:
    return Stage("eval", layers - 1, "eval", train=False)


def task_stages(stages: list[Stage]) -> dict[tuple[str, bool, int], Stage]:
    """``(kind, train, layer)`` -> the stage whose task that is (one per key, checked)."""
    out: dict[tuple[str, bool, int], Stage] = {}
    for s in stages:
        if s.task is not None:
            key = (s.task, s.train, s.layer)
            if key in out:
                raise ValueError(f"two stages run task {key}")
            out[key] = s
    return out


def task_kinds(stages: list[Stage]) -> frozenset[str]:
    return frozenset(s.task for s in stages if s.task is not None)
