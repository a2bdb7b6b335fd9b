"""Time to accuracy: does asynchrony reach a target validation accuracy sooner than synchrony?

Per-epoch time is not Dorylus's claim; time to accuracy is. For each graph (Cora's public split; the
200 k synthetic graph of bench_runtime.py), each setting (0 ms, 20 ms of Lambda latency, 200 Mbps per
Lambda) and each seed, this trains `local` K=2 with a fixed pool of Lambdas for a fixed epoch budget in
sync mode and the async ``--modes`` (default S=1 and S=2; a 2-layer GCN, 16 hidden, `dorylus train`'s
defaults, ``--lr`` for every run), and reads each run's metrics.jsonl. Per run:

- time to target: wall seconds from the first epoch's start to the end of the first epoch whose
  validation accuracy reaches the target, ``--fraction`` (0.97) of the best validation accuracy of the
  sync run of the same seed and setting; "not reached" if no epoch does. The first epoch's recorded
  time includes starting the servers and loading the partitions (seconds; more than a whole Cora run
  of epochs), so it is counted as one steady epoch: the median of the others;
- epochs to target: the number of that epoch (it does not move with the machine's load);
- test accuracy at the best validation epoch; the median epoch time, first epoch left out;
- cores busy: the share of the machine's CPU time (all cores, /proc/stat) that was busy during the run,
  start-up included. Where the emulated Lambdas share the machine's cores with the servers, sync's idle
  share bounds what asynchrony can win back in an epoch.

Each row is the median over seeds (a seed that never reaches the target counts as slower than any that
does), and async rows carry their ratio to sync's in the same setting.

    python benchmarks/bench_tta.py [--graphs cora,synth200k --settings 0ms,20ms,200mbps
                                    --modes sync,async1,async2 --seeds 3 --epochs 200 --lr 0.01
                                    --markdown FILE]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_runtime import synth_parts

from dorylus_py import children, datasets
from dorylus_py.training.record import BestTracker, read_lines

DATASETS = Path(os.environ.get("DORYLUS_DATASETS") or datasets.FOLDER)  # the package's own, unless named
GRAPHS = ("cora", "synth200k", "synthhub")
# issue 39's graph of another shape: half synth200k's vertices and edges (the same mean degree), heavier-tailed
# degrees (hubs, whose rows many chunks read) and weaker homophily (neighbours' rows carry less of the label)
SYNTHHUB = {"nodes": 100_000, "edges": 2_000_000, "degree-exponent": 2.1, "homophily": 0.3}
SETTINGS = {"0ms": [], "20ms": ["--lambda-latency-ms", "20"], "200mbps": ["--lambda-bandwidth-mbps", "200"]}


def _async(staleness: int, smoothing: float = 0.0, barrier: bool = False, *more: str, wait: int = 0) -> list[str]:
    """An async mode's flags, its smoothing, barrier and fresh wait always spelled out (their defaults are auto)."""
    return ["--mode", "async", "--staleness", str(staleness), "--stale-smoothing", str(smoothing),
            "--local-barrier", "on" if barrier else "off", "--fresh-wait-ms", str(wait), *more]


MODES = {"sync": ["--mode", "sync"], "async0": _async(0), "async1": _async(1), "async2": _async(2),
         "async1c": _async(1, 0, False, "--async-update", "chunk"),
         "async0b": _async(0, 0, True), "async1b": _async(1, 0, True), "async1s": _async(1, 0.95),
         "async1d": _async(1, 0, False, "--stale-step", "inverse"),
         "async1sbp": _async(1, 0.95, True, "--predict-weights"),
         "async1p": _async(1, 0, False, "--predict-weights"),
         "async1sb8": _async(1, 0.8, True), "async1sb5": _async(1, 0.5, True),
         **{f"async1sbw{ms}": _async(1, 0.95, True, wait=ms) for ms in (10, 50, 200)},
         **{f"async1bw{ms}": _async(1, 0, True, wait=ms) for ms in (10, 50, 200)},  # 50: --mode async's default
         "async0bw50": _async(0, 0, True, wait=50), "async2bw50": _async(2, 0, True, wait=50),
         "async1sw": _async(1), "async1bw50sw": _async(1, 0, True, wait=50),  # + the switch (SWITCH below)
         "async1l": _async(1, 0, False, "--stale-step", "inverse-lr"),
         "async1sd": _async(1, 0.95, False, "--stale-step", "inverse"),
         "async1sb": _async(1, 0.95, True),  # --mode async's default 2026-12-04 13:00-16:30 (issue 39)
         "async1f": _async(1, 0, False, "--sync-epochs", "1"),
         "async1sbf": _async(1, 0.95, True, "--sync-epochs", "1"),
         "async0sb": _async(0, 0.95, True), "async2sb": _async(2, 0.95, True)}
