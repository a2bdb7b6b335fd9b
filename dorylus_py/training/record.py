"""The run record (ARCHITECTURE.md): what every run leaves in RUN_DIR, and the only input of reports.

``config.json`` (the configuration and the dataset's counts), ``metrics.jsonl`` (one line per epoch:
epoch, loss, train/val/test accuracy, epoch seconds, wall seconds), ``tasks.jsonl`` (one line per task,
for distributed backends), ``leases.jsonl`` (one line per Lambda invocation, a lease that served tasks:
what it was billed), ``summary.json`` and ``weights.npz`` / ``best_weights.npz``.

``--overwrite`` deletes only what :func:`record_files` says dorylus wrote there (these files, ``logs/``,
``checkpoints/``, the record's copy of the data in ``partitions/`` as its manifest lists it): a folder
holding anything else is refused, naming it, with nothing deleted.

However a run ends, its record ends with ``summary.json``: :meth:`RunRecord.finish` writes status
``completed``, :meth:`RunRecord.abort` ``interrupted`` or ``failed: <line>`` with what the epochs
logged so far give. The epoch fields of a summary (final and best accuracies, ``wall_s``) are always
computed here, from every epoch the record holds, so a resumed run's summary covers the whole run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import weakref
from pathlib import Path

import numpy as np

from dorylus_py.atomic import Owned, atomic_file, check_replaceable, remove_owned
from dorylus_py.errors import ConfigError, DorylusError, interrupted_by_user
from dorylus_py.jsonfile import read_json_lines
from dorylus_py.timescale import model_times
from dorylus_py.training.record_schema import read_metrics, read_tasks

RECORD_FILES = ("config.json", "metrics.jsonl", "tasks.jsonl", "leases.jsonl", "summary.json", "weights.npz",
                "best_weights.npz", "graph.npz", "clusters.npy",  # clusters and graph: what gossip / all-reduce workers read
                "hosts.json")  # a scale-model run's hosts (dorylus_py/scale_model.py)
# atomic_file's temporary files, which a killed run may leave
_TEMP = re.compile(r"\.(?:%s)\.[a-z0-9_]{8}\.tmp" % "|".join(map(re.escape, RECORD_FILES)))
_LOG = re.compile(r"[A-Za-z0-9_.-]+\.log")  # logs/ROLE.log: the servers' and workers' output
METRIC_KEYS = ("epoch", "loss", "train_acc", "val_acc", "test_acc", "epoch_s", "wall_s")
_unfinished: "weakref.WeakSet[RunRecord]" = weakref.WeakSet()  # records of this process without a summary yet
_stopped: list[Path] = []  # folders of this process's records that ended without completing


class RunRecord:
    """A run folder being written. ``continue_after=E`` reopens an existing record to go on after its
    epoch E (a resumed run): later epochs' lines are dropped, and logged wall times continue its clock."""

    def __init__(self, run_dir: str | os.PathLike, config: dict, overwrite: bool = False,
                 continue_after: int | None = None):
        self.dir = Path(run_dir)
        self.history: list[dict] = []  # every epoch of the record, as in metrics.jsonl
        self.best = BestTracker()
        self.summary: dict | None = None  # once written
        self._best_weights: dict[str, np.ndarray] | None = None
        self._logs: dict[str, object] = {}  # tasks.jsonl, leases.jsonl: open once written to
        if continue_after is None:
            self._create(overwrite)
        else:
            self._reopen(continue_after)
        self._wall_offset = self.history[-1]["wall_s"] if self.history else 0.0
        self._first_epoch = self.history[-1]["epoch"] + 1 if self.history else 1  # this run's first
        self._write_json("config.json", config)
        self._dilation = float(config.get("dilation", 1.0) or 1.0)  # a scale model's (timescale.py)
        self._metrics = open(self.dir / "metrics.jsonl", "a")
        _unfinished.add(self)

    def _create(self, overwrite: bool) -> None:
        if self.dir.exists() and any(self.dir.iterdir()):
            if not overwrite:
                raise ConfigError(f"{self.dir}: run folder exists and is not empty (pass --overwrite to replace it, or "
                                  f"--resume {self.dir} to continue an interrupted distributed run)")
            if not (self.dir / "config.json").is_file():
                raise ConfigError(f"{self.dir}: not a run record (no config.json); --overwrite replaces only run records")
            owned = record_files(self.dir)
            check_replaceable(self.dir, owned, True, "a run record's files")
            remove_owned(self.dir, owned)
        self.dir.mkdir(parents=True, exist_ok=True)

    def _reopen(self, after: int) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        old = read_metrics(self.dir / "metrics.jsonl") if (self.dir / "metrics.jsonl").exists() else []
        for row in (r for r in old if r["epoch"] <= after):
            self.history.append(row)
            self.best.update(row["epoch"], row["val_acc"], row["test_acc"])
        self._rewrite_lines("metrics.jsonl", self.history)
        for name in ("tasks.jsonl", "leases.jsonl"):
            if (self.dir / name).exists():
                rows = read_tasks(self.dir / name, ("epoch",), "--resume keeps the rows of the epochs it keeps")
                self._rewrite_lines(name, [t for t in rows if t["epoch"] <= after])
        try:
            old_best = json.loads((self.dir / "summary.json").read_text()).get("best_epoch")
        except (OSError, ValueError):
            old_best = None
        if not self.history or old_best != self.best.best_epoch:  # best_weights.npz is of an epoch dropped
            (self.dir / "best_weights.npz").unlink(missing_ok=True)
        for stale in ("summary.json", "weights.npz"):
            (self.dir / stale).unlink(missing_ok=True)

    # --- while the run goes on ---------------------------------------------------------------------

    def log_epoch(self, row: dict) -> bool:
        """Append one metrics row; return True when its validation accuracy is the best so far."""
        missing = [k for k in METRIC_KEYS if k not in row]
        if missing:
            raise ValueError(f"metrics row lacks {missing}")
        if self._wall_offset:  # a resumed run's clock goes on from the record's last epoch
            row = row | {"wall_s": row["wall_s"] + self._wall_offset}
        self.history.append(row)
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        return self.best.update(row["epoch"], row["val_acc"], row["test_acc"])

    def rewind_metrics(self, history: list[dict]) -> None:
        """Drop the epochs after ``history``'s last (a restarted job redoes the epochs after its
        checkpoint); a resumed run's earlier epochs stay."""
        last = history[-1]["epoch"] if history else (self._first_epoch - 1)
        self._metrics.close()
        self.history = [r for r in self.history if r["epoch"] <= last]
        self.best = BestTracker.over(self.history)
        self._rewrite_lines("metrics.jsonl", self.history)
        self._metrics = open(self.dir / "metrics.jsonl", "a")

    def log_tasks(self, rows: list[dict]) -> None:
        """Task rows into ``tasks.jsonl``; a Lambda lease's (``kind`` ``lease``: an invocation, billed for its
        whole run, which served tasks) into ``leases.jsonl``."""
        for name, part in (("tasks.jsonl", [r for r in rows if r.get("kind") != "lease"]),
                           ("leases.jsonl", [r for r in rows if r.get("kind") == "lease"])):
            if part:
                if name not in self._logs:
                    self._logs[name] = open(self.dir / name, "a")
                self._logs[name].writelines(json.dumps(r) + "\n" for r in part)
                self._logs[name].flush()

    def save_weights(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        with atomic_file(self.dir / name) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)

    def keep_best_weights(self, arrays: dict[str, np.ndarray]) -> None:
        """The weights of the best epoch so far, held until the record ends and then written as
        ``best_weights.npz`` (by :meth:`finish` or :meth:`abort`). Pass copies."""
        self._best_weights = arrays

    # --- the end -----------------------------------------------------------------------------------

    def finish(self, summary: dict) -> dict:
        """The run completed: write ``summary.json`` (``summary``'s fields, status ``completed``, the
        epoch fields recomputed over every epoch of the record) and the held best weights."""
        return self._end("completed", summary)

    def abort(self, status: str, **fields) -> dict | None:
        """The run stopped early (``status``: ``interrupted`` or ``failed: <line>``): write a partial
        ``summary.json`` with ``fields`` and what the epochs logged so far give, and the held best
        weights. Does nothing once the record has ended, and never raises: it runs on the way out of
        an error, which must stay the error the user sees."""
        if self.summary is not None:
            return None
        try:
            return self._end(status, fields)
        except Exception as e:  # noqa: BLE001  (a full disk must not hide the original error)
            logging.getLogger(__name__).warning("%s: could not write summary.json (%s)", self.dir, e)
            return None

    def _end(self, status: str, fields: dict) -> dict:
        summary = {"status": status, **{k: v for k, v in fields.items() if k != "status"},
                   **epoch_summary(self.history, self.best)}
        summary |= model_times(self._dilation, summary)
        if self._best_weights is not None:
            self.save_weights("best_weights.npz", self._best_weights)
        self._write_json("summary.json", summary)
        self.summary = summary
        if status != "completed":
            _stopped.append(self.dir)
        self.close()
        return summary

    def close(self) -> None:
        _unfinished.discard(self)
        self._metrics.close()
        for f in self._logs.values():
            f.close()

    def _write_json(self, name: str, obj: dict) -> None:
        with atomic_file(self.dir / name) as tmp:
            tmp.write_text(json.dumps(obj, indent=2) + "\n")

    def _rewrite_lines(self, name: str, rows: list[dict]) -> None:
        with atomic_file(self.dir / name) as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))


