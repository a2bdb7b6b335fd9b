"""The run record (ARCHITECTURE.md): what every run leaves in RUN_DIR, and the only input of reports.

``config.json`` (the configuration and the dataset's counts), ``metrics.jsonl`` (one line per epoch:
epoch, loss, train/val/test accuracy, epoch seconds, wall seconds), ``tasks.jsonl`` (one line per task,
for distributed backends), ``summary.json`` and ``weights.npz`` / ``best_weights.npz``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from dorylus_py.atomic import atomic_file
from dorylus_py.errors import ConfigError

METRIC_KEYS = ("epoch", "loss", "train_acc", "val_acc", "test_acc", "epoch_s", "wall_s")


class RunRecord:
    def __init__(self, run_dir: str | os.PathLike, config: dict, overwrite: bool = False):
        self.dir = Path(run_dir)
        if self.dir.exists() and any(self.dir.iterdir()) and not overwrite:
            raise ConfigError(f"{self.dir}: run folder exists and is not empty (pass --overwrite to replace it)")
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in ("metrics.jsonl", "tasks.jsonl", "summary.json", "weights.npz", "best_weights.npz"):
            (self.dir / stale).unlink(missing_ok=True)
        self._write_json("config.json", config)
        self._metrics = open(self.dir / "metrics.jsonl", "w")
        self._tasks = None

    def log_epoch(self, row: dict) -> None:
        missing = [k for k in METRIC_KEYS if k not in row]
        if missing:
            raise ValueError(f"metrics row lacks {missing}")
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()

    def rewind_metrics(self, history: list[dict]) -> None:
        """Keep only ``history`` in ``metrics.jsonl`` (a restarted job redoes the epochs after its checkpoint)."""
        self._metrics.close()
        with atomic_file(self.dir / "metrics.jsonl") as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in history))
        self._metrics = open(self.dir / "metrics.jsonl", "a")

    def log_tasks(self, rows: list[dict]) -> None:
        if self._tasks is None:
            self._tasks = open(self.dir / "tasks.jsonl", "w")
        self._tasks.writelines(json.dumps(r) + "\n" for r in rows)
        self._tasks.flush()

    def save_weights(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        with atomic_file(self.dir / name) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)

    def finish(self, summary: dict) -> None:
        self._write_json("summary.json", summary)
        self.close()

    def close(self) -> None:
        self._metrics.close()
        if self._tasks is not None:
            self._tasks.close()

    def _write_json(self, name: str, obj: dict) -> None:
        with atomic_file(self.dir / name) as tmp:
            tmp.write_text(json.dumps(obj, indent=2) + "\n")


def run_summary(history: list[dict], best: "BestTracker", wall_s: float, **fields) -> dict:
    """What ``summary.json`` holds for any trainer: final and best accuracies, time, and ``fields``
    (backend, mode, backend-specific counts)."""
    row = history[-1]
    return {
        "status": "completed", **fields, "epochs": len(history),
        "final_loss": row["loss"], "final_train_acc": row["train_acc"], "final_val_acc": row["val_acc"],
        "final_test_acc": row["test_acc"], "best_val_acc": best.best_val_acc, "best_epoch": best.best_epoch,
        "test_acc_at_best_val": best.test_acc_at_best_val, "wall_s": wall_s,
        "median_epoch_s": float(np.median([r["epoch_s"] for r in history])),
    }


class BestTracker:
    """Follows the best validation accuracy (earliest epoch wins ties) and the test accuracy there."""

    def __init__(self):
        self.best_val_acc = -1.0
        self.test_acc_at_best_val = float("nan")
        self.best_epoch = 0

    def update(self, epoch: int, val_acc: float, test_acc: float) -> bool:
        if val_acc > self.best_val_acc:
            self.best_val_acc, self.test_acc_at_best_val, self.best_epoch = val_acc, test_acc, epoch
            return True
        return False