LABEL = {"sync": "sync", "async0": "async S=0", "async1": "async S=1", "async2": "async S=2",
         "async1c": "async S=1, update per chunk", "async0b": "async S=0, local barrier",
         "async1b": "async S=1, local barrier", "async1s": "async S=1, stale smoothing 0.95",
         "async1d": "async S=1, stale step inverse", "async1l": "async S=1, stale step inverse-lr",
         "async1sd": "async S=1, smoothing 0.95 + stale step inverse",
         "async1sb": "async S=1, smoothing 0.95 + local barrier", "async1f": "async S=1, first epoch sync",
         "async1sbf": "async S=1, smoothing 0.95 + local barrier + first epoch sync",
         "async0sb": "async S=0, smoothing 0.95 + local barrier", "async2sb": "async S=2, smoothing 0.95 + local barrier",
         "async1p": "async S=1, predicted weights",
         **{f"async1sbw{ms}": f"async S=1, smoothing 0.95 + local barrier + fresh wait {ms} ms" for ms in (10, 50, 200)},
         **{f"async1bw{ms}": f"async S=1, local barrier + fresh wait {ms} ms" for ms in (10, 50, 200)},
         "async1sw": "async S=1 + switch to sync 0.02 before sync's best",
         "async1bw50sw": "async S=1, local barrier + fresh wait 50 ms + switch to sync 0.02 before sync's best",
         "async0bw50": "async S=0, local barrier + fresh wait 50 ms", "async2bw50": "async S=2, local barrier + fresh wait 50 ms",
         "async1sb8": "async S=1, smoothing 0.8 + local barrier", "async1sb5": "async S=1, smoothing 0.5 + local barrier",
         "async1sbp": "async S=1, smoothing 0.95 + local barrier + predicted weights"}


SWITCH = {"async1sw": 0.02, "async1bw50sw": 0.02}  # --switch-threshold; --target-acc is the seed's sync best


def steady_epoch_s(rows: list[dict]) -> float:
    """The median epoch time with the first epoch (server start-up included) left out, if there are others."""
    return statistics.median(r["epoch_s"] for r in (rows[1:] or rows))


def epochs_to_target(rows: list[dict], target: float) -> int | None:
    """The number of the first epoch whose ``val_acc`` reaches ``target`` (counting from 1); None if none
    does. Unlike the time, it does not move with the machine's load."""
    return next((i for i, r in enumerate(rows, 1) if r["val_acc"] >= target), None)


def time_to_target(rows: list[dict], target: float) -> float | None:
    """Seconds from the first epoch's start to the end of the first epoch whose ``val_acc`` reaches
    ``target``; None if none does. The first epoch counts as a steady one (its own time includes start-up)."""
    epoch = epochs_to_target(rows, target)
    if epoch is None:
        return None
    return rows[epoch - 1]["wall_s"] - (rows[0]["wall_s"] - steady_epoch_s(rows))


def cpu_ticks() -> tuple[int, int] | None:
    """(busy, all) CPU ticks of the machine so far, from /proc/stat; None where there is none. Machine-wide:
    every process of a run (servers, Lambda emulators) and anything else running beside it."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time that was busy between two :func:`cpu_ticks`."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def median_tta(times: list[float | None]) -> float | None:
    """The median over seeds, a seed that never reached the target counting as infinitely slow."""
    m = statistics.median(math.inf if t is None else t for t in times)
    return None if math.isinf(m) else m


def percent(shares: list[float | None]) -> str:
    """The median of the shares that were measured, as a percentage."""
    known = [s for s in shares if s is not None]
    return f"{100 * statistics.median(known):.0f} %" if known else "-"


def seconds(t: float | None) -> str:
    return "not reached" if t is None else f"{t:.1f}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def parse_list(value: str, allowed, what: str, fail) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        fail(f"--{what}: {', '.join(bad) or 'empty'}; give a comma list of {', '.join(allowed)}")
    return list(dict.fromkeys(items))


def graph_bench_parser(**kw) -> argparse.ArgumentParser:
    """A parser with the flags every benchmark of these graphs takes (bench_tta.py, bench_wire.py); its
    errors are one line and exit 2, not argparse's usage block."""
    ap = argparse.ArgumentParser(**kw)
    ap.add_argument("--graphs", default=",".join(GRAPHS), help="comma list of cora, synth200k, synthhub "
                    "(default all three; synthhub: 100 k vertices, 2 M edges, degree exponent 2.1, homophily 0.3)")
    ap.add_argument("--lambdas", type=int, default=4, help="emulated Lambdas, a fixed pool (default 4)")
    ap.add_argument("--nodes", type=int, default=200_000, help="synth200k's vertices (default 200,000)")
    ap.add_argument("--edges", type=int, default=4_000_000, help="synth200k's edges (default 4,000,000)")
    ap.add_argument("--markdown", type=Path, metavar="FILE", help="also write the results to FILE as Markdown")
    ap.error = fail
    return ap


