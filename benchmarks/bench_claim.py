"""Dorylus's claim on a scale model (issue 53): with tensor work on Lambdas, the same CPU graph servers
train faster and give more value (1 / (time x cost)) than alone.

Per graph (Dorylus's shapes as ``dorylus synth`` makes them: ``reddit`` 602 features, 128 hidden, 41
classes, mean degree 100; ``amazon`` 300 / 64 / 25, mean degree 34; and ``cora``), each seed trains
``local`` K=2 on a scale model (docs/lab.md): 2 graph-server hosts of ``--host-cpus`` cores, a weight
server of ``--weight-host-cpus``, and ``--lambdas-per-server`` Lambdas a graph server of ``--lambda-mb``
each (a Lambda's vCPUs are AWS's share of a core for that memory, 1,769 MB a vCPU), at 200 Mbit/s each,
as Dorylus measured them; in sync mode and in async mode (the mode's defaults). Against them: the same
servers alone (``--backend cpu``, the paper's CPU-only baseline) and CPU-only servers with the Lambdas'
cores added. Every run is at one dilation D (``--dilation``; default the smallest that fits), and every
time is the model's (raw / D). Columns, medians over seeds:

- model epoch, time to target (the target: ``--fraction`` of sync's best validation accuracy) and its
  ratio to sync's, test accuracy at the best validation epoch;
- value (``dorylus report``'s, servers as ``--instance``, Lambdas at ``--lambda-mb``, waiting billed) and
  its ratio to the same servers alone and to CPU-only with the Lambdas' cores;
- each host's cores busy; a graph server's CPU seconds per epoch (raw: the work is the box's) and its
  ratio to the same servers alone; the CPU a graph server spends per offloaded task on handing it off
  (its CPU an epoch less what the same servers alone spend besides their tensor threads and less its own
  tensor threads' CPU, per offloaded task) and that cost over the work it gives away (the same servers'
  tensor CPU less what it still does itself); its messages per task and MB per epoch; Lambda GB-s per
  epoch. ``sync-auto`` and ``async-auto`` run with ``--offload auto`` (narrow tasks stay on the server).

    python benchmarks/bench_claim.py [--graphs reddit,amazon,cora --seeds 3 --epochs 30
        --lambdas-per-server 8 --lambda-mb 512 --host-cpus 1 --dilation D --markdown FILE
        --lambda-args "--lease-idle-ms 50 --lambda-latency-ms 20"]

Needs root and cgroup v1; run it on a quiet machine (nothing else running) and say the load.
"""

from __future__ import annotations

import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_runtime import synth_parts  # noqa: E402
from bench_scale_model import busy_cell  # noqa: E402
from bench_tta import (  # noqa: E402
    BestTracker,
    epochs_to_target,
    fail,
    median_tta,
    ratio,
    report,
    seconds,
    steady_epoch_s,
    time_to_target,
)

from dorylus_py import children, datasets  # noqa: E402
from dorylus_py.cgroups import unavailable  # noqa: E402
from dorylus_py.cost.model import Prices, invocations, read_record  # noqa: E402
from dorylus_py.cost.report import report_rows  # noqa: E402
from dorylus_py.hosts import FIT, box_cores, lambda_vcpus  # noqa: E402

# Dorylus's shapes (uclasystem/dorylus run/*.config): features, hidden, classes, mean degree
SHAPES = {"reddit": (602, 128, 41, 100), "amazon": (300, 64, 25, 34), "cora": (None, 16, None, None)}
LINK = ["--lambda-bandwidth-mbps", "200"]
SETUPS = {"sync": "Lambdas, sync", "async": "Lambdas, async", "sync-auto": "Lambdas, sync, --offload auto",
          "async-auto": "Lambdas, async, --offload auto", "cpu-same": "CPU only, the same servers",
          "cpu-more": "CPU only, the Lambdas' cores added"}


