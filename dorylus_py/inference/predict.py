"""Predictions of a trained model for every vertex of a graph that fits in memory: one forward pass of the
reference module (``models/``) in eval mode, the same pass the trainer measures accuracy with, so the
predictions of the run's own data at its best weights score exactly the recorded test accuracy there.

The dataset is the run's own (``config.json``'s ``data``, with its side files and split, read only if it
holds what the record's checksums say) unless another is given; either way it must have the feature
width and class count the model was trained on. The features get the normalisation the run resolved
(``row`` or ``none``) before the first layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dorylus_py.atomic import atomic_file
from dorylus_py.data.formats import Sources
from dorylus_py.data.graph import Graph, row_normalized
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.inference.trained import TrainedModel

OUTPUT_SUFFIXES = (".npy", ".npz")


@dataclass(frozen=True, eq=False)
class Predictions:
    """A model's outputs for every vertex of a graph, in the graph's vertex order."""

    graph: Graph  # what was predicted on
    ids: np.ndarray  # (N,) int64: the vertex ids of the dataset
    logits: np.ndarray  # (N, C) float32: the last layer's output
    embeddings: np.ndarray | None  # (N, H) float32: the last layer's input (the last hidden layer, activated)

    @property
    def probabilities(self) -> np.ndarray:
        """(N, C) float32: softmax of the logits."""
        import torch

        return torch.softmax(torch.from_numpy(self.logits), dim=1).numpy()

    @property
    def classes(self) -> np.ndarray:
        """(N,) int64: the predicted class of each vertex."""
        return self.logits.argmax(axis=1).astype(np.int64)

    def accuracy(self, split: str = "test") -> float:
        """Share of ``split``'s vertices predicted right (NaN for an empty split), as the trainer counts it."""
        import torch

        from dorylus_py.training.reference import accuracy

        tensors = (torch.from_numpy(a) for a in (self.logits, self.graph.labels, self.graph.mask(split)))
        return accuracy(*tensors)


def run_dataset(trained: TrainedModel, data: str | None = None, sources: Sources | None = None) -> Graph:
    """The graph to predict on: ``data`` (any dataset path, prepared stores included) or, without it, the
    run's own (:func:`recorded_dataset`)."""
    from dorylus_py.partition import load_dataset

    if data is None:
        data, sources = recorded_dataset(trained)
    if data is None:  # the run trained on `dorylus synth`'s default graph, made again
        from dorylus_py.data import SynthConfig, generate

        return generate(SynthConfig())
    return load_dataset(data, sources or Sources())


def recorded_dataset(trained: TrainedModel) -> tuple[str | None, Sources]:
    """The run's own dataset path (None: synth's default graph) and side files, each holding what the
    record's checksums say (``training/provenance.py``; a ConfigError saying to pass --data otherwise),
    with the run's split settings."""
    from dorylus_py.training.provenance import follow

    paths = follow(trained.run_dir, trained.record)
    recorded = trained.record.get("sources") if isinstance(trained.record.get("sources"), dict) else {}
    split = {k: recorded[k] for k in ("train_frac", "val_frac", "split_seed") if k in recorded}
    try:
        sources = Sources(**split, **{k: v for k, v in paths.items() if k != "data"})
    except (TypeError, ValueError) as e:  # Sources checks the split settings when made
        raise DataError(f"{trained.run_dir / 'config.json'}: sources: {e}") from None
    return paths.get("data"), sources


def check_fits(trained: TrainedModel, graph: Graph) -> None:
    """A dataset the model can run on: the feature width and class count it was trained with."""
    where = trained.run_dir / "config.json"
    if graph.num_features != trained.num_features:
        raise DataError(f"{graph.source}: {graph.num_features} features per vertex, but the model in {trained.run_dir} "
                        f"takes {trained.num_features} ({where})")
    if graph.num_classes != trained.num_classes:
        raise DataError(f"{graph.source}: {graph.num_classes} classes, but the model in {trained.run_dir} predicts "
                        f"{trained.num_classes} ({where})")


def model_input(trained: TrainedModel, graph: Graph) -> np.ndarray:
    """(N, F) float32: the features as the run's first layer saw them."""
    from dorylus_py.training.reference import feature_norm_for

    nonnegative = bool((graph.features >= 0).all())
    return row_normalized(graph.features) if feature_norm_for(trained.feature_norm, nonnegative,
                                                              graph.source) == "row" else graph.features


def predict_graph(trained: TrainedModel, graph: Graph, embeddings: bool = False) -> Predictions:
    """One forward pass over ``graph`` (and, with ``embeddings``, one more through the hidden layers)."""
    import torch
    import torch.nn.functional as F

    check_fits(trained, graph)
    layers = trained.spec.num_layers
    if embeddings and layers < 2:
        raise ConfigError(f"--embeddings: the model in {trained.run_dir} has {layers} layer, so no hidden layer")
    x = torch.from_numpy(np.ascontiguousarray(model_input(trained, graph)))
    with torch.no_grad():
        module = trained.module()
        adjacency = module.graph_input(graph)  # what the model aggregates along, as the trainer builds it
        logits = module(adjacency, x).numpy()
        hidden = None
        if embeddings:
            activation = getattr(F, trained.spec.activation)  # relu or elu, as between the layers in training
            hidden = activation(trained.module(layers - 1)(adjacency, x)).numpy()
    return Predictions(graph, np.arange(graph.num_nodes, dtype=np.int64), logits, hidden)


def check_output(path: str | Path, overwrite: bool) -> Path:
    """Where predictions may be written: a ``.npy`` or ``.npz`` in an existing folder, new unless ``overwrite``."""
    path = Path(path)
    if path.suffix not in OUTPUT_SUFFIXES:
        raise ConfigError(f"--out {path}: write .npy (an array) or .npz (ids and arrays), not {path.suffix or 'no suffix'}")
    if path.exists() and not overwrite:
        raise ConfigError(f"{path}: already exists (pass --overwrite to replace it)")
    if not path.parent.is_dir():
        raise ConfigError(f"{path.parent}: output folder does not exist")
    return path


def write_predictions(predictions: Predictions, path: str | Path, embeddings: bool = False) -> None:
    """``.npy``: the probabilities, or with ``embeddings`` the embeddings; ``.npz``: ``ids``, ``probabilities``
    and, with ``embeddings``, ``embeddings``. Written atomically."""
    path = Path(path)
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        if path.suffix == ".npy":
            np.save(f, predictions.embeddings if embeddings else predictions.probabilities)
        else:
            arrays = {"ids": predictions.ids, "probabilities": predictions.probabilities}
            np.savez(f, **arrays, **({"embeddings": predictions.embeddings} if embeddings else {}))
