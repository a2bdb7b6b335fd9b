"""A trained model, read back from its run record: what ``predict`` and ``export`` start from.

A run record (``training/record.py``) holds the configuration (``config.json``: the model, its widths
through the dataset's counts, the feature normalisation the run resolved) and the weights by tensor name
(``weights.npz`` after the last epoch, ``best_weights.npz`` at the best validation epoch). Reading one
checks that every tensor the configuration implies is there with its shape, so a record whose files
disagree is refused with one line instead of failing inside a forward pass.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dorylus_py.checkpoint import read_npz
from dorylus_py.config import SECTION_OF, TrainConfig
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.jsonfile import read_json
from dorylus_py.models import ModelSpec, spec_of
from dorylus_py.regular_file import open_regular

WEIGHT_FILES = {"best": "best_weights.npz", "final": "weights.npz"}  # --weights CHOICE -> file of the record


@dataclass(frozen=True, eq=False)
class TrainedModel:
    """A run record's model at one set of its weights."""

    run_dir: Path
    config: TrainConfig  # the run's settings
    record: dict  # config.json as written (graph counts, data source, resolved feature_norm, ...)
    spec: ModelSpec  # the architecture on the run's widths
    weights: dict[str, np.ndarray]  # by tensor name (W0, att_src0, b0, ...), float32
    which: str  # best | final

    @property
    def feature_norm(self) -> str:
        """What the run did to the features before the first layer: ``row`` or ``none``."""
        return self.record.get("feature_norm", "none")

    @property
    def num_features(self) -> int:
        return self.spec.layers[0].d_in

    @property
    def num_classes(self) -> int:
        return self.spec.layers[-1].out_width

    def module(self, layers: int | None = None):
        """The reference torch module (``models/``) holding these weights, in eval mode; ``layers``: only
        the first so many layers (the embeddings are the input of the last one)."""
        import torch

        from dorylus_py.models import build_module

        spec = self.spec if layers is None else ModelSpec(self.spec.arch, self.spec.layers[:layers],
                                                         self.spec.negative_slope)
        cfg = self.config
        module = build_module(spec, cfg.dropout, cfg.attention_dropout(), cfg.seed)
        with torch.no_grad():
            for name, tensor in module.tensors().items():
                tensor.copy_(torch.from_numpy(self.weights[name]))
        return module.eval()


def load_trained(run_dir: str | Path, which: str = "best") -> TrainedModel:
    """The model of the run recorded in ``run_dir`` at its ``best`` or ``final`` weights."""
    run_dir = Path(run_dir)
    if which not in WEIGHT_FILES:
        raise ConfigError(f"--weights must be one of {', '.join(WEIGHT_FILES)}, got {which!r}")
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run record folder")
    record = read_json(run_dir / "config.json", ConfigError, "missing: not a run record (from `dorylus train`)")
    if not isinstance(record, dict):
        raise DataError(f"{run_dir / 'config.json'}: not a run record's configuration (not a JSON object)")
    config = TrainConfig.from_dict({k: v for k, v in record.items() if k in SECTION_OF})
    counts = record.get("graph") or {}
    if not all(isinstance(counts.get(k), int) and counts[k] > 0 for k in ("features", "classes")):
        raise DataError(f"{run_dir / 'config.json'}: lacks the dataset's feature and class counts (graph.features, "
                        "graph.classes)")
    spec = spec_of(config, config.widths(counts["features"], counts["classes"]))
    weights = read_weights(run_dir / WEIGHT_FILES[which], spec)
    return TrainedModel(run_dir, config, record, spec, weights, which)


def read_weights(path: Path, spec: ModelSpec) -> dict[str, np.ndarray]:
    """The tensors ``spec`` names, from a weights ``.npz``, each checked against its shape. Read as
    checkpoints are (``checkpoint.read_npz``): a regular file, not a symlink; only the members the model
    has, each sized from its header against the model's shape before anything is allocated."""
    shapes = {t.name: tuple(t.shape) for t in spec.tensors()}
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise DataError(f"{path}: missing (the run ended before writing it; try --weights "
                        f"{'final' if path.name == WEIGHT_FILES['best'] else 'best'})") from None
    with f:
        arrays = read_npz(f, str(path), shapes, os.fstat(f.fileno()).st_size, wanted=set(shapes))
    weights = {}
    for t in spec.tensors():
        w = arrays.get(t.name)
        if w is None:
            raise DataError(f"{path}: no tensor {t.name}, which the {spec.name} model of config.json has")
        if tuple(w.shape) != tuple(t.shape) or not np.issubdtype(w.dtype, np.floating):
            raise DataError(f"{path}: tensor {t.name} is {w.dtype} {tuple(w.shape)}, but the model of config.json "
                            f"needs float {tuple(t.shape)}")
        weights[t.name] = np.ascontiguousarray(w, dtype=np.float32)
    return weights