def parse_args():
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default="reddit,amazon,cora", help="comma list of reddit, amazon, cora")
    ap.add_argument("--nodes", default="reddit=30000,amazon=100000", help="vertices of the generated graphs "
                    "(edges: the shape's mean degree times that)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--fraction", type=float, default=0.97, help="the target: this share of sync's best validation")
    ap.add_argument("--lambdas-per-server", type=int, default=8)
    ap.add_argument("--lambda-mb", type=int, default=512, help="each Lambda's memory (sets its vCPUs and its price)")
    ap.add_argument("--host-cpus", type=float, default=1.0)
    ap.add_argument("--weight-host-cpus", type=float, default=1.0)
    ap.add_argument("--dilation", type=float, default=0.0)
    ap.add_argument("--instance", default="c5.large", help="the servers' EC2 type for value (default c5.large: one "
                    "core, two vCPUs, as the graph-server hosts model)")
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--lambda-args", default="", help="more `dorylus train` options for the setups with Lambdas "
                    "(e.g. \"--lease-idle-ms 50 --lambda-latency-ms 20\")")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--runs", type=Path, help="keep the run records in this new folder (for `dorylus report`); "
                    "default a temporary one, removed")
    ap.error = fail
    args = ap.parse_args()
    args.graphs = [g.strip() for g in args.graphs.split(",") if g.strip()]
    args.setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    if not args.graphs or set(args.graphs) - set(SHAPES) or not args.setups or set(args.setups) - set(SETUPS):
        fail(f"--graphs: some of {', '.join(SHAPES)}; --setups: some of {', '.join(SETUPS)}")
    try:
        args.nodes = {k: int(v) for k, v in (kv.split("=") for kv in args.nodes.split(",") if kv)}
    except ValueError:
        fail(f"--nodes: name=count pairs, got {args.nodes!r}")
    if args.seeds < 1 or args.epochs < 3 or args.lambdas_per_server < 1 or args.lambda_mb < 128:
        fail("--seeds >= 1, --epochs >= 3, --lambdas-per-server >= 1, --lambda-mb >= 128")
    if args.runs and args.runs.exists():
        fail(f"--runs {args.runs}: exists (give a new folder)")
    if why := unavailable():
        fail(why)
    args.vcpus = lambda_vcpus(args.lambda_mb)
    need = 2 * args.host_cpus + args.weight_host_cpus + 2 * args.lambdas_per_server * args.vcpus
    args.dilation = args.dilation or max(1.0, math.ceil(10 * need / (FIT * box_cores())) / 10)
    if need / args.dilation > FIT * box_cores():
        fail(f"--dilation {args.dilation:g}: the model needs {need:g} / D = {need / args.dilation:.2f} cores, "
             f"above {FIT:.0%} of this box's {box_cores()}")
    return args


def graph_parts(name: str, tmp: Path, args) -> Path:
    """The graph's store of 2 parts, made once for every run on it."""
    if name == "cora":
        parts = tmp / "cora-parts"
        subprocess.run([*children.module("dorylus_py"), "prepare", datasets.resolve("cora"), "-k", "2", "--out", parts],
                       check=True, capture_output=True)
        return parts
    features, _, classes, degree = SHAPES[name]
    nodes = args.nodes[name]
    return synth_parts(tmp / name, nodes, nodes * degree, extra=["--features", str(features), "--classes", str(classes)])[1]


def command(parts: Path, out: Path, graph: str, args, seed: int, setup: str) -> list[str]:
    lambdas = 2 * args.lambdas_per_server
    host = args.host_cpus + (args.lambdas_per_server * args.vcpus if setup == "cpu-more" else 0)
    if setup.startswith("cpu"):
        backend = ["--backend", "cpu", "--mode", "sync"]
    else:
        mode, _, offload = setup.partition("-")
        backend = ["--backend", "local", "--lambdas", str(lambdas), "--lambda-memory-mb", str(args.lambda_mb), *LINK,
                   "--mode", mode, "--offload", offload or "all", *shlex.split(args.lambda_args)]
    return [*children.module("dorylus_py"), "train", "--data", str(parts), "--out", str(out), "--quiet", "-k", "2",
            "--epochs", str(args.epochs), "--seed", str(seed), "--hidden", str(SHAPES[graph][1]), *backend,
            "--dilation", f"{args.dilation:g}", "--host-cpus", f"{host:g}", "--weight-host-cpus",
            f"{args.weight_host_cpus:g}", "--lambda-vcpus", f"{args.vcpus:.4g}"]


