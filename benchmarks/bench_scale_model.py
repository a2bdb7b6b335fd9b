"""Dorylus's two claims on a scale model of a cluster (issue 44; docs/lab.md): hosts with cores of their
own (cgroups) and time dilation, so that the Lambdas are not the servers' cores.

Per graph (Cora; the 200 k synthetic graph of bench_runtime.py) and Lambda count (``--lambdas``, default
4 and 8), each seed trains ``local`` K=2 on hosts of ``--host-cpus`` cores per graph server,
``--weight-host-cpus`` for the weight server and ``--lambda-vcpus`` per Lambda, with links as Dorylus
measured them (``--lambda-bandwidth-mbps 200``), in sync and each of ``--modes``; and, for value, a
CPU-only job (``--backend cpu``) whose graph servers get the Lambdas' cores added (the same total
cores, the issue's comparison), and one per graph and seed on the same servers alone (the paper's: the
graph servers do the tensor work themselves, nothing added). Every run is at one dilation D
(``--dilation``; default the smallest that fits this box's cores for the biggest configuration), and
every time below is the model's (raw / D):

- time to target: as bench_tta.py (the target is ``--fraction`` of sync's best validation accuracy),
  and its ratio to sync's (issue 32's target: async <= 0.8x within 0.5 points of test accuracy);
- value: ``dorylus report``'s (1 / (hours x USD), servers as ``--instance``, Lambdas by GB-s), and the
  ratio of each CPU+Lambda row to CPU-only of the same total cores and to CPU-only on the same servers
  (the paper: up to 2.75x; the issue's target >= 1.5x);
- cores busy per host: CPU seconds / (model cores x raw wall / D), from each run's hosts.json.

Each cell is the median over seeds; runs go seed by seed, and Ctrl-C prints the table of the seeds that
finished. Needs root and cgroup v1 (``--host-cpus``); on a box shared with
other work the times swing with it: run on a quiet machine.

    python benchmarks/bench_scale_model.py [--graphs cora,synth200k --lambda-counts 4,8 --seeds 3 --epochs 200
        --modes async0,async1,async0b,async1b --host-cpus 1 --weight-host-cpus 1 --lambda-vcpus 1
        --dilation D --lr 0.01 --hidden 16 --wire-dtype float32 --markdown FILE]
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
from bench_tta import (  # noqa: E402
    LABEL,
    MODES,
    BestTracker,
    check_graph_args,
    epochs_to_target,
    fail,
    graph_bench_parser,
    graph_parts,
    median_tta,
    parse_list,
    ratio,
    report,
    seconds,
    steady_epoch_s,
    time_to_target,
)

from dorylus_py import children  # noqa: E402
from dorylus_py.cost.model import Prices, read_record  # noqa: E402
from dorylus_py.cost.report import report_rows  # noqa: E402
from dorylus_py.hosts import FIT, box_cores  # noqa: E402
from dorylus_py.cgroups import unavailable  # noqa: E402

LINK = ["--lambda-bandwidth-mbps", "200"]  # Lambda <-> server, as Dorylus measured it
CPU_ONLY = {"cpu": "CPU only, same total cores", "cpu-same": "CPU only, same servers"}


def parse_args():
    ap = graph_bench_parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lambda-counts", dest="counts", default="4,8", help="comma list of Lambda counts (default 4,8; "
                    "--lambdas is not used here)")
    ap.add_argument("--modes", default="async0,async1,async0b,async1b", help="async modes beside sync (bench_tta.py's "
                    "names; default async0,async1,async0b,async1b)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--fraction", type=float, default=0.97)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--host-cpus", type=float, default=1.0, help="each graph server's cores (default 1)")
    ap.add_argument("--weight-host-cpus", type=float, default=1.0, help="the weight server's cores (default 1)")
    ap.add_argument("--lambda-vcpus", type=float, default=1.0, help="each Lambda's cores (default 1)")
    ap.add_argument("--dilation", type=float, default=0.0, help="D (default: the smallest that fits)")
    ap.add_argument("--hidden", type=int, default=16, help="the GCN's hidden width (default 16, train's): wider "
                    "layers give the tensor work more compute per byte moved to a Lambda")
    ap.add_argument("--instance", default="c5.xlarge", help="the servers' EC2 type for value (default c5.xlarge)")
    ap.add_argument("--wire-dtype", default="float32", choices=("float32", "bfloat16", "float16", "int8"),
                    help="what rows travel as, in every run (train's --wire-dtype; default float32): the links "
                         "set the pace at 200 Mbit/s, and int8 moves 0.3x the bytes")
    args = ap.parse_args()
    check_graph_args(args, {"seeds": 1, "epochs": 2})
    try:
        args.counts = sorted({int(c) for c in args.counts.split(",") if c.strip()})
    except ValueError:
        fail(f"--lambda-counts: a comma list of numbers, got {args.counts!r}")
    if not args.counts or args.counts[0] < 2:
        fail("--lambda-counts: at least 2 Lambdas (one per graph server)")
    args.modes = parse_list(args.modes, [m for m in MODES if m != "sync"], "modes", fail)
    if why := unavailable():
        fail(why)
    need = 2 * args.host_cpus + args.weight_host_cpus + max(args.counts) * args.lambda_vcpus
    args.dilation = args.dilation or max(1.0, math.ceil(10 * need / (FIT * box_cores())) / 10)
    if need / args.dilation > FIT * box_cores():
        fail(f"--dilation {args.dilation:g}: the biggest model needs {need:g} / D = {need / args.dilation:.2f} cores, "
             f"above {FIT:.0%} of this box's {box_cores()}")
    return args


def hosts_flags(args, lambdas: int, mode: str) -> list[str]:
    """A configuration's hosts: CPU-only (``cpu``) adds the Lambdas' cores to the graph servers;
    ``cpu-same`` keeps the graph servers as they are."""
    host = args.host_cpus + (lambdas * args.lambda_vcpus / 2 if mode == "cpu" else 0)
    return ["--dilation", f"{args.dilation:g}", "--host-cpus", f"{host:g}", "--weight-host-cpus",
            f"{args.weight_host_cpus:g}", "--lambda-vcpus", f"{args.lambda_vcpus:g}"]


def command(parts: Path, out: Path, args, seed: int, lambdas: int, mode: str) -> list[str]:
    cpu = mode in CPU_ONLY
    backend = ["--backend", "cpu"] if cpu else ["--backend", "local", "--lambdas", str(lambdas), *LINK]
    model = ([] if args.lr is None else ["--lr", str(args.lr)]) + ["--hidden", str(args.hidden)]
    return [*children.module("dorylus_py"), "train", "--data", str(parts), "--out", str(out), "--quiet", "-k", "2",
            "--epochs", str(args.epochs), "--seed", str(seed), *backend, *MODES["sync" if cpu else mode],
            *hosts_flags(args, lambdas, mode), *model, "--wire-dtype", args.wire_dtype]


def run(cmd: list[str], out: Path, args) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(600, 60 * args.epochs * args.dilation))
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"{Path(sys.argv[0]).name}: {out.name} failed (exit {proc.returncode}): {last}")
    _, rows, _, _ = read_record(out)  # the model's times (raw / D)
    row = report_rows([str(out)], Prices.load(), args.instance, None)[0]
    hosts = json.loads((out / "hosts.json").read_text())["hosts"] if (out / "hosts.json").exists() else {}
    return {"rows": rows, "value": row["value"], "usd": row["total $"], "epoch_s": steady_epoch_s(rows),
            "test_acc": BestTracker.over(rows).test_acc_at_best_val, "busy": {h: r.get("busy") for h, r in hosts.items()}}


def busy_cell(runs: list[dict]) -> str:
    hosts = sorted({h for r in runs for h in r["busy"]})
    med = {h: statistics.median(v for r in runs if (v := r["busy"].get(h)) is not None) for h in hosts
           if any(r["busy"].get(h) is not None for r in runs)}
    short = {"graph-server-0": "g0", "graph-server-1": "g1", "weight-server-0": "w", "lambdas": "L"}
    return ", ".join(f"{short.get(h, h)} {100 * v:.0f} %" for h, v in med.items()) or "-"


def table(results: dict, args) -> list[str]:
    cols = ("graph", "Lambdas", "mode", "time to target s (reached)", "/ sync", "epochs to target",
            "test acc at best val", "epoch s", "value", "value / CPU-only same cores", "value / CPU-only same servers",
            "cores busy (g0, g1, w, Lambdas)")
    lines = [f"| {' | '.join(cols)} |", "| --- " * len(cols) + "|"]
    for graph in args.graphs:
        same = statistics.median(r["value"] for r in results[graph, 0, "cpu-same"])
        for n in [*args.counts, 0]:
            modes = ["cpu-same"] if n == 0 else ["sync", *args.modes, "cpu"]
            sync = median_tta([r["tta"] for r in results[graph, n or args.counts[0], "sync"]])
            cpu = statistics.median(r["value"] for r in results[graph, n, "cpu"]) if n else None
            for mode in modes:
                runs = results[graph, n, mode]
                tta, ett = median_tta([r["tta"] for r in runs]), median_tta([r["ett"] for r in runs])
                value = statistics.median(r["value"] for r in runs)
                lines.append(f"| {graph} | {n or '-'} | {CPU_ONLY.get(mode) or LABEL[mode]} | {seconds(tta)} "
                             f"({sum(r['tta'] is not None for r in runs)}/{len(runs)}) | "
                             f"{'' if mode == 'sync' else ratio(tta, sync)} | {'-' if ett is None else f'{ett:g}'} | "
                             f"{100 * statistics.median(r['test_acc'] for r in runs):.1f} % | "
                             f"{statistics.median(r['epoch_s'] for r in runs):.3f} | {value:.4g} | "
                             f"{ratio(value, cpu) if cpu else ''} | {ratio(value, same)} | {busy_cell(runs)} |")
    return lines


def main() -> None:
    args = parse_args()
    t0, results, commands = time.perf_counter(), {}, []
    try:
        with tempfile.TemporaryDirectory(prefix="dorylus-scale-") as tmp_name:
            run_all(Path(tmp_name), args, results, commands)
    except KeyboardInterrupt:  # Ctrl-C: the table of the seeds every run of which finished
        args.graphs = [g for g in args.graphs if (g, 0, "cpu-same") in results]  # graphs with a whole seed
        done = min((len(results[g, n, m]) for g in args.graphs for n, m in configs(args)), default=0)
        print(f"interrupted: the table has the {done} seed(s) that finished every run", flush=True)
        if not done:
            raise SystemExit(130) from None
        results = {k: v[:done] for k, v in results.items() if k[0] in args.graphs}
        args.seeds = done
    head = (f"scale model, D {args.dilation:g} ({time.strftime('%Y-%m-%d')}): graph servers {args.host_cpus:g} cores "
            f"each, weight server {args.weight_host_cpus:g}, Lambdas {args.lambda_vcpus:g} vCPU each, GCN hidden {args.hidden}, "
            f"200 Mbit/s per Lambda, rows as {args.wire_dtype}; medians of {args.seeds} seeds; model times (raw / D); "
            f"{time.perf_counter() - t0:.0f} s")
    report(head, [*table(results, args), "", "commands (seed 0):", "", *(f"    {c}" for c in commands)], args.markdown)


def configs(args) -> list[tuple[int, str]]:
    """(Lambdas, mode) of every run of a seed, sync with the fewest Lambdas first (it sets the target)."""
    return [(n, m) for n in args.counts for m in ("sync", *args.modes, "cpu")] + [(0, "cpu-same")]


def run_all(tmp: Path, args, results: dict, commands: list) -> None:
    """Every run, seed by seed (an interrupted bench still has whole seeds), into ``results``."""
    for graph in args.graphs:
        parts = graph_parts(graph, tmp, args)
        for seed in range(args.seeds):
            target = None
            for n, mode in configs(args):
                out = tmp / f"{graph}-{n}-{mode}-seed{seed}"
                cmd = command(parts, out, args, seed, n, mode)
                if seed == 0:
                    commands.append(shlex.join(["dorylus", *cmd[3:]]).replace(str(tmp), "$TMP"))
                r = run(cmd, out, args)
                if target is None:  # the target: sync with the fewest Lambdas
                    target = args.fraction * BestTracker.over(r["rows"]).best_val_acc
                r |= {"tta": time_to_target(r["rows"], target), "ett": epochs_to_target(r["rows"], target)}
                results.setdefault((graph, n, mode), []).append(r)
                print(f"  {out.name}: {seconds(r['tta'])} s to target ({r['ett'] or '-'} epochs), test "
                      f"{100 * r['test_acc']:.1f} %, epoch {r['epoch_s']:.3f} s, value {r['value']:.4g}, busy "
                      f"{busy_cell([r])}", flush=True)


if __name__ == "__main__":
    main()
