"""GNN models: GCN, GAT, GraphSAGE; each a :class:`ModelSpec` (what the runtime needs to know) and a
torch module (the reference trainer's autograd form)."""

from dorylus_py.models.gcn import GCN, glorot_
from dorylus_py.models.spec import MODELS, LayerShape, ModelSpec, TensorSpec, model_spec, spec_of

__all__ = ["GCN", "MODELS", "LayerShape", "ModelSpec", "TensorSpec", "build_module", "glorot_", "graph_input", "model_spec",
           "spec_of"]


def build_module(spec: ModelSpec, dropout: float, attn_dropout: float, seed: int):
    """The reference (autograd) module of ``spec``, with the initial weights every backend starts from."""
    if spec.name == "gcn":
        return GCN([spec.layers[0].d_in] + [s.z_width for s in spec.layers], dropout, seed)
    if spec.name == "sage":
        from dorylus_py.models.sage import SAGE

        return SAGE(spec, dropout, seed)
    from dorylus_py.models.gat import GAT

    return GAT(spec, dropout, attn_dropout, seed)


def graph_input(name: str, graph, device="cpu"):
    """What model ``name``'s reference module aggregates along (GCN: ``Â``; GAT: the edges of ``A + I``;
    GraphSAGE: the mean ``D⁻¹A``), for anything with ``indptr``, ``indices`` and ``num_nodes``: a
    :class:`~dorylus_py.data.Graph`, or a mini-batch's induced subgraph."""
    if name == "gcn":
        from dorylus_py.kernels.sparse import NormalizedAdjacency

        return NormalizedAdjacency.for_graph(graph, device)
    if name == "sage":
        from dorylus_py.models.sage import mean_adjacency

        return mean_adjacency(graph, device)
    from dorylus_py.models.gat import AttentionGraph

    return AttentionGraph.for_graph(graph, device)