def measure(out: Path, args) -> dict:
    """What a finished run's record says, in the model's times."""
    config, rows, tasks, _ = read_record(out)
    row = report_rows([str(out)], Prices.load(), args.instance, None)[0]
    hosts = json.loads((out / "hosts.json").read_text())["hosts"] if (out / "hosts.json").exists() else {}
    steady = rows[1:] or rows
    servers = [s for r in steady for s in r.get("servers", [])]
    epochs, k = len(rows), max(1, len(rows[0].get("servers", [])))
    offloaded = [t for t in tasks if "lease" in t and t["where"] != "inproc-cpu"]  # --offload auto keeps some
    per_epoch = len([t for t in offloaded if t["epoch"] > rows[0]["epoch"]]) / max(1, k * len(steady))
    cpu = statistics.median(s["cpu_s"] for s in servers) if servers else math.nan
    tensor = statistics.median(s["tensor_cpu_s"] for s in servers) if servers and "tensor_cpu_s" in servers[0] else None
    gbs = sum(t["billed_ms"] / 1000 * t["memory_mb"] / 1024 for t in invocations(tasks))
    return {"rows": rows, "value": row["value"], "epoch_s": steady_epoch_s(rows),
            "test_acc": BestTracker.over(rows).test_acc_at_best_val, "busy": {h: r.get("busy") for h, r in hosts.items()},
            "cpu_s": cpu, "tensor_s": tensor, "tasks": per_epoch,
            "msgs_task": statistics.median(s["messages"] for s in servers) / per_epoch if per_epoch and servers else None,
            "mb": statistics.median(s["bytes"] for s in servers) / 1e6 if servers else math.nan,
            "gbs": gbs / epochs, "rss": max((t.get("peak_rss_mb") or 0 for t in tasks if t["kind"] == "lease"), default=0)}


