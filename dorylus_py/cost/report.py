"""`dorylus report`: accuracy, time and cost of one or more runs, side by side, from their run records."""

from __future__ import annotations

import base64
import math
import statistics
from collections import defaultdict
from html import escape
from pathlib import Path
from typing import Callable

from dorylus_py.config import DECENTRAL_MODES
from dorylus_py.cost.gpu import weight_server_type
from dorylus_py.cost.model import Prices, dilation_of, read_record, run_cost, value_of
from dorylus_py.cost.transfer import recorded_lambda_bytes, transfer_usd
from dorylus_py.cost.task_names import task_name, terms_for
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.models.architectures import architecture


def significant(digits: int) -> Callable[[float], str]:
    """``digits`` significant digits, thousands separated, never an exponent: one format for a column whose
    values span orders of magnitude (1,447 and 51,970; 0.02183 and 0.002650; 1,235 dollars)."""

    def fmt(value: float) -> str:
        if value == 0:
            return "0"
        rounded = round(value, digits - 1 - math.floor(math.log10(abs(value))))
        return f"{rounded:,.{max(0, digits - 1 - math.floor(math.log10(abs(rounded))))}f}"  # 9,999.7 -> 10,000

    return fmt


# One format per kind of column, whatever its values: a table reads down its columns.
TEXT, COUNT, ACCURACY = "{}", "{:,}", "{:.4f}"
SECONDS = "{:,.1f}"  # a run's wall time: tenths, from seconds to days
EPOCH_SECONDS = "{:,.3f}"  # an epoch's: milliseconds
GB_SECONDS = "{:,.1f}"
USD = significant(4)  # from a fraction of a cent to thousands of dollars
VALUE = significant(4)  # 1 / (hours x USD): from below 1 to millions
Format = str | Callable[[float], str]  # a str.format pattern, or a function of the value

COLUMNS: list[tuple[str, Format]] = [
    ("run", TEXT), ("backend", TEXT), ("status", TEXT), ("epochs", COUNT), ("best val", ACCURACY),
    ("test@best", ACCURACY), ("model", TEXT),
    ("wall s", SECONDS), ("epoch s", EPOCH_SECONDS), ("to target s", SECONDS), ("lambda calls", COUNT),
    ("GB-s", GB_SECONDS), ("relaunches", COUNT), ("servers $", USD), ("lambda $", USD), ("transfer $", USD),
    ("total $", USD), ("value", VALUE),
]  # fmt: skip
MARKDOWN_MARK = "# dorylus report\n"  # the first line of a Markdown report: what --overwrite may replace
HTML_MARK = '<meta name="generator" content="dorylus report">'  # in an HTML report's head, alike
TERMS_TITLE = "What the kinds of work are"


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
            "run": run_name(d), "model": model_label(config, d), "backend": backend,
            "status": summary.get("status", "completed").split(":")[0],
            "_status": summary.get("status", "completed"), "epochs": len(metrics),
            "best val": summary.get("best_val_acc"), "test@best": summary.get("test_acc_at_best_val"), "wall s": wall,
            "epoch s": statistics.median(m["epoch_s"] for m in metrics) if metrics else None,
            "to target s": reached[0] if reached else None, "lambda calls": cost.lambda_requests,
            "GB-s": cost.lambda_gb_seconds, "relaunches": summary.get("relaunches", 0), "servers $": cost.server_usd,
            "lambda $": cost.lambda_usd, "transfer $": transfer, "total $": total,
            "value": value_of(wall, total),
            "_kinds": time_by_kind(tasks),
            "_dilation": dilation_of(config),
        })
    return rows


def run_name(run_dir: str) -> str:
    """What the run column shows: the record's folder name (``.`` and ``..`` resolved)."""
    name = Path(run_dir).name
    return name if name not in ("", ".", "..") else Path(run_dir).resolve().name


def time_by_kind(tasks: list[dict]) -> dict[str, float]:
    """Seconds spent per kind of work (``task_names.py``: the evaluation pass apart), summed over tasks."""
    out: dict[str, float] = defaultdict(float)
    for t in tasks:
        if t["kind"] == "lease":  # a Lambda's lease: billing, not work
            continue
        out[task_name(t["kind"], t.get("train", True))] += t["end"] - t["start"]
    return dict(out)


def cell(value, fmt: Format) -> str:
    """``value`` in its column's format; ``-`` for none (a run that never reached the target) or not a number
    (the value of a run that cost nothing)."""
    if value is None or isinstance(value, float) and not math.isfinite(value):
        return "-"
    return fmt(value) if callable(fmt) else fmt.format(value)


