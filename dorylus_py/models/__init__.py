"""GNN models: GCN, GAT, GraphSAGE; each a :class:`ModelSpec` (what the runtime needs to know) and a
torch module (the reference trainer's autograd form)."""

from dorylus_py.models.gcn import GCN, glorot_
from dorylus_py.models.spec import MODELS, LayerShape, ModelSpec, TensorSpec, model_spec, spec_of

__all__ = ["GCN", "MODELS", "LayerShape", "ModelSpec", "TensorSpec", "build_module", "glorot_", "model_spec", "spec_of"]


def build_module(spec: ModelSpec, dropout: float, attn_dropout: float, seed: int):
    """The reference (autograd) module of ``spec``, with the initial weights every backend starts from."""
    if spec.name == "gcn":
        return GCN([spec.layers[0].d_in] + [s.z_width for s in spec.layers], dropout, seed)
    if spec.name == "sage":
        from dorylus_py.models.sage import SAGE

        return SAGE(spec, dropout, seed)
    from dorylus_py.models.gat import GAT

    return GAT(spec, dropout, attn_dropout, seed)
