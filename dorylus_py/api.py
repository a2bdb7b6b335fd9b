"""The Python API: what the ``dorylus`` commands do, as calls that return objects.

``predict(run_dir)`` gives a trained model's outputs for every vertex. Errors a user can cause raise a
:class:`~dorylus_py.errors.DorylusError` (``ConfigError``, ``DataError``) whose message is the one line
the command prints after ``error:``.
"""

from __future__ import annotations

import os

from dorylus_py.data.formats import Sources
from dorylus_py.inference.predict import Predictions


def predict(run_dir: str | os.PathLike, data: str | os.PathLike | None = None, weights: str = "best",
            embeddings: bool = False, sources: Sources | None = None) -> Predictions:
    """The model of the run recorded in ``run_dir`` (its ``best`` or ``final`` weights) on ``data`` (default:
    the run's own dataset): logits, probabilities and, with ``embeddings``, the last hidden layer."""
    from dorylus_py.inference import load_trained, predict_graph, run_dataset

    trained = load_trained(run_dir, weights)
    graph = run_dataset(trained, None if data is None else str(data), sources)
    return predict_graph(trained, graph, embeddings)
