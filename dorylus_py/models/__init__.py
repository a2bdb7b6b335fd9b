"""GNN models: GCN, GAT, GraphSAGE; each an :class:`Architecture` (what differs between them), a
:class:`ModelSpec` (an architecture on a graph's widths: what the runtime needs to know) and a torch
module (the reference trainer's autograd form). Importing the package loads no torch; the modules
``gcn``, ``gat`` and ``sage`` (the torch modules) do."""

from dorylus_py.models.architectures import (
    MODELS,
    Architecture,
    LayerShape,
    architecture,
)
from dorylus_py.models.spec import ModelSpec, TensorSpec, model_spec, spec_of

__all__ = ["MODELS", "Architecture", "LayerShape", "ModelSpec", "TensorSpec", "architecture", "build_module",
           "model_spec", "spec_of"]


def build_module(spec: ModelSpec, dropout: float, attn_dropout: float, seed: int):
    """The reference (autograd) module of ``spec``, with the initial weights every backend starts from."""
    return spec.arch.module(spec, dropout, attn_dropout, seed)
