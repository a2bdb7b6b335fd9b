"""What each kind of task in a run record is, in a reader's words: the names a report and its timeline show.

A record keeps the pipeline's own stage names (``gather_bwd``, ``edge_fwd``: ``pipeline/stages.py``); a report
speaks Dorylus's: Gather, ApplyVertex, ApplyEdge and their backward passes, and :data:`TERMS` says what each is.
A kind this version does not know keeps its own name.
"""

from __future__ import annotations

NAMES = {  # (kind, training pass) -> name; the evaluation pass (no dropout, newest weights) is named as such
    ("fwd", True): "ApplyVertex", ("fwd", False): "ApplyVertex (evaluation)",
    ("bwd", True): "ApplyVertex backward",
    ("edge_fwd", True): "ApplyEdge", ("edge_fwd", False): "ApplyEdge (evaluation)",
    ("edge_bwd", True): "ApplyEdge backward",
    ("loss", True): "loss",
    ("fused", True): "last layer, fused",
    ("eval", False): "accuracy (evaluation)",
    ("gather", True): "Gather", ("gather", False): "Gather (evaluation)", ("egather", False): "Gather (evaluation)",
    ("gather_bwd", True): "Gather backward",
    ("attn_grad", True): "attention backward",
    ("activate", True): "activation", ("activate_bwd", True): "activation backward",
    # gossip and all-reduce workers
    ("batch", True): "mini-batch", ("gossip", True): "gossip exchange", ("allreduce", True): "all-reduce",
    ("steal_wait", True): "waiting to steal work",
}  # fmt: skip

EVALUATION = "evaluation"  # every task of the evaluation pass: one colour on a timeline

TERMS = [  # (term, what it is): the legend of a timeline and of a report's task table; a line of a plot each
    ("Gather", "a graph server sums each vertex's in-neighbours' rows (sparse work, on the server)"),
    ("ApplyVertex", "a chunk's rows times the layer's weights, and the activation (dense work, in a Lambda)"),
    ("Scatter", "a server sends its peers the rows they hold as ghosts as a stage ends (no bar of its own)"),
    ("ApplyEdge", "GAT's attention value of each edge (dense work, in a Lambda)"),
    ("backward", "the same work for the gradients, last layer first"),
    ("last layer, fused", "GCN's last layer: ApplyVertex, the loss and its backward in one task"),
]


def task_name(kind: str, train: bool = True) -> str:
    """The name of a task row's work (its ``kind`` and whether it trained)."""
    return NAMES.get((kind, train), kind if train else f"{kind} (evaluation)")


def timeline_name(kind: str, train: bool = True) -> str:
    """As :func:`task_name`, but the whole evaluation pass is one :data:`EVALUATION`."""
    return task_name(kind, train) if train and kind != "eval" else EVALUATION


def terms_for(names) -> list[tuple[str, str]]:
    """The :data:`TERMS` that ``names`` use (Scatter with Gather: it is what Gather waits for)."""
    text = " ".join(names)
    return [(term, meaning) for term, meaning in TERMS if term in text or term == "Scatter" and "Gather" in text]
