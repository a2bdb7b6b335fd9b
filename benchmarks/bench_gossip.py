"""Gossip against all-reduce: time to a target validation accuracy, with and without a straggler.

CPU worker processes train Cluster-GCN batches of one synthetic graph (50 k vertices, 500 k edges by
default). For each configuration below, all-reduce and gossip run once per seed (0, 1, ...; the two
modes alternate, so a change in the machine's load hits both), and the table gives medians over the
seeds: wall time from the moment every worker is ready to the first epoch whose validation accuracy
reaches the target, the epochs that took (per seed), median epoch time, test accuracy at the best
validation epoch, and the batches each rank trained (seed 0). Then the ratios against the targets:

    W=4, worker 1 slowed 3x   gossip <= 0.5x all-reduce, test accuracy within 1 point
    W=4, no straggler         gossip <= 1.0x all-reduce
    W=2, worker 1 slowed 3x   gossip <= 0.7x all-reduce; the fast worker trains >= 2x the slow one's batches
    W=8 (3x) and a 5x straggler (W=4): reported, no target
    --average-every 1 (W=4, 3x): what the optional global average costs, against gossip without it

A 2-core machine shared with other work is noisy: quote the load average printed at the start and end.

    python benchmarks/bench_gossip.py                  # everything, 5 seeds: about 25 min on an idle 2-core box
    python benchmarks/bench_gossip.py --repeats 3 --only w4-3x w4-even w2-3x    # the three targets only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dorylus_py import children

CONFIGS = {  # name: (workers, straggler, extra gossip flags, target ratio of the times to target)
    "w4-3x": (4, "1:3", [], 0.5),
    "w4-even": (4, "", [], 1.0),
    "w2-3x": (2, "1:3", [], 0.7),
    "w8-3x": (8, "1:3", [], None),
    "w4-5x": (4, "1:5", [], None),
    "w4-3x-avg": (4, "1:3", ["--average-every", "1"], None),
}


def run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.strip()[-2000:]}")


def train(graph: Path, out: Path, mode: str, workers: int, straggler: str, extra: list[str], seed: int, args) -> dict:
    cmd = [*children.module("dorylus_py"), "train", "--data", str(graph), "--mode", mode, "--workers", str(workers),
           "--epochs", str(args.epochs), "--clusters", str(args.clusters), "--clusters-per-batch", str(args.per_batch),
           "--seed", str(seed), "--out", str(out), "--quiet", *(["--straggler", straggler] if straggler else []), *extra]
    run(cmd)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    hit = next((m for m in metrics if m["val_acc"] >= args.target), None)
    return {"time": hit["wall_s"] if hit else float("inf"), "epoch": hit["epoch"] if hit else None,
            "test": summary["test_acc_at_best_val"], "epoch_s": summary["median_epoch_s"],
            "batches": summary["batches_per_worker"]}


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--edges", type=int, default=500_000)
    ap.add_argument("--homophily", type=float, default=0.5)
    ap.add_argument("--feature-signal", type=float, default=0.15)
    ap.add_argument("--clusters", type=int, default=80)
    ap.add_argument("--per-batch", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=25, help="epochs per run (default 25; the target comes at about 10)")
    ap.add_argument("--target", type=float, default=0.8, help="validation accuracy to reach (default 0.8; runs end near 0.83)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per mode and configuration, seeds 0.. (default 5)")
    ap.add_argument("--only", nargs="+", choices=list(CONFIGS), default=list(CONFIGS), help="configurations to run")
    args = ap.parse_args()
    started = time.perf_counter()
    print(f"start: {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        graph = tmp / "graph.npz"
        run([*children.module("dorylus_py"), "synth", "--out", str(graph), "--nodes", str(args.nodes), "--edges",
             str(args.edges), "--homophily", str(args.homophily), "--feature-signal", str(args.feature_signal)])
        print(f"graph: {args.nodes:,} vertices, {args.edges:,} edges; {args.clusters} clusters, {args.per_batch} per "
              f"batch; target val acc {args.target}; medians of {args.repeats} seeds")
        print(f"{'run':<30}{'to target s':>12}{'epochs':>16}{'epoch s':>9}{'test acc':>10}  batches by rank (seed 0)")
        ratios = []
        for name in args.only:
            workers, straggler, extra, target = CONFIGS[name]
            labels = ("gossip", "gossip+avg") if extra else ("allreduce", "gossip")  # --average-every: against gossip
            res = {}
            for seed in range(args.repeats):
                for label in labels:
                    mode = "allreduce" if label == "allreduce" else "gossip"
                    out = tmp / f"{name}-{label}-{seed}"
                    res.setdefault(label, []).append(train(graph, out, mode, workers, straggler,
                                                           extra if label == "gossip+avg" else [], seed, args))
            for label, runs in res.items():
                med = {k: statistics.median(r[k] for r in runs) for k in ("time", "test", "epoch_s")}
                epochs = "/".join(str(r["epoch"]) for r in runs)
                print(f"{name + ', ' + label:<30}{med['time']:>12.2f}{epochs:>16}{med['epoch_s']:>9.3f}"
                      f"{100 * med['test']:>9.2f}%  {runs[0]['batches']}")
                res[label] = med | {"batches": runs[0]["batches"]}
            old, new = (res[label] for label in labels)
            ratio, gap = new["time"] / old["time"], 100 * (new["test"] - old["test"])
            vs = "gossip --average-every 1 / gossip" if extra else "gossip / all-reduce"
            goal = f" (target <= {target}x)" if target else ""
            line = f"{name}: {vs} time to target = {ratio:.2f}x{goal}, test accuracy {gap:+.2f} points"
            if workers == 2:
                fast, slow = new["batches"][0], new["batches"][1]
                line += f"; fast / slow worker batches = {fast / max(slow, 1):.1f}x (target >= 2x)"
            ratios.append(line)
        print("\n".join(ratios))
    print(f"end: {load()}; the benchmark took {(time.perf_counter() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