def text_table(rows: list[dict], columns: list[tuple[str, Format]] = COLUMNS) -> str:
    cells = [[name for name, _ in columns]] + [[cell(r[name], fmt) for name, fmt in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


def price_note(prices: Prices, instance: str, weight_instance: str = "") -> str:
    """What the prices are, where they come from and when they held: the line above a report's tables."""
    weight = weight_server_type(instance, weight_instance)
    servers = f"servers as {instance} at ${prices.hourly(instance)}/h"
    if weight != instance:
        servers = f"graph {servers}, weight servers as {weight} at ${prices.hourly(weight)}/h"
    source = prices.source if prices.source not in ("", "?") else "a price table that names no source"
    date = f"as of {prices.date}" if prices.date not in ("", "?") else "of no stated date"
    return (f"Runs priced as if on AWS, at the prices for {prices.region} from {source}, {date}: {servers}; Lambda "
            f"${_plain(prices.lambda_gb_second)} per GB-second and ${_plain(prices.lambda_per_request * 1e6, 2)} per "
            "million requests. Value = 1 / (hours x USD): higher is more training for the time and the money.")


def _plain(x: float, decimals: int = 0) -> str:
    """A price as a price list writes it: 0.0000166667, 0.20 (no exponent; at least ``decimals`` decimals)."""
    text = f"{x:.12f}".rstrip("0")
    whole, _, fraction = text.partition(".")
    fraction = fraction.ljust(decimals, "0")
    return whole + ("." + fraction if fraction else "")


def sections(rows: list[dict], prices: Prices, instance: str,
             weight_instance: str = "") -> tuple[str, list[tuple[str, list[str], list[list[str]]]]]:
    """The report's content, whatever the format: the price note and (title, header, rows) tables."""
    tables = [("Runs", [name for name, _ in COLUMNS], [[cell(r[name], fmt) for name, fmt in COLUMNS] for r in rows])]
    failed = [[r["run"], r["_status"]] for r in rows if r["_status"] != r["status"]]
    if failed:
        tables.append(("Why runs failed", ["run", "status"], failed))
    kinds = sorted({k for r in rows for k in r["_kinds"]})
    if kinds:
        tables.append(("Task time by kind of work (seconds, summed over tasks)", ["run", *kinds],
                       [[r["run"], *(f"{r['_kinds'].get(k, 0.0):,.2f}" for k in kinds)] for r in rows]))
        tables.append((TERMS_TITLE, ["term", "meaning"], [list(t) for t in terms_for(kinds)]))
    return price_note(prices, instance, weight_instance), tables


def markdown(rows: list[dict], prices: Prices, instance: str, weight_instance: str = "") -> str:
    intro, tables = sections(rows, prices, instance, weight_instance)
    lines = [MARKDOWN_MARK.rstrip("\n"), "", intro]
    for title, head, body in tables:
        lines += ["", f"## {title}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines) + "\n"


def html(rows: list[dict], prices: Prices, instance: str, images: list[Path], weight_instance: str = "") -> str:
    """One self-contained page: the tables, and the PNGs inlined as data URIs."""
    intro, tables = sections(rows, prices, instance, weight_instance)
    out = ["<!doctype html>", f'<html><head><meta charset="utf-8">{HTML_MARK}<title>dorylus report</title>',
           "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
           "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#eee}"
           ".text td{text-align:left}</style></head><body>",
           "<h1>dorylus report</h1>", f"<p>{escape(intro)}</p>"]
    for title, head, body in tables:
        kind = ' class="text"' if title == TERMS_TITLE else ""
        out.append(f"<h2>{escape(title)}</h2><table{kind}><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head)
                   + "</tr>")
        out += ["<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>" for cells in body]
        out.append("</table>")
    for img in images:
        data = base64.b64encode(Path(img).read_bytes()).decode()
        out.append(f'<h2>{escape(image_title(Path(img).stem))}</h2><img alt="{escape(Path(img).stem)}" '
                   f'src="data:image/png;base64,{data}">')
    return "\n".join(out + ["</body></html>"]) + "\n"


def image_title(stem: str) -> str:
    """A plot's heading, from its file's name (``plots.py`` names them)."""
    titles = {"accuracy_vs_time": "Validation accuracy against wall time",
              "accuracy_vs_cost": "Validation accuracy against cost (USD, as if on AWS)"}
    return titles.get(stem, f"Pipeline timeline: {stem.removeprefix('timeline_')}")
