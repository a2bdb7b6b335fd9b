"""How much of a Lambda run's time its graph servers keep no task out on a Lambda (issue 53): the upper
bound on what leases that leave between stages could save, read from a run record's ``tasks.jsonl``.

Per graph server, over the epochs from ``--from-epoch`` on: the share of the span during which some
task of the server is out on a Lambda, the gaps between those stretches (count per epoch, median, in
model milliseconds: the record's times / its D, as ``dorylus report`` reads them), and the share of the
span in gaps longer than 50 and 100 ms (what a lease that leaves at such a gap, and is invoked again in
time, would stop paying for). The record is read and checked as ``dorylus report`` reads it.

    python benchmarks/lease_gaps.py RUN_DIR [RUN_DIR ...] [--from-epoch 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dorylus_py.cost.model import read_record
from dorylus_py.errors import DorylusError


def stretches(spans: list[tuple[float, float]]) -> tuple[float, list[float]]:
    """``(time with a task out, the gaps between)`` of ``spans`` (start, end), in their units."""
    spans = sorted(spans)
    out, gaps, (start, end) = 0.0, [], spans[0]
    for s, e in spans[1:]:
        if s > end:
            out, gaps, (start, end) = out + end - start, gaps + [s - end], (s, e)
        else:
            end = max(end, e)
    return out + end - start, gaps


def report(run: Path, first_epoch: int) -> list[str]:
    _, _, tasks, _ = read_record(run, ("epoch", "server"), "lease_gaps.py counts a Lambda task by its epoch and server")
    tasks = [t for t in tasks if t["where"] == "local-lambda" and t["kind"] != "lease" and t["epoch"] >= first_epoch]  # work, not billing
    if not tasks:
        raise DorylusError(f"{run}: no Lambda task from epoch {first_epoch} on in tasks.jsonl")
    epochs, lines = len({t["epoch"] for t in tasks}), []
    for server in sorted({t["server"] for t in tasks}):
        spans = [(t["start"], t["end"]) for t in tasks if t["server"] == server]
        span = max(e for _, e in spans) - min(s for s, _ in spans)
        out, gaps = stretches(spans)
        ms = sorted(g * 1e3 for g in gaps)
        over = lambda limit_ms: 100 * sum(g for g in gaps if g * 1e3 > limit_ms) / span  # noqa: E731
        median = f"{ms[len(ms) // 2]:.0f}" if ms else "-"
        lines.append(f"{run.name} server {server}: a task out {100 * out / span:.0f} % of the span; "
                     f"{len(gaps) / epochs:.1f} gaps an epoch, median {median} model ms; "
                     f"gaps over 50 ms {over(50):.0f} %, over 100 ms {over(100):.0f} % of the span")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run records of Lambda runs")
    ap.add_argument("--from-epoch", type=int, default=2, help="first epoch counted (default 2: the first warms up)")
    args = ap.parse_args(argv)
    try:
        for run in args.runs:
            print("\n".join(report(run, args.from_epoch)))
    except DorylusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
