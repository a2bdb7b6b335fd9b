"""GCN, GAT and GraphSAGE as objects: everything that differs between them, in one place.

An :class:`Architecture` is a model before it meets a graph (no widths): its activation, aggregation,
stage list, weight tensors per layer, tensor kernels, reference module, whether its last layer fuses
and whether its tasks stream. :func:`architecture` turns a name into one, refusing a name it does not
know; no module outside ``models/`` compares a model's name (``tests/models/test_no_name_branching.py``).
Importing this module loads no torch (the CLI's ``--help`` and ``dorylus report`` read it): what needs
torch is imported when it is first asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

from dorylus_py.errors import ConfigError
from dorylus_py.pipeline.stages import Stage, attention_stages, vertex_stages


@dataclass(frozen=True)
class LayerShape:
    d_in: int  # width of the layer's input P_l
    heads: int  # attention heads (1 without attention)
    per_head: int  # output width of one head
    concat: bool  # heads side by side (hidden GAT layers) or averaged (the last)

    @property
    def z_width(self) -> int:
        """Width of ``Z_l`` (what Gather reads and the peers receive)."""
        return self.heads * self.per_head

    @property
    def out_width(self) -> int:
        """Width of ``G_l`` (the layer's output)."""
        return self.z_width if self.concat else self.per_head


class Architecture:
    """What GCN, GraphSAGE and GAT do differently; one instance each (:data:`ARCHITECTURES`)."""

    name: str  # what --model and config.json call it
    activation = "relu"  # between layers
    aggregation: str  # what Gather sums with: gcn Â, mean D⁻¹A, attention per-head edge values
    self_term = True  # the ApplyVertex task also produces S, added after Gather
    fusable = False  # its last layer can fuse with the loss (fuses_last_layer decides when it does)
    streams = True  # a row-wise task can run a block of rows at a time (--stream-rows)
    enhanced_batches = False  # decentral mini-batches aggregate along Cluster-GCN's Â + λ diag(Â)

    def __repr__(self) -> str:
        return f"architecture({self.name!r})"

    def layer_shapes(self, dims: list[int], heads: int, out_heads: int) -> tuple[LayerShape, ...]:
        """``dims`` = [features, hidden..., classes]."""
        return tuple(LayerShape(a, 1, b, True) for a, b in zip(dims[:-1], dims[1:]))

    def can_fuse(self, num_layers: int) -> bool:
        """Whether a model of ``num_layers`` may run its last layer fused (the input of a one-layer
        model's is the features, not a Gather's output)."""
        return self.fusable and num_layers >= 2

    def stages(self, num_layers: int, fused: bool) -> list[Stage]:
        return vertex_stages(num_layers, fused and self.can_fuse(num_layers))

    def layer_tensors(self, s: LayerShape, first: bool) -> list[tuple[str, tuple[int, ...], bool]]:
        """``(base name, shape, weight decay)`` of each weight tensor of a layer (``first``: layer 0)."""
        raise NotImplementedError

    def label(self, config: dict) -> str:
        """What the report's model column shows for a run record's ``config``."""
        return self.name

    def kernels(self):
        """Its :class:`~dorylus_py.kernels.tasks.ModelKernels`: the tensor workers' maths."""
        raise NotImplementedError

    def module(self, spec, dropout: float, attn_dropout: float, seed: int):
        """The reference (autograd) torch module of ``spec`` (a :class:`ModelSpec` of this architecture)."""
        raise NotImplementedError

    def graph_input(self, graph, device="cpu"):
        """What the reference module aggregates along, for anything with ``indptr``, ``indices`` and
        ``num_nodes``: a :class:`~dorylus_py.data.Graph`, or a mini-batch's induced subgraph."""
        raise NotImplementedError


class GCNArchitecture(Architecture):
    """Kipf & Welling: ``Z = P W``, Gather with ``Â``, no bias, L2 on the first layer only."""

    name, aggregation, self_term, fusable, enhanced_batches = "gcn", "gcn", False, True, True

    def layer_tensors(self, s, first):
        return [("W", (s.d_in, s.z_width), first)]

    def kernels(self):
        from dorylus_py.kernels import tasks

        return tasks.GCN

    def module(self, spec, dropout, attn_dropout, seed):
        from dorylus_py.models.gcn import GCN

        return GCN([spec.layers[0].d_in] + [s.z_width for s in spec.layers], dropout, seed)

    def graph_input(self, graph, device="cpu"):
        from dorylus_py.kernels.sparse import NormalizedAdjacency

        return NormalizedAdjacency.for_graph(graph, device)


class SAGEArchitecture(Architecture):
    """GraphSAGE, mean aggregator: ``Z = P W_neigh`` gathered with ``D⁻¹A``, ``S = P W_self + b``."""

    name, aggregation = "sage", "mean"

    def layer_tensors(self, s, first):
        return [("W_self", (s.d_in, s.z_width), True), ("W_neigh", (s.d_in, s.z_width), True), ("b", (s.z_width,), False)]

    def kernels(self):
        from dorylus_py.kernels import tasks

        return tasks.SAGE

    def module(self, spec, dropout, attn_dropout, seed):
        from dorylus_py.models.sage import SAGE

        return SAGE(spec, dropout, seed)

    def graph_input(self, graph, device="cpu"):
        from dorylus_py.models.sage import mean_adjacency

        return mean_adjacency(graph, device)


class GATArchitecture(Architecture):
    """Veličković et al.: ``Z = P W`` (heads side by side), attention per edge in ApplyEdge tasks,
    ``S = b``; ELU between layers as in the paper; L2 on everything but the biases, as its code."""

    name, activation, aggregation = "gat", "elu", "attention"
    streams = False  # the vertex forward returns the bias row with the rows, which no block owns

    def layer_shapes(self, dims, heads, out_heads):
        """``dims`` = [features, hidden..., classes], ``hidden`` one head's width: hidden layers
        concatenate ``heads`` heads, the last averages ``out_heads``."""
        last, layers = len(dims) - 2, []
        for l in range(len(dims) - 1):
            d_in = dims[0] if l == 0 else layers[-1].out_width
            layers.append(LayerShape(d_in, heads if l < last else out_heads, dims[l + 1], l < last))
        return tuple(layers)

    def stages(self, num_layers, fused):
        return attention_stages(num_layers)

    def layer_tensors(self, s, first):
        return [("W", (s.d_in, s.z_width), True), ("att_src", (s.heads, s.per_head), True),
                ("att_dst", (s.heads, s.per_head), True), ("b", (s.out_width,), False)]

    def label(self, config):
        """``gat 8x8/1``: heads x width per head / output heads."""
        return f"gat {config.get('heads', 8)}x{config.get('hidden', '?')}/{config.get('out_heads', 1)}"

    def kernels(self):
        from dorylus_py.kernels import tasks

        return tasks.GAT

    def module(self, spec, dropout, attn_dropout, seed):
        from dorylus_py.models.gat import GAT

        return GAT(spec, dropout, attn_dropout, seed)

    def graph_input(self, graph, device="cpu"):
        from dorylus_py.models.gat import AttentionGraph

        return AttentionGraph.for_graph(graph, device)


ARCHITECTURES = {a.name: a for a in (GCNArchitecture(), GATArchitecture(), SAGEArchitecture())}
MODELS = tuple(ARCHITECTURES)  # gcn, gat, sage


def architecture(name: str) -> Architecture:
    """The architecture called ``name``; an unknown name is refused here, where a name is read."""
    arch = ARCHITECTURES.get(name) if isinstance(name, str) else None
    if arch is None:
        raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return arch
