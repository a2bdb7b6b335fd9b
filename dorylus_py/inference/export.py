"""A trained model in the forms other tools load: a ``state_dict`` for a stack of torch_geometric convs
(``--to pyg``), or of this package's reference module (``--to torch``).

Either file is a dict of plain tensors, strings and numbers (``torch.load(path, weights_only=True)`` reads
it, no class of ours unpickled): ``state_dict`` plus what rebuilds the module around it. A PyG export
lists its convs as ``{"class": "GCNConv", "kwargs": {...}}``, keyed in the ``state_dict`` as a
``torch.nn.ModuleList`` of them keys its members (``0.lin.weight``, ...); between convs goes
``activation`` (``relu`` or ``elu``), and the features get ``feature_norm`` (``row``: rows sum to 1) first,
as in training. Each architecture's PyG form is one function below (:data:`PYG_CONVS`, by its class).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dorylus_py.atomic import atomic_file
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.inference.trained import TrainedModel
from dorylus_py.models.architectures import (
    GATArchitecture,
    GCNArchitecture,
    SAGEArchitecture,
)

FORMATS = ("pyg", "torch")


def export_dict(trained: TrainedModel, to: str) -> dict:
    """What ``dorylus export --to`` ``to`` saves for ``trained``."""
    import torch

    if to not in FORMATS:
        raise ConfigError(f"--to must be one of {', '.join(FORMATS)}, got {to!r}")
    about = {"format": f"dorylus-{to}/1", "model": trained.spec.name, "weights": trained.which,
             "run_dir": str(trained.run_dir), "features": trained.num_features, "classes": trained.num_classes,
             "feature_norm": trained.feature_norm, "activation": trained.spec.activation}
    if to == "torch":
        cfg = trained.config
        settings = {k: getattr(cfg, k) for k in ("model", "layers", "hidden", "heads", "out_heads", "negative_slope")}
        return about | {"settings": settings, "state_dict": trained.module().state_dict()}
    convs, state = [], {}
    for l, layer in enumerate(trained.spec.layers):
        name, kwargs, tensors = pyg_convs(trained.spec, layer, {t.base: trained.weights[t.name]
                                                                     for t in trained.spec.layer_tensors(l)})
        convs.append({"class": name, "kwargs": kwargs})
        state |= {f"{l}.{key}": torch.from_numpy(np.ascontiguousarray(value)) for key, value in tensors.items()}
    return about | {"convs": convs, "state_dict": state}


def save_export(exported: dict, path: str | Path) -> None:
    """``exported`` at ``path`` with ``torch.save``, atomically."""
    import torch

    with atomic_file(path) as tmp:
        torch.save(exported, tmp)


def torch_module(path_or_dict):
    """The reference module (``models/``) of a ``--to torch`` export (a dict, or the file holding one, read
    with no class unpickled: ``torchfile.load_pt``), in eval mode."""
    from dorylus_py.models import build_module, model_spec
    from dorylus_py.torchfile import load_pt

    saved = path_or_dict if isinstance(path_or_dict, dict) else load_pt(path_or_dict, [], "dorylus export")
    if not isinstance(saved, dict) or not {"settings", "features", "classes", "state_dict"} <= set(saved):
        raise DataError(f"{path_or_dict}: not a `dorylus export --to torch` file")
    s = saved["settings"]
    dims = [saved["features"], *[s["hidden"]] * (s["layers"] - 1), saved["classes"]]
    module = build_module(model_spec(s["model"], dims, s["heads"], s["out_heads"], s["negative_slope"]), 0.0, 0.0, 0)
    module.load_state_dict(saved["state_dict"])
    return module.eval()


# --- each architecture's PyG conv: (class name, constructor kwargs, its state_dict from our tensors) ------


def gcn_conv(spec, layer, w):
    """``GCNConv`` normalises with ``D^-1/2 (A + I) D^-1/2`` over in-degrees, as ours; no bias, as ours."""
    return "GCNConv", {"in_channels": layer.d_in, "out_channels": layer.z_width, "bias": False}, {"lin.weight": w["W"].T}


def sage_conv(spec, layer, w):
    """``SAGEConv``: ``lin_l`` (with the bias) on the neighbours' mean, ``lin_r`` on the vertex itself."""
    kwargs = {"in_channels": layer.d_in, "out_channels": layer.z_width, "aggr": "mean"}
    return "SAGEConv", kwargs, {"lin_l.weight": w["W_neigh"].T, "lin_l.bias": w["b"], "lin_r.weight": w["W_self"].T}


def gat_conv(spec, layer, w):
    """``GATConv``: heads side by side in ``lin`` (head-major, as ``z.view(N, H, F)``), self loops added."""
    kwargs = {"in_channels": layer.d_in, "out_channels": layer.per_head, "heads": layer.heads,
              "concat": layer.concat, "negative_slope": spec.negative_slope}
    state = {"lin.weight": w["W"].T, "att_src": w["att_src"][None], "att_dst": w["att_dst"][None], "bias": w["b"]}
    return "GATConv", kwargs, state


PYG_CONVS = {GCNArchitecture: gcn_conv, SAGEArchitecture: sage_conv, GATArchitecture: gat_conv}


def pyg_convs(spec, layer, w: dict[str, np.ndarray]) -> tuple[str, dict, dict]:
    """Layer ``layer`` of ``spec`` as a PyG conv, from its tensors ``w`` by base name (``W``, ``b``, ...)."""
    conv = PYG_CONVS.get(type(spec.arch))
    if conv is None:
        raise ConfigError(f"--to pyg: no PyG form of model {spec.name} is known (use --to torch)")
    return conv(spec, layer, w)
