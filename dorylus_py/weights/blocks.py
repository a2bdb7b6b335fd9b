"""How a model's weights are spread over ``M`` weight servers: by row block of each tensor, not by layer.

Every tensor (``ModelSpec.tensors()``) is cut into ``min(M, rows)`` row blocks of near-equal size,
named ``TENSOR.i``; the blocks, in tensor order, are dealt to the servers round-robin. So any ``M`` up
to the largest tensor's row count keeps every server busy (one layer, or a 2-layer GCN with ``M = 3``,
included), each server's pull traffic is about ``1/M`` of the whole, and the layout is a pure function
of the model and ``M``: the driver, the graph servers, the weight servers and the workers all compute
it, nothing is negotiated. Adam and L2 decay are element-wise, so training on blocks is bit for bit
training on whole tensors, whatever ``M``.

Checkpoints and ``weights.npz`` hold whole tensors (:func:`join`), so a run can resume with another ``M``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dorylus_py.models.spec import TensorSpec


@dataclass(frozen=True)
class Block:
    name: str  # TENSOR.i
    tensor: str
    layer: int
    start: int  # rows start:stop of the tensor
    stop: int
    server: int
    decay: bool


def weight_blocks(tensors: list[TensorSpec], servers: int) -> list[Block]:
    """Every tensor's row blocks with the server each lives on (none without servers)."""
    out, dealt = [], 0
    if servers < 1:
        return out
    for t in tensors:
        parts = max(1, min(servers, t.shape[0]))
        bounds = np.linspace(0, t.shape[0], parts + 1).astype(int)
        for i in range(parts):
            out.append(Block(f"{t.name}.{i}", t.name, t.layer, int(bounds[i]), int(bounds[i + 1]), dealt % servers, t.decay))
            dealt += 1
    return out


def servers_of_layer(blocks: list[Block], layer: int) -> list[int]:
    """The weight servers holding a block of ``layer``, in block order; the first is the layer's lead
    (an async forward asks it for the newest version, then every other server for that version)."""
    out: list[int] = []
    for b in blocks:
        if b.layer == layer and b.server not in out:
            out.append(b.server)
    return out


def split(blocks: list[Block], arrays: dict[str, np.ndarray], suffix: str = "") -> dict[str, np.ndarray]:
    """Whole tensors (named ``TENSOR + suffix``) -> block arrays (named ``BLOCK + suffix``); rows sliced."""
    return {b.name + suffix: np.ascontiguousarray(arrays[b.tensor + suffix][b.start : b.stop]) for b in blocks}


def join(arrays: dict[str, np.ndarray], suffix: str = "") -> dict[str, np.ndarray]:
    """Block arrays named ``TENSOR.i + suffix`` -> whole tensors named ``TENSOR + suffix`` (rows stacked)."""
    parts: dict[str, dict[int, np.ndarray]] = {}
    for name, arr in arrays.items():
        if suffix and not name.endswith(suffix):
            continue
        stem = name[: len(name) - len(suffix)] if suffix else name
        tensor, _, index = stem.rpartition(".")
        parts.setdefault(tensor, {})[int(index)] = np.asarray(arr)
    return {t + suffix: np.concatenate([p[i] for i in sorted(p)]) if p[0].ndim else p[0] for t, p in parts.items()}
