"""What a model is, for every part of the system: its layers' shapes, its weight tensors, its stages.

One :class:`ModelSpec` answers every question the runtime asks about a model, so no other module
branches on the model's name for structure: the scheduler takes :meth:`ModelSpec.stages`, the weight
servers and the driver :meth:`ModelSpec.tensors` (names, shapes, weight decay, initial values), the
graph servers the layers' widths, the aggregation (``gcn``: ``Â``; ``mean``: ``D⁻¹A``;
``attention``: per-head edge values from ApplyEdge tasks) and whether a layer adds a self term
after Gather; the tensor workers the activation.

Every layer is ``G_l = Aggregate(Z_l) [+ S_l]``, ``Z_l`` and ``S_l`` from the chunk's ApplyVertex task:
GCN ``Z = P W``; GraphSAGE ``Z = P W_neigh``, ``S = P W_self + b``; GAT ``Z = P W`` (heads side by
side) with attention per edge, ``S = b``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dorylus_py.pipeline.stages import Stage, attention_stages, vertex_stages

MODELS = ("gcn", "gat", "sage")


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


@dataclass(frozen=True)
class TensorSpec:
    name: str  # the key in weights.npz and checkpoints: base + layer ("W0", "att_src1")
    base: str  # the kernels' name for it ("W", "att_src", "b", ...)
    layer: int
    shape: tuple[int, ...]
    decay: bool  # L2 weight decay applies to it


@dataclass(frozen=True)
class ModelSpec:
    name: str  # gcn | gat | sage
    layers: tuple[LayerShape, ...]
    negative_slope: float = 0.2  # GAT's LeakyReLU

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def activation(self) -> str:
        """Between layers: ReLU (GCN, GraphSAGE), ELU (GAT, as in the paper)."""
        return "elu" if self.name == "gat" else "relu"

    @property
    def aggregation(self) -> str:
        return {"gcn": "gcn", "sage": "mean", "gat": "attention"}[self.name]

    @property
    def self_term(self) -> bool:
        """The layer's ApplyVertex task also produces ``S``, added after Gather."""
        return self.name != "gcn"

    def stages(self, fused: bool = False) -> list[Stage]:
        """The stage list; ``fused``: GCN's last layer fused (decided by :func:`fuses_last_layer`)."""
        if self.name == "gat":
            return attention_stages(self.num_layers)
        return vertex_stages(self.num_layers, fused and self.name == "gcn" and self.num_layers >= 2)

    def tensors(self) -> list[TensorSpec]:
        out = []
        for l, s in enumerate(self.layers):
            if self.name == "gcn":  # Kipf & Welling: L2 on the first layer only
                parts = [("W", (s.d_in, s.z_width), l == 0)]
            elif self.name == "sage":
                parts = [("W_self", (s.d_in, s.z_width), True), ("W_neigh", (s.d_in, s.z_width), True),
                         ("b", (s.z_width,), False)]
            else:  # GAT: L2 on everything but the biases, as the paper's code
                parts = [("W", (s.d_in, s.z_width), True), ("att_src", (s.heads, s.per_head), True),
                         ("att_dst", (s.heads, s.per_head), True), ("b", (s.out_width,), False)]
            out += [TensorSpec(f"{base}{l}", base, l, shape, decay) for base, shape, decay in parts]
        return out

    def layer_tensors(self, layer: int) -> list[TensorSpec]:
        return [t for t in self.tensors() if t.layer == layer]


def fuses_last_layer(model: str, layers: int, fuse: str, backend: str, latency_ms: float = 0.0) -> bool:
    """Whether the last layer runs fused: GCN with 2 layers or more, and ``fuse`` ``on``, or ``auto``
    where a task saved is a round trip saved: the ``lambda`` backend, and ``local`` with an emulated
    latency (``latency_ms`` > 0). Fusing widens the last layer's Gather from the classes to the hidden
    width and adds two graph jobs per chunk, so without a round trip to save it does not pay: on the
    200 k graph (``benchmarks/bench_lambda.py``, medians of 3) fused epochs took 1.01x (sync) and 1.08x
    (async) the unfused ones on ``local`` without latency, and 0.98x and 0.93x at 20 ms. GAT and
    GraphSAGE (whose last layer has ApplyEdge tasks or a self term) and a one-layer GCN (whose input is
    the features, not a Gather's output) keep the separate loss task."""
    if model != "gcn" or layers < 2 or fuse == "off":
        return False
    return fuse == "on" or backend == "lambda" or (backend == "local" and latency_ms > 0)


def model_spec(name: str, dims: list[int], heads: int = 8, out_heads: int = 1, negative_slope: float = 0.2) -> ModelSpec:
    """``dims`` = [features, hidden..., classes]; for GAT ``hidden`` is one head's width."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    last = len(dims) - 2
    layers = []
    for l in range(len(dims) - 1):
        if name == "gat":
            d_in = dims[0] if l == 0 else layers[-1].out_width
            layers.append(LayerShape(d_in, heads if l < last else out_heads, dims[l + 1], l < last))
        else:
            layers.append(LayerShape(dims[l], 1, dims[l + 1], True))
    return ModelSpec(name, tuple(layers), negative_slope)


def spec_of(cfg, dims: list[int]) -> ModelSpec:
    """The model a :class:`~dorylus_py.config.TrainConfig` asks for, on a graph with these widths."""
    return model_spec(cfg.model, dims, cfg.heads, cfg.out_heads, cfg.negative_slope)
