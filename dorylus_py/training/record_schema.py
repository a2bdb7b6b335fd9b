"""What each file of a run record may hold, checked as it is read: a record may come from anyone (a
shared folder, a colleague's run), so it is input like any other.

One table of fields per kind of file: ``config.json`` (its settings checked as the flags are, by the
settings' own checks; the graph's counts, the data's sources), a ``metrics.jsonl`` line, ``summary.json``
and a ``tasks.jsonl`` row. Reports, the cost estimator and ``--resume`` read records only through these
readers, so every field they use has its type and range wherever it is used; a file that does not fit is
one line naming the file, the line and the field. The files themselves are read within bounds
(``jsonfile.py``: regular files only, size, depth, line length).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dorylus_py.config import SECTION_OF, SECTIONS, TrainConfig
from dorylus_py.errors import ConfigError, DataError, DorylusError
from dorylus_py.jsonfile import read_json, read_json_lines
from dorylus_py.schema import Field, check_object

MAX_SECONDS = 1e12  # a time or a duration: tasks carry Unix times (1.8e9 now)
MAX_COUNT = 2**53
COUNT = Field("int", 0, MAX_COUNT)
SECONDS = Field("float", 0, MAX_SECONDS)
ACCURACY = Field("float", 0, 1, nan=True)  # NaN: a split without vertices
TEXT = Field("str")


def _required(fields: dict[str, Field], *names: str) -> dict[str, Field]:
    return fields | {n: replace(fields[n], required=True) for n in names}


GRAPH_FIELDS = {k: COUNT for k in ("nodes", "edges", "features", "classes", "train", "val", "test", "unlabelled",
                                   "max_in_degree", "isolated")} | {"mean_in_degree": Field("float", 0)}
SOURCE_FIELDS = {"features": Field("str | None"), "labels": Field("str | None"), "masks": Field("str | None"),
                 "train_frac": Field("float", 0, 1), "val_frac": Field("float", 0, 1), "split_seed": COUNT}
# config.json beside the settings (which TrainConfig checks): what `dorylus train` adds (cli_train.py)
CONFIG_FIELDS = {
    "graph": Field("object | None", fields=GRAPH_FIELDS), "feature_norm": Field("str"),
    "graph_source": Field("str | None"), "sources": Field("object", fields=SOURCE_FIELDS),
    "cluster": Field("str | None"), "no_data_copy": Field("bool"), "store": Field("str | None"),
    "resumed_after": Field("list[int]", 0, MAX_COUNT),
}
# a graph server's counters of an epoch (metrics.jsonl "servers")
USAGE_FIELDS = {k: Field("float", 0) for k in ("bytes", "messages", "cpu_s", "loop_cpu_s", "graph_cpu_s")}
METRIC_FIELDS = _required({
    "epoch": COUNT, "loss": Field("float", nan=True), "train_acc": ACCURACY, "val_acc": ACCURACY,
    "test_acc": ACCURACY, "epoch_s": SECONDS, "wall_s": SECONDS,
    "servers": Field("list", items=USAGE_FIELDS, max_items=4096), "workers": Field("int", 1, MAX_COUNT),
}, "epoch", "loss", "train_acc", "val_acc", "test_acc", "epoch_s", "wall_s")
SUMMARY_FIELDS = {
    "status": TEXT, "backend": TEXT, "mode": TEXT, "epochs": COUNT, "final_loss": Field("float", nan=True),
    "final_train_acc": ACCURACY, "final_val_acc": ACCURACY, "final_test_acc": ACCURACY,
    "best_val_acc": Field("float", -1, 1, nan=True),  # -1: no epoch had a validation accuracy
    "best_epoch": COUNT, "test_acc_at_best_val": ACCURACY, "wall_s": SECONDS, "median_epoch_s": SECONDS,
    "job_s": SECONDS, "relaunches": COUNT, "restarts": COUNT, "dilation": Field("float", 1, 64),
}
TASK_FIELDS = _required({
    "kind": TEXT, "start": SECONDS, "end": SECONDS, "train": Field("bool"), "where": TEXT,
    "billed_ms": Field("float", 0, MAX_SECONDS * 1000), "memory_mb": Field("float", 0, 2**30),
    "epoch": COUNT, "server": Field("int", 0, 2**20), "chunk": Field("int | None", 0, 2**31),
    "layer": Field("int | None", 0, 255), "attempt": COUNT, "ok": Field("bool"), "error": TEXT,
}, "kind", "start", "end")
LAMBDA_TASK_NEEDS = ("billed_ms", "memory_mb")  # what a Lambda's row must say: what it is billed


def read_config(run_dir: str | Path, error: type[DorylusError] = DataError,
                missing: str = "missing; is it a run record (dorylus train --out)?") -> dict:
    """``config.json`` of the record ``run_dir``, checked: its settings as :func:`record_settings` reads
    them, and the fields `dorylus train` adds."""
    path = Path(run_dir) / "config.json"
    config = check_object(read_json(path, error, missing), CONFIG_FIELDS, str(path), error)
    record_settings(config, path, error)
    return config


def record_settings(config: dict, where: str | Path = "config.json",
                    error: type[DorylusError] = DataError) -> TrainConfig:
    """The settings of a record's ``config.json`` (its other fields left out), typed and each section
    checked as the flags were when it was written; ``error`` naming ``where`` and the setting if not."""
    try:
        cfg = TrainConfig.from_dict({k: v for k, v in config.items() if k in SECTION_OF})
        for name in SECTIONS:
            getattr(cfg, name).check_limits()
            getattr(cfg, name).check()
    except ConfigError as e:
        raise error(f"{where}: {e}") from None
    return cfg


def read_metrics(path: str | Path) -> list[dict]:
    """The epochs of a ``metrics.jsonl``, each line checked."""
    return [check_object(row, METRIC_FIELDS, f"{path}:{i}") for i, row in read_json_lines(path)]


def read_tasks(path: str | Path, need: tuple[str, ...] = (), why: str = "") -> list[dict]:
    """The rows of a ``tasks.jsonl``, each checked; a Lambda's must say what it was billed, and every row
    must have the fields ``need`` names: what the caller uses beyond the required ones, for ``why``."""
    rows = []
    for i, row in read_json_lines(path):
        check_object(row, TASK_FIELDS, f"{path}:{i}")
        for names, reason in ((need, why), (LAMBDA_TASK_NEEDS * row.get("where", "").endswith("lambda"),
                                            "a Lambda's row says what it was billed")):
            absent = next((n for n in names if n not in row), None)
            if absent is not None:
                raise DataError(f"{path}:{i}: no {absent} ({reason})")
        rows.append(row)
    return rows


def read_summary(path: str | Path) -> dict:
    """``summary.json``, checked."""
    return check_object(read_json(path), SUMMARY_FIELDS, str(path))
