"""`dorylus report`: accuracy, time and cost of one or more runs, side by side, from their run records."""

from __future__ import annotations

import base64
import statistics
from collections import defaultdict
from html import escape
from pathlib import Path

from dorylus_py.config import DECENTRAL_MODES
from dorylus_py.cost.gpu import weight_server_type
from dorylus_py.cost.model import Prices, dilation_of, read_record, run_cost, value_of
from dorylus_py.cost.transfer import recorded_lambda_bytes, transfer_usd
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.models.architectures import architecture

COLUMNS = [
    ("run", "{}"), ("backend", "{}"), ("status", "{}"), ("epochs", "{}"), ("best val", "{:.4f}"), ("test@best", "{:.4f}"),
    ("model", "{}"),
    ("wall s", "{:.1f}"), ("epoch s", "{:.3f}"), ("to target s", "{}"), ("lambda calls", "{:,}"),
    ("GB-s", "{:.1f}"), ("relaunches", "{}"), ("servers $", "{:.5f}"), ("lambda $", "{:.5f}"), ("transfer $", "{:.5f}"),
    ("total $", "{:.5f}"), ("value", "{:.4g}"),
]  # fmt: skip


def run_kind(config: dict) -> str:
    """``reference``, ``local sync``, ``gossip x4`` ...: what the backend column shows."""
    if config.get("mode") in DECENTRAL_MODES:
        return f"{config['mode']} x{config.get('workers', '?')}"
    backend = config.get("backend", "?")
    return backend if backend == "reference" else f"{backend} {config.get('mode', 'sync')}"


def model_label(config: dict, run_dir: str) -> str:
    """``gcn``, ``sage``, ``gat 8x8/1`` (heads x width per head / output heads): what the model column shows.
    A record of a model this version does not know is refused."""
    try:
        arch = architecture(config.get("model", "gcn"))  # records written before --model trained GCN
    except ConfigError as e:
        raise DataError(f"{Path(run_dir) / 'config.json'}: {e}") from None
    return arch.label(config)


def report_rows(run_dirs: list[str], prices: Prices, instance: str, target_acc: float | None,
                weight_instance: str = "", task_fields: tuple = (), lambda_zones: int = 1) -> list[dict]:
    """One row per run record; ``task_fields``: (fields, why) every task row must also have (``read_record``);
    ``lambda_zones``: the zones the Lambdas ran in, which prices their traffic (``cost/transfer.py``)."""
    rows = []
    for d in run_dirs:
        config, metrics, tasks, summary = read_record(d, *task_fields)
        wall = summary.get("wall_s", metrics[-1]["wall_s"] if metrics else 0.0)  # the last epoch's, as the CLI says
        cost = run_cost(config, wall, tasks, prices, instance, weight_instance)
        transfer = transfer_usd(recorded_lambda_bytes(config, metrics), lambda_zones)  # cost/transfer.py
        total = cost.total_usd + transfer
        reached = [m["wall_s"] for m in metrics if target_acc is not None and m["val_acc"] >= target_acc]
        backend = run_kind(config)
        rows.append({
            "run": Path(d).name, "model": model_label(config, d), "backend": backend,
            "status": summary.get("status", "completed").split(":")[0],
            "_status": summary.get("status", "completed"), "epochs": len(metrics),
            "best val": summary.get("best_val_acc"), "test@best": summary.get("test_acc_at_best_val"), "wall s": wall,
            "epoch s": statistics.median(m["epoch_s"] for m in metrics) if metrics else None,
            "to target s": f"{reached[0]:.1f}" if reached else "-", "lambda calls": cost.lambda_requests,
            "GB-s": cost.lambda_gb_seconds, "relaunches": summary.get("relaunches", 0), "servers $": cost.server_usd,
            "lambda $": cost.lambda_usd, "transfer $": transfer, "total $": total,
            "value": value_of(wall, total),
            "_kinds": time_by_kind(tasks),
            "_dilation": dilation_of(config),
        })
    return rows


def time_by_kind(tasks: list[dict]) -> dict[str, float]:
    """Seconds spent per task kind (tensor tasks split by train/eval), summed over tasks."""
    out: dict[str, float] = defaultdict(float)
    for t in tasks:
        kind = t["kind"] if t.get("train", True) or t["kind"] == "eval" else f"{t['kind']} (eval)"
        out[kind] += t["end"] - t["start"]
    return dict(out)


def cell(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def text_table(rows: list[dict], columns: list[tuple[str, str]] = COLUMNS) -> str:
    cells = [[name for name, _ in columns]] + [[cell(r[name], fmt) for name, fmt in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


def sections(rows: list[dict], prices: Prices, instance: str,
             weight_instance: str = "") -> tuple[str, list[tuple[str, list[str], list[list[str]]]]]:
    """The report's content, whatever the format: an intro line and (title, header, rows) tables."""
    weight = weight_server_type(instance, weight_instance)
    servers = f"servers as {instance} at ${prices.hourly(instance)}/h"
    if weight != instance:
        servers = f"graph {servers}, weight servers as {weight} at ${prices.hourly(weight)}/h"
    intro = (f"Prices: {prices.region}, {servers}, Lambda "
             f"${prices.lambda_gb_second}/GB-s and ${prices.lambda_per_request}/request ({prices.source}; {prices.date}). "
             "Value = 1 / (hours x USD).")
    tables = [("Runs", [name for name, _ in COLUMNS], [[cell(r[name], fmt) for name, fmt in COLUMNS] for r in rows])]
    failed = [[r["run"], r["_status"]] for r in rows if r["_status"] != r["status"]]
    if failed:
        tables.append(("Why runs failed", ["run", "status"], failed))
    kinds = sorted({k for r in rows for k in r["_kinds"]})
    if kinds:
        tables.append(("Task time by kind (seconds, summed over tasks)", ["run", *kinds],
                       [[r["run"], *(f"{r['_kinds'].get(k, 0.0):.2f}" for k in kinds)] for r in rows]))
    return intro, tables


def markdown(rows: list[dict], prices: Prices, instance: str, weight_instance: str = "") -> str:
    intro, tables = sections(rows, prices, instance, weight_instance)
    lines = ["# dorylus report", "", intro]
    for title, head, body in tables:
        lines += ["", f"## {title}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines) + "\n"


def html(rows: list[dict], prices: Prices, instance: str, images: list[Path], weight_instance: str = "") -> str:
    """One self-contained page: the tables, and the PNGs inlined as data URIs."""
    intro, tables = sections(rows, prices, instance, weight_instance)
    out = ["<!doctype html>", '<html><head><meta charset="utf-8"><title>dorylus report</title>',
           "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
           "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#eee}</style></head><body>",
           "<h1>dorylus report</h1>", f"<p>{escape(intro)}</p>"]
    for title, head, body in tables:
        out.append(f"<h2>{escape(title)}</h2><table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>")
        out += ["<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>" for cells in body]
        out.append("</table>")
    for img in images:
        data = base64.b64encode(Path(img).read_bytes()).decode()
        out.append(f'<h2>{escape(Path(img).stem.replace("_", " "))}</h2><img alt="{escape(Path(img).stem)}" '
                   f'src="data:image/png;base64,{data}">')
    return "\n".join(out + ["</body></html>"]) + "\n"