def fail(msg: str):
    print(f"{Path(sys.argv[0]).name}: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def check_graph_args(args, lows: dict[str, int]) -> None:
    """The shared flags checked (``--graphs`` made a list), and each of ``lows``'s counts at least its low."""
    args.graphs = parse_list(args.graphs, GRAPHS, "graphs", fail)
    for name, low in (lows | {"lambdas": 1, "nodes": 100, "edges": 100}).items():
        if getattr(args, name) < low:
            fail(f"--{name.replace('_', '-')} must be at least {low}, got {getattr(args, name)}")
    if "cora" in args.graphs and not (DATASETS / "cora.npz").exists():
        fail(f"{DATASETS / 'cora.npz'} absent (set DORYLUS_DATASETS to the folder holding cora.npz)")
    if args.markdown and not args.markdown.parent.is_dir():
        fail(f"--markdown: folder {args.markdown.parent} does not exist")


def report(head: str, lines: list[str], markdown: Path | None) -> None:
    """The results: printed, and written to ``--markdown``'s file if one was given."""
    print(head, *lines, sep="\n")
    if markdown:
        markdown.write_text("\n".join([head, "", *lines, ""]))


def parse_args() -> argparse.Namespace:
    ap = graph_bench_parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma list of 0ms, 20ms, 200mbps (default all)")
    ap.add_argument("--modes", default="sync,async1,async2", help="comma list of sync, async0, async1, async2 (async "
                    "S=0..2, without smoothing, local barrier or fresh wait: every async mode here spells all three "
                    "out), async1c (async S=1 with --async-update chunk), async0b, async1b (S=0, S=1 with "
                    "--local-barrier), async1s (S=1, --stale-smoothing 0.95), async1d (S=1, --stale-step inverse), async1l "
                    "(S=1, --stale-step inverse-lr), async1sd (S=1, smoothing 0.95 + stale step inverse), async1sb "
                    "(S=1, smoothing 0.95 + --local-barrier), async1f (S=1, --sync-epochs 1), async1sbf (async1sb with "
                    "--sync-epochs 1), async0sb, async2sb (S=0, S=2 with both), async1sb8, async1sb5 (async1sb with "
                    "smoothing 0.8, 0.5), async1p, async1sbp (async1, async1sb with --predict-weights), async1bwMS, "
                    "async1sbwMS (async1b, async1sb with --fresh-wait-ms MS: 10, 50 or 200; async1bw50 is --mode "
                    "async's default), async0bw50, async2bw50 (S=0, S=2 with the default's barrier and wait), async1sw, "
                    "async1bw50sw (async1, async1bw50 with --switch-threshold 0.02 and --target-acc the seed's sync "
                    "best: they stop there); sync is needed for the target (default sync,async1,async2)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    ap.add_argument("--epochs", type=int, default=200, help="epoch budget of every run (default 200)")
    ap.add_argument("--fraction", type=float, default=0.97, help="target = this x sync's best val_acc (default 0.97)")
    ap.add_argument("--lr", type=float, help="learning rate of every run (default: dorylus train's, 0.01; the 200 k "
                    "graph learns about 3x faster at 0.04, see docs/performance.md)")
    args = ap.parse_args()
    check_graph_args(args, {"seeds": 1, "epochs": 2})
    args.settings = parse_list(args.settings, SETTINGS, "settings", fail)
    args.modes = parse_list(args.modes, MODES, "modes", fail)
    if "sync" not in args.modes:
        fail("--modes must include sync: the target is a fraction of sync's best validation accuracy")
    if not 0 < args.fraction <= 1:
        fail(f"--fraction must be in (0, 1], got {args.fraction}")
    if args.lr is not None and not 0 < args.lr < 1:
        fail(f"--lr must be in (0, 1), got {args.lr}")
    return args


def graph_parts(name: str, tmp: Path, args) -> Path:
    """The graph's store of 2 parts, made once for every run on it."""
    if name == "synth200k":
        return synth_parts(tmp, args.nodes, args.edges)[1]
    if name == "synthhub":
        return synth_parts(tmp / name, SYNTHHUB["nodes"], SYNTHHUB["edges"],
                           extra=[f"--{k}={v}" for k, v in SYNTHHUB.items() if k not in ("nodes", "edges")])[1]
    parts = tmp / "cora-parts"
    subprocess.run([*children.module("dorylus_py"), "prepare", DATASETS / "cora.npz", "-k", "2", "--out", parts],
                   check=True, capture_output=True)
    return parts


def train(parts: Path, run_dir: Path, args, seed: int, mode: str, setting: str, extra: tuple = ()) -> list[dict]:
    """One `dorylus train` run (``extra``: more flags); its metrics rows. A failed run ends the benchmark
    with one line."""
    cmd = [*children.module("dorylus_py"), "train", "--data", str(parts), "--out", str(run_dir), "--quiet",
           "--backend", "local", "-k", "2", "--lambdas", str(args.lambdas), "--epochs", str(args.epochs),
           "--seed", str(seed), *MODES[mode], *SETTINGS[setting], *extra]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=max(600, 60 * args.epochs))
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"{Path(sys.argv[0]).name}: {run_dir.name} failed (exit {proc.returncode}): {last}")
    return read_lines(run_dir / "metrics.jsonl")


