"""A run record as `dorylus train --backend local` writes one (every file a report, `--servers`, `--plots`
and `cost estimate --calibration` read), and the ways the hostile suite breaks one file of it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from dorylus_py.config import TrainConfig

GRAPH = {"nodes": 600, "edges": 6000, "features": 16, "classes": 4, "train": 60, "val": 60, "test": 120,
         "unlabelled": 0, "max_in_degree": 31, "mean_in_degree": 10.0, "isolated": 0}
T0 = 1_796_567_721.0  # the Unix time the tasks ran at
EPOCHS, SERVERS, CHUNKS = 3, 2, 2
LOG_START = "2026-12-06 14:35:21,294 INFO graph server {k} start "
LOG_END = "2026-12-06 14:35:25,367 INFO graph server {k} end "


def config() -> dict:
    cfg = TrainConfig(backend="local", graph_servers=SERVERS, lambdas=2, chunks=CHUNKS, epochs=EPOCHS, hidden=8)
    return cfg.to_dict() | {"feature_norm": "row", "graph": GRAPH, "graph_source": "g.npz", "cluster": None,
                            "sources": {"features": None, "labels": None, "masks": None, "train_frac": 0.1,
                                        "val_frac": 0.1, "split_seed": 0}, "no_data_copy": False, "store": None}


def tasks() -> list[dict]:
    """Every server's tasks of every epoch, as the graph servers report them; Lambda tasks of the first
    layer take longer (more work), so the calibration's regression has something to fit."""
    rows, t = [], T0
    stages = [("gather", 0, None), ("fwd", 0, "c"), ("gather", 1, None), ("fwd", 1, "c"), ("loss", 1, "c"),
              ("eval", 1, "c"), ("bwd", 1, "c"), ("gather_bwd", 1, None), ("bwd", 0, "c")]
    for epoch in range(1, EPOCHS + 1):
        for k in range(SERVERS):
            for kind, layer, per_chunk in stages:
                for chunk in (range(CHUNKS) if per_chunk else [None]):
                    lam = per_chunk is not None
                    seconds = (0.30 if layer == 0 else 0.12) + 0.01 * k if lam else 0.05
                    rows.append({"kind": kind, "train": kind != "eval", "server": k, "chunk": chunk, "epoch": epoch,
                                 "layer": layer, "attempt": 1, "where": "local-lambda" if lam else "graph-server",
                                 "start": t, "end": t + seconds, "billed_ms": int(seconds * 1000) + 1 if lam else 0,
                                 "memory_mb": 3008 if lam else 0, "ok": True, "error": ""})
                    t += seconds / 2
    rows.append({"kind": "resize", "train": True, "server": 0, "chunk": None, "epoch": 2, "layer": None, "attempt": 0,
                 "where": "autotuner", "start": t, "end": t, "billed_ms": 0, "memory_mb": 0, "ok": True, "error": "",
                 "size": 3, "reason": "idle Lambdas"})
    return rows


def metrics() -> list[dict]:
    usage = {"bytes": 9055428.0, "messages": 89.0, "cpu_s": 0.14, "loop_cpu_s": 0.085, "graph_cpu_s": 0.015}
    return [{"epoch": e, "loss": 1.4 - 0.1 * e, "train_acc": 0.3 + 0.1 * e, "val_acc": 0.25 + 0.05 * e,
             "test_acc": 0.2 + 0.05 * e, "epoch_s": 2.0 if e > 1 else 4.0, "wall_s": 2.0 * e + 2.0,
             "servers": [usage, usage | {"bytes": 9055000.0}]} for e in range(1, EPOCHS + 1)]


def summary() -> dict:
    return {"status": "completed", "backend": "local", "mode": "sync", "relaunches": 0, "restarts": 0,
            "epochs": EPOCHS, "final_loss": 1.1, "final_train_acc": 0.6, "final_val_acc": 0.4, "final_test_acc": 0.35,
            "best_val_acc": 0.4, "best_epoch": 3, "test_acc_at_best_val": 0.35, "wall_s": 8.0, "median_epoch_s": 2.0,
            "job_s": 9.0}


def server_log(k: int) -> str:
    start = {"rank": k, "vertices": 300, "edges": 3000, "ghosts": 140, "peers": 1, "chunks": CHUNKS,
             "platform": "local-lambda", "buffer_bytes": 770960, "first_epoch": 1, "restart": 0}
    end = {"rank": k, "epochs": EPOCHS, "tasks": 48, "relaunches": 0, "bytes_sent": 17615716,
           "bytes_received": 1789440, "peak_rss_mb": 272.0}
    return (LOG_START.format(k=k) + json.dumps(start) + "\n" + "2026-12-06 14:35:22,000 INFO epoch 1 done\n"
            + LOG_END.format(k=k) + json.dumps(end) + "\n")


def write_record(d: Path) -> Path:
    (d / "logs").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config(), indent=2))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics()))
    (d / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tasks()))
    (d / "summary.json").write_text(json.dumps(summary(), indent=2))
    for k in range(SERVERS):
        (d / "logs" / f"graph-server-{k}.log").write_text(server_log(k))
    return d


# --- breaking one file --------------------------------------------------------------------------------

FILES = ("config.json", "metrics.jsonl", "tasks.jsonl", "summary.json", "logs/graph-server-0.log")


def replace_with(path: Path, what: str | bytes) -> None:
    """``path`` becomes ``what``: bytes, or ``folder``, ``fifo``, ``device`` (a link to /dev/zero)."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if what == "folder":
        path.mkdir()
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "device":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(what)


def edit_json(path: Path, edit) -> None:
    """``edit(value)`` the JSON of ``path`` (returning the new value); of a ``.jsonl``, its second line; of a
    log, its start line's JSON."""
    if path.suffix == ".json":
        path.write_bytes(dumps(edit(json.loads(path.read_text()))))
        return
    lines = path.read_text().splitlines()
    i, head, tail = 1, "", lines[1]
    if path.suffix == ".log":
        i, (head, _, tail) = 0, lines[0].partition(" start ")
        head += " start "
    lines[i] = head + dumps(edit(json.loads(tail))).decode()
    path.write_text("\n".join(lines) + "\n")


def dumps(value) -> bytes:
    """JSON text of ``value`` (NaN as NaN); a :class:`Raw` in it is written as its text (a 5,000-digit number)."""
    raws: dict[str, str] = {}

    def placeholder(raw: Raw) -> str:
        raws[f"@raw{len(raws)}@"] = raw.text
        return f"@raw{len(raws) - 1}@"

    text = json.dumps(value, default=placeholder)
    for key, raw in raws.items():
        text = text.replace(f'"{key}"', raw, 1)
    return text.encode()


class Raw:
    """JSON text put in as it is: what json.dumps would not write."""

    def __init__(self, text: str):
        self.text = text


def deep(n: int = 100_000) -> Raw:
    return Raw("[" * n + "]" * n)
