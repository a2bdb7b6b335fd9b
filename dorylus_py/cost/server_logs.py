"""`dorylus report RUN_DIR --servers`: what each server of a run did, from its log's start and end lines.

Every graph and weight server writes one ``start {json}`` line when it has loaded its share of the job
and one ``end {json}`` line when it stops (``RUN_DIR/logs/NAME.log``); a restarted job appends a new
pair. The table shows each server's last start and end: partition size and ghosts, peers, its Lambda
pool, epochs, tasks, relaunches, bytes sent and received, a graph server's per-layer buffers (what
``--remat`` lowers), peak memory.
"""

from __future__ import annotations

import json
from pathlib import Path

from dorylus_py.errors import DataError

COLUMNS = [
    ("server", "{}"), ("vertices", "{:,}"), ("edges", "{:,}"), ("ghosts", "{:,}"), ("peers", "{}"), ("tensor work", "{}"),
    ("restart", "{}"), ("epochs", "{}"), ("tasks", "{:,}"), ("relaunches", "{:,}"), ("sent MB", "{:,.1f}"),
    ("received MB", "{:,.1f}"), ("updates", "{:,}"), ("buffers MB", "{:,.1f}"), ("peak MiB", "{:,.0f}"),
]  # fmt: skip


def _last(lines: list[str], tag: str) -> dict:
    for line in reversed(lines):
        head, sep, rest = line.partition(f" {tag} {{")
        if sep:
            try:
                return json.loads("{" + rest)
            except json.JSONDecodeError:
                return {}
    return {}


def server_rows(run_dir: str | Path) -> list[dict]:
    """One row per server log of a run record."""
    logs = sorted((Path(run_dir) / "logs").glob("*-server-*.log"))
    if not logs:
        raise DataError(f"{run_dir}: no server logs (logs/*-server-*.log): was it a distributed run?")
    rows = []
    for path in logs:
        lines = path.read_text(errors="replace").splitlines()
        start, end = _last(lines, "start"), _last(lines, "end")
        rows.append({
            "server": path.stem, "vertices": start.get("vertices"), "edges": start.get("edges"),
            "ghosts": start.get("ghosts"), "peers": start.get("peers"), "tensor work": start.get("platform"),
            "restart": start.get("restart"), "epochs": end.get("epochs"), "tasks": end.get("tasks"),
            "relaunches": end.get("relaunches"),
            "sent MB": end["bytes_sent"] / 1e6 if "bytes_sent" in end else None,
            "received MB": end["bytes_received"] / 1e6 if "bytes_received" in end else None,
            "updates": end.get("updates"),
            "buffers MB": start["buffer_bytes"] / 1e6 if "buffer_bytes" in start else None,  # graph servers' layer arrays
            "peak MiB": end.get("peak_rss_mb"),
        })
    return rows


def server_table(rows: list[dict]) -> str:
    cells = [[name] + ["-" if r[name] is None else fmt.format(r[name]) for name, fmt in COLUMNS[1:]]
             for r in rows for name in [r["server"]]]
    header = [name for name, _ in COLUMNS]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    out = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)
