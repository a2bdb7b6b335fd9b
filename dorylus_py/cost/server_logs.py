"""`dorylus report RUN_DIR --servers`: what each server of a run did, from its log's start and end lines.

Every graph and weight server writes one ``start {json}`` line when it has loaded its share of the job
and one ``end {json}`` line when it stops (``RUN_DIR/logs/NAME.log``); a restarted job appends a new
pair. The table shows each server's last start and end: partition size and ghosts, peers, its Lambda
pool, epochs, tasks, relaunches, bytes sent and received, a graph server's per-layer buffers (what
``--remat`` lowers), peak memory. A log is read a line at a time, and what the table shows of those
lines is checked (:data:`START_FIELDS`, :data:`END_FIELDS`): a record's logs are input like its files.
"""

from __future__ import annotations

from pathlib import Path

from dorylus_py.errors import DataError
from dorylus_py.jsonfile import MAX_LINE_BYTES, bounded_lines, open_regular, parse_json
from dorylus_py.schema import Field, check_object

COLUMNS = [
    ("server", "{}"), ("vertices", "{:,}"), ("edges", "{:,}"), ("ghosts", "{:,}"), ("peers", "{}"), ("tensor work", "{}"),
    ("restart", "{}"), ("epochs", "{}"), ("tasks", "{:,}"), ("relaunches", "{:,}"), ("sent MB", "{:,.1f}"),
    ("received MB", "{:,.1f}"), ("updates", "{:,}"), ("buffers MB", "{:,.1f}"), ("peak MiB", "{:,.0f}"),
]  # fmt: skip


COUNT, BYTES = Field("int", 0, 2**53), Field("float", 0)
START_FIELDS = {"vertices": COUNT, "edges": COUNT, "ghosts": COUNT, "peers": COUNT, "platform": Field("str"),
                "restart": COUNT, "buffer_bytes": BYTES}  # what the table shows of the start line
END_FIELDS = {"epochs": COUNT, "tasks": COUNT, "relaunches": COUNT, "updates": COUNT, "bytes_sent": BYTES,
              "bytes_received": BYTES, "peak_rss_mb": BYTES}
TAGS = {b" start {": START_FIELDS, b" end {": END_FIELDS}


def last_start_and_end(path: Path) -> tuple[dict, dict]:
    """The last ``start`` and ``end`` lines of a server's log, each checked against its fields ({} if
    none). Read a line at a time; lines over ``MAX_LINE_BYTES`` are no such line."""
    found: dict[bytes, tuple[int, bytes]] = {}
    with open_regular(path) as f:
        for i, line in enumerate(bounded_lines(f, MAX_LINE_BYTES), 1):
            for tag in TAGS:
                if line is not None and tag in line:
                    found[tag] = i, line
    out = [{}, {}]
    for k, (tag, fields) in enumerate(TAGS.items()):
        if tag in found:
            i, line = found[tag]
            out[k] = check_object(parse_json(b"{" + line.partition(tag)[2], f"{path}:{i}"), fields, f"{path}:{i}")
    return out[0], out[1]


def server_rows(run_dir: str | Path) -> list[dict]:
    """One row per server log of a run record."""
    logs = sorted((Path(run_dir) / "logs").glob("*-server-*.log"))
    if not logs:
        raise DataError(f"{run_dir}: no server logs (logs/*-server-*.log): was it a distributed run?")
    rows = []
    for path in logs:
        start, end = last_start_and_end(path)
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
