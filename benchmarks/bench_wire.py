"""A lighter wire (``--wire-dtype``): bytes, accuracy and epoch time of each row form against float32.

For each graph (Cora's public split; the 200 k synthetic graph of bench_runtime.py), each wire dtype and
each seed, this trains `local` K=2 in sync mode for a fixed epoch budget and reads the run's metrics:
test accuracy at the best validation epoch (mean over seeds, and its mean difference from float32's of
the same seed: int8's stochastic rounding sends a run down another path, so the median of each column
would compare different seeds), the bytes through the graph servers' sockets an epoch (as the
servers counted them; the first epoch, which warms the row cache, left out) and the steady epoch time.
Then, on the synthetic graph only, async S=1 with float32 and with int8 rows, unlimited and at 200 Mbps
per Lambda: what a narrower wire buys where the link is the bottleneck.

    python benchmarks/bench_wire.py [--graphs cora,synth200k --wires float32,bfloat16,float16,int8
                                     --cora-seeds 5 --synth-seeds 3 --epochs 200 --synth-epochs 40
                                     --markdown FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_tta import (check_graph_args, fail, graph_bench_parser, graph_parts, parse_list, report, steady_epoch_s,
                       train)

from dorylus_py.training.record import BestTracker
from dorylus_py.wire_forms import WIRE_DTYPES


def epoch_bytes(rows: list[dict]) -> float:
    """Median bytes through all graph servers an epoch, the first epoch left out (if there are others)."""
    return statistics.median(sum(s["bytes"] for s in r["servers"]) for r in (rows[1:] or rows))


def parse_args() -> argparse.Namespace:
    ap = graph_bench_parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wires", default=",".join(WIRE_DTYPES), help="comma list of wire dtypes (float32 is always run)")
    ap.add_argument("--cora-seeds", type=int, default=5, help="Cora seeds 0..N-1 (default 5)")
    ap.add_argument("--synth-seeds", type=int, default=3, help="synthetic graph seeds 0..N-1 (default 3)")
    ap.add_argument("--epochs", type=int, default=200, help="Cora's epoch budget (default 200)")
    ap.add_argument("--synth-epochs", type=int, default=40, help="the synthetic graph's (default 40)")
    args = ap.parse_args()
    check_graph_args(args, {"cora_seeds": 1, "synth_seeds": 1, "epochs": 2, "synth_epochs": 2})
    args.wires = ["float32", *(w for w in parse_list(args.wires, WIRE_DTYPES, "wires", fail) if w != "float32")]
    return args


def run(parts: Path, tmp: Path, args, graph: str, wire: str, seed: int, mode: str, setting: str) -> dict:
    budget = argparse.Namespace(lambdas=args.lambdas, epochs=args.synth_epochs if graph == "synth200k" else args.epochs)
    run_dir = tmp / f"{graph}-{wire}-{mode}-{setting}-seed{seed}"
    rows = train(parts, run_dir, budget, seed, mode, setting, ("--wire-dtype", wire))
    best = BestTracker.over(rows)
    out = {"test_acc": best.test_acc_at_best_val, "bytes": epoch_bytes(rows), "epoch_s": steady_epoch_s(rows)}
    print(f"{run_dir.name}: test {out['test_acc']:.4f}, {out['bytes'] / 1e6:.1f} MB an epoch, epoch "
          f"{out['epoch_s']:.3f} s", file=sys.stderr, flush=True)
    return out


def main() -> None:
    args = parse_args()
    t0 = time.perf_counter()
    sync: dict = {}
    links: dict = {}
    with tempfile.TemporaryDirectory(prefix="dorylus-wire-") as name:
        tmp = Path(name)
        for graph in args.graphs:
            parts = graph_parts(graph, tmp, args)
            seeds = args.synth_seeds if graph == "synth200k" else args.cora_seeds
            for seed in range(seeds):
                for wire in args.wires:
                    sync.setdefault((graph, wire), []).append(run(parts, tmp, args, graph, wire, seed, "sync", "0ms"))
            if graph == "synth200k":
                for wire in ("float32", "int8"):
                    for setting in ("0ms", "200mbps"):
                        links[wire, setting] = run(parts, tmp, args, graph, wire, 0, "async1", setting)
    lines = [("| graph | wire | test acc at best val (mean) | vs float32, same seed (mean, points) | MB / epoch "
              "| bytes / float32 | epoch s |"),
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for graph in args.graphs:
        base = sync[graph, "float32"]
        for wire in args.wires:
            runs = sync[graph, wire]
            acc = statistics.mean(r["test_acc"] for r in runs)  # seeds paired: a median would compare other seeds
            diff = 100 * statistics.mean(r["test_acc"] - b["test_acc"] for r, b in zip(runs, base))
            mb = statistics.median(r["bytes"] for r in runs)
            lines.append(f"| {graph} ({len(runs)} seeds) | {wire} | {100 * acc:.2f} % | {diff:+.2f} | {mb / 1e6:.1f} "
                         f"| {mb / statistics.median(r['bytes'] for r in base):.3f} "
                         f"| {statistics.median(r['epoch_s'] for r in runs):.3f} |")
    if links:
        lines += ["", "| synth200k, async S=1 | epoch s, unlimited | epoch s, 200 Mbps | 200 Mbps / unlimited |",
                  "| --- | --- | --- | --- |"]
        for wire in ("float32", "int8"):
            fast, slow = links[wire, "0ms"]["epoch_s"], links[wire, "200mbps"]["epoch_s"]
            lines.append(f"| {wire} | {fast:.3f} | {slow:.3f} | {slow / fast:.2f}x |")
    head = (f"`local` K=2, {args.lambdas} Lambdas, sync; Cora {args.epochs} epochs, synth200k {args.synth_epochs}; "
            f"bytes and epoch times: medians over seeds; {time.perf_counter() - t0:.0f} s in all")
    report(head, lines, args.markdown)


if __name__ == "__main__":
    main()