def record_files(run_dir: Path) -> Owned:
    """What dorylus writes in a run record (what ``--overwrite`` may delete): :data:`RECORD_FILES` and
    their temporary files, ``logs/*.log``, checkpoint files in ``checkpoints/``, and in ``partitions/``
    what its manifest lists."""
    from dorylus_py.checkpoint import is_checkpoint_file
    from dorylus_py.partition.store import store_files

    store = store_files(Path(run_dir) / "partitions")

    def owned(rel: str, is_dir: bool) -> bool:
        top, _, rest = rel.partition("/")
        if not rest:
            if is_dir:
                return top in ("logs", "checkpoints", "partitions")
            return top in RECORD_FILES or bool(_TEMP.fullmatch(top))
        if top == "logs":
            return not is_dir and bool(_LOG.fullmatch(rest))
        if top == "checkpoints":
            return not is_dir and is_checkpoint_file(rest)
        return top == "partitions" and store(rest, is_dir)

    return owned


def abort_unfinished(status: str) -> list[Path]:
    """End every record of this process that has no summary yet (the CLI's last word on an error);
    return the folders of the records that ended without completing since the last call, oldest first."""
    for record in list(_unfinished):
        record.abort(status)
    stopped = list(_stopped)
    _stopped.clear()
    return stopped