def table(results: dict, args) -> list[str]:
    """Markdown rows: per graph, setting and mode the medians over seeds, and async's ratios to sync."""
    columns = ("graph", "setting", "mode", "time to target s (reached)", "epochs to target", "test acc at best val",
               "epoch s", "cores busy", "time to target / sync", "epoch / sync")
    lines = [f"| {' | '.join(columns)} |", "| --- " * len(columns) + "|"]
    for graph in args.graphs:
        for setting in args.settings:
            sync = None
            for mode in args.modes:
                runs = results[graph, setting, mode]
                tta = median_tta([r["tta"] for r in runs])
                ett = median_tta([r["ett"] for r in runs])
                epoch = statistics.median(r["epoch_s"] for r in runs)
                reached = sum(r["tta"] is not None for r in runs)
                if mode == "sync":
                    sync = (tta, epoch)
                ratios = ["", ""] if mode == "sync" else [ratio(tta, sync[0]), ratio(epoch, sync[1])]
                lines.append(f"| {graph} | {setting} | {LABEL[mode]} | {seconds(tta)} ({reached}/{len(runs)}) "
                             f"| {'-' if ett is None else f'{ett:g}'} | {100 * statistics.median(r['test_acc'] for r in runs):.1f} % | {epoch:.3f} "
                             f"| {percent([r['busy'] for r in runs])} "
                             f"| {' | '.join(ratios)} |")
    return lines


def main() -> None:
    args = parse_args()
    modes = ["sync", *(m for m in args.modes if m != "sync")]
    lr = () if args.lr is None else ("--lr", str(args.lr))  # sync first: its best sets the seed's target
    t_start = time.perf_counter()
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="dorylus-tta-") as tmp_name:
        tmp = Path(tmp_name)
        for graph in args.graphs:
            parts = graph_parts(graph, tmp, args)
            for setting in args.settings:
                for seed in range(args.seeds):
                    target = None
                    for mode in modes:
                        run_dir = tmp / f"{graph}-{setting}-{mode}-seed{seed}"
                        ticks = cpu_ticks()
                        switch = () if mode not in SWITCH else (  # Dorylus: back to sync near the target
                            "--target-acc", f"{best_sync:.4f}", "--switch-threshold", str(SWITCH[mode]))
                        rows = train(parts, run_dir, args, seed, mode, setting, lr + switch)
                        busy = busy_share(ticks, cpu_ticks())
                        best = BestTracker.over(rows)
                        if mode == "sync":
                            target, best_sync = args.fraction * best.best_val_acc, best.best_val_acc
                        run = {"tta": time_to_target(rows, target), "ett": epochs_to_target(rows, target),
                               "test_acc": best.test_acc_at_best_val,
                               "epoch_s": steady_epoch_s(rows), "busy": busy}
                        results.setdefault((graph, setting, mode), []).append(run)
                        reached = ("not reached" if run["tta"] is None
                                   else f"reached in {run['tta']:.1f} s (epoch {run['ett']})")
                        print(f"{run_dir.name}: best val {best.best_val_acc:.3f} at epoch {best.best_epoch}, target "
                              f"{target:.3f} {reached}, epoch {run['epoch_s']:.3f} s "
                              f"({time.perf_counter() - t_start:.0f} s so far)", file=sys.stderr, flush=True)
    args.modes = modes
    lines = table(results, args)
    head = (f"`local` K=2, {args.lambdas} Lambdas, {args.epochs} epochs, seeds 0-{args.seeds - 1} (medians); target = "
            f"{args.fraction:g} x sync's best val_acc of the same seed and setting; "
            f"{time.perf_counter() - t_start:.0f} s in all")
    report(head, lines, args.markdown)


if __name__ == "__main__":
    main()