def med(runs: list[dict], key: str) -> float | None:
    known = [r[key] for r in runs if r[key] is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
    return statistics.median(known) if known else None


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(results: dict, args) -> list[str]:
    cols = ("graph", "setup", "model epoch s", "/ same servers", "time to target s (reached)", "/ sync",
            "test acc at best val", "value", "/ same servers", "/ CPU-only more cores", "cores busy",
            "graph-server CPU s / epoch", "/ same servers", "offload CPU ms / task (/ its work)", "messages / task",
            "MB / epoch", "Lambda GB-s / epoch")
    lines = [f"| {' | '.join(cols)} |", "| --- " * len(cols) + "|"]
    for graph in args.graphs:
        same, more = results.get((graph, "cpu-same")), results.get((graph, "cpu-more"))
        sync = median_tta([r["tta"] for r in results.get((graph, "sync"), [])])
        for setup in args.setups:
            runs = results.get((graph, setup), [])
            if not runs:
                continue
            tta = median_tta([r["tta"] for r in runs])
            value, epoch, cpu = med(runs, "value"), med(runs, "epoch_s"), med(runs, "cpu_s")
            offload = "-"
            if same and not setup.startswith("cpu") and med(same, "tensor_s") is not None:
                kept = med(same, "cpu_s") - med(same, "tensor_s")  # what the servers do besides the tensor work
                here = med(runs, "tensor_s") or 0.0  # the tensor work they still do (--offload auto)
                given = med(same, "tensor_s") - here  # the tensor work given away, an epoch
                cost = cpu - kept - here  # what giving it away costs, an epoch
                offload = f"{1000 * cost / med(runs, 'tasks'):.2f} ({cost / given:.2f}x)"
            lines.append(
                f"| {graph} | {SETUPS[setup]} | {fmt(epoch, '.3f')} | {ratio(epoch, med(same, 'epoch_s')) if same else '-'} "
                f"| {seconds(tta)} ({sum(r['tta'] is not None for r in runs)}/{len(runs)}) | "
                f"{ratio(tta, sync) if setup != 'sync' else ''} | {100 * med(runs, 'test_acc'):.1f} % | {fmt(value, ',.4g')} "
                f"| {ratio(value, med(same, 'value')) if same else '-'} | {ratio(value, med(more, 'value')) if more else '-'} "
                f"| {busy_cell(runs)} | {fmt(cpu, '.3f')} | {ratio(cpu, med(same, 'cpu_s')) if same else '-'} | {offload} "
                f"| {fmt(med(runs, 'msgs_task'), '.2f')} | {fmt(med(runs, 'mb'), '.1f')} | {fmt(med(runs, 'gbs'), '.3f')} |")
    return lines


def run_all(tmp: Path, args, results: dict, commands: list) -> None:
    """Every run, seed by seed (an interrupted bench still has whole seeds), into ``results``."""
    for graph in args.graphs:
        parts = graph_parts(graph, tmp, args)
        for seed in range(args.seeds):
            target = None
            for setup in args.setups:
                out = tmp / f"{graph}-{setup}-seed{seed}"
                cmd = command(parts, out, graph, args, seed, setup)
                if seed == 0:
                    commands.append(shlex.join(["dorylus", *cmd[cmd.index("train"):]]).replace(str(tmp), "$TMP"))
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(900, 120 * args.epochs * args.dilation))
                if proc.returncode:
                    last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
                    raise SystemExit(f"{Path(sys.argv[0]).name}: {out.name} failed (exit {proc.returncode}): {last}")
                r = measure(out, args)
                if target is None:  # the target: the first setup's (sync's) best validation
                    target = args.fraction * BestTracker.over(r["rows"]).best_val_acc
                r |= {"tta": time_to_target(r["rows"], target), "ett": epochs_to_target(r["rows"], target)}
                results.setdefault((graph, setup), []).append(r)
                print(f"  {out.name}: epoch {r['epoch_s']:.3f} s, {seconds(r['tta'])} s to target, test "
                      f"{100 * r['test_acc']:.1f} %, value {r['value']:.4g}, server CPU {r['cpu_s']:.3f} s an epoch, "
                      f"busy {busy_cell([r])}", flush=True)


def main() -> None:
    args = parse_args()
    t0, results, commands = time.perf_counter(), {}, []
    try:
        if args.runs:
            args.runs.mkdir(parents=True)
            run_all(args.runs.resolve(), args, results, commands)
        else:
            with tempfile.TemporaryDirectory(prefix="dorylus-claim-") as tmp:
                run_all(Path(tmp), args, results, commands)
    except KeyboardInterrupt:
        print("interrupted: the table has the runs that finished", flush=True)
    rss = max((r["rss"] for runs in results.values() for r in runs), default=0)
    head = (f"scale model, D {args.dilation:g} ({time.strftime('%Y-%m-%d')}): graph servers {args.host_cpus:g} core(s) "
            f"each, weight server {args.weight_host_cpus:g}, {args.lambdas_per_server} Lambdas a graph server of "
            f"{args.lambda_mb} MB ({args.vcpus:.2f} vCPU), 200 Mbit/s each; a warm worker's peak RSS {rss:.0f} MB; "
            f"servers priced as {args.instance}; medians of {args.seeds} seeds; model times (raw / D); "
            f"{time.perf_counter() - t0:.0f} s")
    report(head, [*table(results, args), "", "commands (seed 0):", "", *(f"    {c}" for c in commands)], args.markdown)


if __name__ == "__main__":
    main()