def end_record(run_dir: str | os.PathLike, status: str) -> None:
    """End a record that other processes wrote (the decentralised workers), once they are stopped:
    ``summary.json`` with ``status`` and what its logged epochs give; nothing if it has one already.
    Never raises: it runs on the way out of an error, which must stay the error the user sees."""
    run_dir = Path(run_dir)
    if (run_dir / "summary.json").exists() or not (run_dir / "config.json").exists():
        return
    try:
        path = run_dir / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        history = [json.loads(x) for x in lines if x.endswith("}")]  # a killed writer may leave half a line
        with atomic_file(run_dir / "summary.json") as tmp:
            tmp.write_text(json.dumps(summary_of_epochs(history, status), indent=2) + "\n")
        _stopped.append(run_dir)
    except Exception as e:  # noqa: BLE001
        logging.getLogger(__name__).warning("%s: could not write summary.json (%s)", run_dir, e)


def end_status(error: BaseException) -> str:
    """A stopped run's ``status``: ``interrupted`` when Ctrl-C is behind ``error``, else ``failed: <line>``."""
    if interrupted_by_user(error):
        return "interrupted"
    line = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"failed: {line}" if isinstance(error, DorylusError) else f"failed: {type(error).__name__}: {line}"


def read_lines(path: Path) -> list:
    """The rows of a ``.jsonl`` file, read within bounds (``jsonfile.py``); a broken line is a one-line
    error. Unchecked: a record's readers use ``record_schema.py``'s, which check each row's fields."""
    return [row for _, row in read_json_lines(path)]


def summary_of_epochs(history: list[dict], status: str) -> dict:
    """A summary from the metrics rows alone (a record whose run did not write one)."""
    return {"status": status, **epoch_summary(history, BestTracker.over(history))}


def epoch_summary(history: list[dict], best: "BestTracker") -> dict:
    """The summary fields that the epochs give: final and best accuracies, and ``wall_s``, the last
    epoch's wall time (the same clock as ``metrics.jsonl``; what reports show)."""
    if not history:
        return {"epochs": 0}
    row = history[-1]
    return {
        "epochs": len(history), "final_loss": row["loss"], "final_train_acc": row["train_acc"],
        "final_val_acc": row["val_acc"], "final_test_acc": row["test_acc"], "best_val_acc": best.best_val_acc,
        "best_epoch": best.best_epoch, "test_acc_at_best_val": best.test_acc_at_best_val, "wall_s": row["wall_s"],
        "median_epoch_s": float(np.median([r["epoch_s"] for r in history])),
    }


REFUSAL_FIELDS = ("refused_gradients", "duplicate_gradients", "refused_messages")  # a distributed run's


def refusals(summary: dict) -> str | None:
    """The line a run that refused or dropped anything ends with (issue 52: a frozen run said only
    ``completed``, its one trace a counter); None when nothing was. A genuine run refuses nothing: a weight
    server gets each gradient once, and every message a process refuses is forged or malformed."""
    g, d, m = (summary.get(k) or 0 for k in REFUSAL_FIELDS)
    if not (g or d or m):
        return None
    return (f"this run refused {g} gradient(s) and {m} message(s) in all, and dropped {d} duplicate gradient(s): a "
            f"peer with the job key may have tried to steer it (summary.json {', '.join(REFUSAL_FIELDS)}; the "
            "servers' logs in the run record say more)")


def run_summary(history: list[dict], best: "BestTracker", job_s: float, **fields) -> dict:
    """What ``summary.json`` holds for any trainer: status, ``fields`` (backend, mode, backend-specific
    counts), the epoch fields and ``job_s``: the whole job, start-up and shutdown included."""
    return {"status": "completed", **fields, **epoch_summary(history, best), "job_s": job_s}


class BestTracker:
    """Follows the best validation accuracy (earliest epoch wins ties) and the test accuracy there."""

    def __init__(self):
        self.best_val_acc = -1.0
        self.test_acc_at_best_val = float("nan")
        self.best_epoch = 0

    @classmethod
    def over(cls, history: list[dict]) -> "BestTracker":
        """The tracker after every metrics row of ``history``."""
        best = cls()
        for row in history:
            best.update(row["epoch"], row["val_acc"], row["test_acc"])
        return best

    def update(self, epoch: int, val_acc: float, test_acc: float) -> bool:
        if val_acc > self.best_val_acc:
            self.best_val_acc, self.test_acc_at_best_val, self.best_epoch = val_acc, test_acc, epoch
            return True
        return False
