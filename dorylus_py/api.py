"""The Python API: ``dorylus train`` and ``dorylus predict`` as calls that return objects.

``train(TrainConfig(...), out=...)`` runs what ``dorylus train`` runs (the same function: the command is
this call plus its last line) and returns a :class:`TrainRun`: the record's folder, its summary, its
per-epoch metrics. ``predict(run_dir)`` gives a trained model's outputs for every vertex. A problem a user
can cause raises a :class:`~dorylus_py.errors.DorylusError` (``ConfigError``, ``DataError``) whose
message is the one line the command prints after ``error:``, in a caller's words: ``overwrite=True``
where the command says ``--overwrite`` (``spelling.py``).

Imports nothing heavy at load: ``import dorylus_py`` stays as light as the CLI's ``--help``.
"""

from __future__ import annotations

import os
import warnings
from argparse import Namespace
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dorylus_py.config import TrainConfig
    from dorylus_py.data.formats import Sources
    from dorylus_py.inference.predict import Predictions


@dataclass(frozen=True)
class TrainRun:
    """A finished run: where its record is, and what its ``summary.json`` and ``metrics.jsonl`` hold."""

    run_dir: Path
    summary: dict  # summary.json: status, best_epoch, best_val_acc, test_acc_at_best_val, final_*, timings
    metrics: list[dict] = field(repr=False)  # metrics.jsonl: one row per epoch (loss, accuracies, seconds)

    @property
    def best_epoch(self) -> int:
        return self.summary["best_epoch"]

    @property
    def best_val_acc(self) -> float:
        return self.summary["best_val_acc"]

    @property
    def test_acc(self) -> float:
        """Test accuracy at the best validation epoch."""
        return self.summary["test_acc_at_best_val"]

    def predict(self, data: str | os.PathLike | None = None, weights: str = "best",
                embeddings: bool = False) -> "Predictions":
        """:func:`predict` of this run."""
        return predict(self.run_dir, data, weights, embeddings)


def train(config: "TrainConfig | None" = None, out: str | os.PathLike | None = None, *, overwrite: bool = False,
          sources: "Sources | None" = None, cluster: str | None = None, resume: str | os.PathLike | None = None,
          no_data_copy: bool = False, progress: bool = False, **settings) -> TrainRun:
    """Train as ``dorylus train`` does, with ``config`` and any ``settings`` by name on top of it
    (``train(data="g.npz", model="gat", epochs=3)``); the keywords are its other flags (``out``: --out,
    ``sources``: the side files and split of an edge list, ``resume``: --resume RUN_DIR, ``progress``: a bar).
    Settings left at their defaults count as not given (--resume and --cluster ask)."""
    from dorylus_py.spelling import python_words

    with python_words():
        return _train(config, out, overwrite, sources, cluster, resume, no_data_copy, progress, settings)


def _train(config, out, overwrite, sources, cluster, resume, no_data_copy, progress, settings) -> TrainRun:
    from dorylus_py import progress as bars
    from dorylus_py.cli_train import run_train
    from dorylus_py.config import SECTION_OF, TRAIN_KEYWORDS, TrainConfig
    from dorylus_py.data.formats import Sources
    from dorylus_py.errors import ConfigError
    from dorylus_py.spelling import nearest
    from dorylus_py.training import record

    if config is not None and not isinstance(config, TrainConfig):
        raise ConfigError(f"config must be a TrainConfig, got {type(config).__name__} (TrainConfig(**settings) makes "
                          "one, or pass the settings to train() by name)")
    for name in settings:
        if name not in SECTION_OF:
            near = nearest(name, ["config", *TRAIN_KEYWORDS, *SECTION_OF])
            what = ("" if near is None else f" (did you mean {near}, a keyword of train()?)"
                    if near not in SECTION_OF else f" (did you mean the setting {near}?)")
            raise ConfigError(f"train() has no keyword or setting {name!r}{what}")
    flat = (config or TrainConfig()).to_dict() | settings
    cfg = TrainConfig(**flat)
    defaults = TrainConfig().to_dict()
    src = sources or Sources()
    args = Namespace(**cfg.to_dict(), **{name: getattr(src, name) for name in Sources.__dataclass_fields__},
                     out=_str(out), overwrite=overwrite, quiet=not progress, no_data_copy=no_data_copy,
                     cluster=cluster, resume_dir=_str(resume))
    args.given = {k for k, v in cfg.to_dict().items() if v != defaults[k]}
    try:
        ran = run_train(args)
    except BaseException as e:  # as the CLI: bars closed, records ended with their status, then the error
        bars.close_bars()
        record.abort_unfinished(record.end_status(e))
        raise
    if ran is None:
        raise RuntimeError("this process is a torchrun rank that writes no run record")
    summary, run_dir = ran
    refused = record.refusals(summary)
    if refused:  # as the CLI's last line
        warnings.warn(refused, RuntimeWarning, stacklevel=2)
    return TrainRun(Path(run_dir), summary, record.read_lines(Path(run_dir) / "metrics.jsonl"))


def predict(run_dir: str | os.PathLike, data: str | os.PathLike | None = None, weights: str = "best",
            embeddings: bool = False, sources: "Sources | None" = None, backend: str | None = None) -> "Predictions":
    """The model of the run recorded in ``run_dir`` (its ``best`` or ``final`` weights) on ``data`` (default:
    the run's own dataset): logits, probabilities and, with ``embeddings``, the last hidden layer. In this
    process, or with ``backend`` (``local``, ``cpu``) through the graph servers of a prepared store."""
    from dorylus_py.spelling import python_words

    with python_words():
        return _predict(run_dir, data, weights, embeddings, sources, backend)


def _predict(run_dir, data, weights, embeddings, sources, backend) -> "Predictions":
    from dorylus_py.cli_train import is_prepared_store
    from dorylus_py.errors import ConfigError
    from dorylus_py.inference import load_trained, predict_graph, run_dataset
    from dorylus_py.inference.predict import recorded_dataset

    trained = load_trained(run_dir, weights)
    if backend is None:
        return predict_graph(trained, run_dataset(trained, _str(data), sources), embeddings)
    store, sources = (_str(data), sources) if data is not None else recorded_dataset(trained)
    if not is_prepared_store(store):
        raise ConfigError(f"--backend {backend}: predict runs through graph servers on a prepared store; pass --data DIR, "
                          "a folder made by `dorylus prepare` (or its s3:// address)")
    from dorylus_py.inference.distributed import predict_distributed

    return predict_distributed(trained, store, backend, embeddings, run_dataset(trained, store, sources))


def _str(path) -> str | None:
    return None if path is None else str(path)
