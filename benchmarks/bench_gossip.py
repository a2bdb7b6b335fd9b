"""Gossip against all-reduce with and without a straggler: one script, one run, one table.

4 CPU workers train Cluster-GCN batches of a synthetic graph; one run per mode, with worker 1 slowed
3x (``--straggler 1:3``) and with no straggler. For each: wall time (from the moment every worker is
ready) to reach the target validation accuracy, epochs to reach it, final test accuracy (at the best
validation epoch), each the median over ``--repeats`` runs (seeds 0, 1, ...): one run is noisy here, as
the four workers and the coordinator share two cores. Targets (ICPADS 2021's claim): with the
straggler, gossip reaches the target in <= 0.6x the all-reduce time, final accuracy within 1 point;
without one, gossip <= 1.1x all-reduce.

    python benchmarks/bench_gossip.py [--nodes 50000 --edges 500000 --epochs 40 --target 0.8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.strip()[-2000:]}")


def train(graph: Path, out: Path, mode: str, args, straggler: str, seed: int) -> dict:
    cmd = [sys.executable, "-m", "dorylus_py", "train", "--data", str(graph), "--mode", mode, "--workers", str(args.workers),
           "--epochs", str(args.epochs), "--clusters", str(args.clusters), "--clusters-per-batch", str(args.per_batch),
           "--gossip-every", str(args.gossip_every), "--seed", str(seed), "--out", str(out), "--quiet"]
    run(cmd + (["--straggler", straggler] if straggler else []))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    hit = next((m for m in metrics if m["val_acc"] >= args.target), None)
    return {"time": hit["wall_s"] if hit else float("inf"), "epoch": hit["epoch"] if hit else None,
            "test": summary["test_acc_at_best_val"], "epoch_s": summary["median_epoch_s"],
            "batches": summary["batches_trained"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--edges", type=int, default=500_000)
    ap.add_argument("--homophily", type=float, default=0.5)
    ap.add_argument("--feature-signal", type=float, default=0.15)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--clusters", type=int, default=80)
    ap.add_argument("--per-batch", type=int, default=4)
    ap.add_argument("--gossip-every", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--target", type=float, default=0.8, help="validation accuracy to reach (default 0.8; the runs end near 0.84)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per configuration, seeds 0.. (default 5)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        graph = tmp / "graph.npz"
        run([sys.executable, "-m", "dorylus_py", "synth", "--out", str(graph), "--nodes", str(args.nodes), "--edges",
             str(args.edges), "--homophily", str(args.homophily), "--feature-signal", str(args.feature_signal)])
        print(f"graph: {args.nodes:,} vertices, {args.edges:,} edges; {args.workers} workers; "
              f"{args.clusters} clusters, {args.per_batch} per batch; target val acc {args.target}; "
              f"medians of {args.repeats} runs")
        print(f"{'run':<28}{'to target s':>12}{'epochs':>16}{'epoch s':>9}{'test acc':>10}{'batches':>9}")
        res = {}
        for straggler in ("1:3", ""):
            for mode in ("allreduce", "gossip"):
                runs = [train(graph, tmp / f"{mode}{straggler.replace(':', '_')}-{seed}", mode, args, straggler, seed)
                        for seed in range(args.repeats)]
                r = res[mode, straggler] = {k: statistics.median(x[k] for x in runs) for k in ("time", "test", "epoch_s")}
                r["epoch"] = "/".join(str(x["epoch"]) for x in runs)
                r["batches"] = runs[0]["batches"]
                name = f"{mode}, " + (f"straggler {straggler}" if straggler else "no straggler")
                print(f"{name:<28}{r['time']:>12.2f}{r['epoch']:>16}{r['epoch_s']:>9.3f}{100 * r['test']:>9.2f}%"
                      f"{r['batches']:>9}")
        slow = res["gossip", "1:3"]["time"] / res["allreduce", "1:3"]["time"]
        even = res["gossip", ""]["time"] / res["allreduce", ""]["time"]
        gap = 100 * (res["gossip", "1:3"]["test"] - res["allreduce", "1:3"]["test"])
        print(f"straggler 1:3: gossip / all-reduce time to target = {slow:.2f}x (target <= 0.6x), "
              f"test accuracy gossip - all-reduce = {gap:+.2f} points (target within 1)")
        print(f"no straggler:  gossip / all-reduce time to target = {even:.2f}x (target <= 1.1x)")


if __name__ == "__main__":
    main()
