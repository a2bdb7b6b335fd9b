"""What a model is, for every part of the system: its layers' shapes, its weight tensors, its stages.

One :class:`ModelSpec` (an :class:`~dorylus_py.models.architectures.Architecture` on a graph's widths)
answers every question the runtime asks about a model, so no other module branches on the model's name:
the scheduler takes :meth:`ModelSpec.stages`, the weight servers and the driver :meth:`ModelSpec.tensors`
(names, shapes, weight decay, initial values), the graph servers the layers' widths, the aggregation
(``gcn``: ``Â``; ``mean``: ``D⁻¹A``; ``attention``: per-head edge values from ApplyEdge tasks) and whether
a layer adds a self term after Gather; the tensor workers the activation and the kernels.

Every layer is ``G_l = Aggregate(Z_l) [+ S_l]``, ``Z_l`` and ``S_l`` from the chunk's ApplyVertex task:
GCN ``Z = P W``; GraphSAGE ``Z = P W_neigh``, ``S = P W_self + b``; GAT ``Z = P W`` (heads side by
side) with attention per edge, ``S = b``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dorylus_py.models.architectures import Architecture, LayerShape, architecture
from dorylus_py.pipeline.stages import Stage


@dataclass(frozen=True)
class TensorSpec:
    name: str  # the key in weights.npz and checkpoints: base + layer ("W0", "att_src1")
    base: str  # the kernels' name for it ("W", "att_src", "b", ...)
    layer: int
    shape: tuple[int, ...]
    decay: bool  # L2 weight decay applies to it


@dataclass(frozen=True)
class ModelSpec:
    arch: Architecture
    layers: tuple[LayerShape, ...]
    negative_slope: float = 0.2  # GAT's LeakyReLU

    @property
    def name(self) -> str:
        return self.arch.name

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def activation(self) -> str:
        """Between layers: ReLU (GCN, GraphSAGE), ELU (GAT, as in the paper)."""
        return self.arch.activation

    @property
    def aggregation(self) -> str:
        return self.arch.aggregation

    @property
    def self_term(self) -> bool:
        """The layer's ApplyVertex task also produces ``S``, added after Gather."""
        return self.arch.self_term

    def stages(self, fused: bool = False) -> list[Stage]:
        """The stage list; ``fused``: GCN's last layer fused (decided by :func:`fuses_last_layer`)."""
        return self.arch.stages(self.num_layers, fused)

    def tensors(self) -> list[TensorSpec]:
        return [TensorSpec(f"{base}{l}", base, l, shape, decay) for l, s in enumerate(self.layers)
                for base, shape, decay in self.arch.layer_tensors(s, l == 0)]

    def link_intensity(self, kind: str, layer: int) -> float | None:
        """FLOPs per byte a vertex task of ``kind`` at ``layer`` moves over a Lambda's link, per row (its dense
        products, against its rows in and out; layer 0's input counts as held: a warm lease keeps the
        features); None for a kind not priced so (GAT's ApplyEdge), which stays a Lambda's. Dorylus's Reddit
        shape: layer 0's ApplyVertex 301 FLOPs a byte, layer 1's 16-18, the loss under 1."""
        s = self.layers[layer]
        din, z, out = s.d_in, s.z_width, s.out_width
        own = out if self.self_term else 0  # GraphSAGE's self term: a second product, its own rows
        scores = 2 * s.heads if self.aggregation == "attention" else 0
        rows_in = 0 if layer == 0 else din
        if kind == "fwd":
            return 2 * din * (z + own) / (4 * (rows_in + z + own + scores))
        if kind == "bwd":  # dW (and dG above layer 0) from the input, the upstream gradient(s) in, dG out
            back = 2 if layer > 0 else 1
            return back * 2 * din * (z + own) / (4 * (rows_in + z + own + scores + (din if layer > 0 else 0)))
        if kind == "fused":  # logits = AP W, the loss, dW, d(AP): three products; AP in, d(AP) out
            return 3 * 2 * din * out / (4 * (2 * din + 1))
        if kind in ("loss", "eval"):  # a softmax over the classes: a few operations per logit
            return 8 * out / (4 * (2 * out + 1))
        return None

    def layer_tensors(self, layer: int) -> list[TensorSpec]:
        return [t for t in self.tensors() if t.layer == layer]


def fuses_last_layer(model: str, layers: int, fuse: str) -> bool:
    """Whether the last layer runs fused: GCN with 2 layers or more, and ``fuse`` ``on`` (the run plan
    turns ``auto`` into ``on`` or ``off``: ``plan.fuse``). GAT and GraphSAGE (whose last layer has
    ApplyEdge tasks or a self term) and a one-layer GCN (whose input is the features, not a Gather's
    output) keep the separate loss task."""
    return architecture(model).can_fuse(layers) and fuse == "on"


def model_spec(name: str, dims: list[int], heads: int = 8, out_heads: int = 1, negative_slope: float = 0.2) -> ModelSpec:
    """``dims`` = [features, hidden..., classes]; for GAT ``hidden`` is one head's width."""
    arch = architecture(name)
    return ModelSpec(arch, arch.layer_shapes(dims, heads, out_heads), negative_slope)


def spec_of(cfg, dims: list[int]) -> ModelSpec:
    """The model a :class:`~dorylus_py.config.TrainConfig` asks for, on a graph with these widths."""
    return model_spec(cfg.model, dims, cfg.heads, cfg.out_heads, cfg.negative_slope)
