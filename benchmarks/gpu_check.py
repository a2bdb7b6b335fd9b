"""GPU check: the `gpu` backend and the decentralised modes on one device, as checks that pass or fail.

Each check gives rows of one Markdown table, PASS or FAIL:

- reference: `gpu` K=2 sync trains as the reference trainer does: every epoch's loss within --rtol (1e-4)
  of it, for GCN, GAT and GraphSAGE, dropout 0. With dropout, K=2 cannot match: a dropout mask is keyed
  by the vertex's number, and partitioning renumbers vertices (tests/cluster/test_distributed.py compares
  K >= 2 without dropout for that reason). So each model also runs K=1 with dropout 0.5, where the
  numbering is the reference's and the masks drawn for the device must be the reference's. The reference
  trainer has no device: it runs on the CPU, and the device's results must equal the CPU's.
- speed: median epoch (after --warmup) of `gpu` K=2, `cpu` K=2 and PyG's GCNConv on --device, on the
  200 k-vertex, 4 M-edge graph of bench_runtime.py (2-layer GCN, epoch = training step + evaluation
  forward). Each must run and give a finite time. On CUDA `gpu` must also take at most --max-gpu-vs-cpu
  (1.0) x `cpu`'s epoch: its tensor tasks, most of a `cpu` epoch, and its Gathers move to the GPU. Its
  ratio to PyG is reported, not checked: no bound for it has been measured.
- straggler: --mode gossip against --mode allreduce, --workers 2 on --device, worker 1 slowed
  --slowdown (3) times: gossip's median epoch at most --max-gossip-ratio (1.0) x all-reduce's (ICPADS'21:
  gossip's workers take the straggler's share where all-reduce waits for it; 2 / (1 + slowdown) in
  theory), and the straggler trained fewer batches than an even share and no more than any other worker.

Exit 0 when every check passed; 1 when one failed, a line per failure on stderr; 2 on bad arguments or
no CUDA device. The --markdown table is rewritten after each check, so a run cut short keeps what it
measured. The defaults fit one H200 in minutes (benchmarks/gpu_check.sh runs them on a lent GPU
machine); `--device cpu` with small sizes runs every check anywhere (tests/test_gpu_check.py).

    python benchmarks/gpu_check.py [--device cuda --checks reference,speed,straggler --markdown FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]  # the repository's code without an install (a GPU machine's copy)
from bench_runtime import synth_parts  # noqa: E402
from bench_tta import fail, report  # noqa: E402

from dorylus_py import children  # noqa: E402
from dorylus_py.training.record import read_lines  # noqa: E402

CHECKS = ("reference", "speed", "straggler")
MODELS = ("gcn", "gat", "sage")
SLOW_RANK = 1
# the children find this checkout as this process does, installed or not (-P keeps the working folder off their path)
CHILD_ENV = children.env(PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))


@dataclass
class Verdict:
    """One row of the table: what ran, what was measured, and whether it passed (``why`` if not)."""

    check: str
    run: str
    measured: str
    ok: bool
    why: str = ""

    def row(self) -> str:
        cells = (self.check, self.run, self.measured, "PASS" if self.ok else f"FAIL: {self.why}")
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


# --- the checks: results in, verdicts out --------------------------------------------------------

def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def losses_verdict(run: str, got: list[float] | str, want: list[float] | str, rtol: float) -> Verdict:
    """Every epoch's loss of ``got`` within ``rtol`` of the reference's (as numpy's assert_allclose);
    a string is a run's error."""
    if isinstance(got, str) or isinstance(want, str):
        return Verdict("reference", run, "-", False, got if isinstance(got, str) else want)
    if not got or len(got) != len(want):
        return Verdict("reference", run, f"{len(got)} epochs", False,
                       f"{len(got)} epochs against the reference's {len(want)}")
    if not all(map(finite, got + want)):
        return Verdict("reference", run, "non-finite loss", False, "a loss is not finite")
    worst = max(abs(g - w) / abs(w) if w else (0.0 if g == w else math.inf) for g, w in zip(got, want))
    measured = f"{len(got)} epochs, largest relative difference {worst:.1e}, final loss {got[-1]:.5f}"
    ok = worst <= rtol
    why = "" if ok else f"largest relative difference {worst:.1e} > --rtol {rtol:g}"
    return Verdict("reference", run, measured, ok, why)


def speed_verdicts(epoch_s: dict[str, float | str | None], cuda: bool, max_gpu_vs_cpu: float) -> list[Verdict]:
    """``epoch_s``: median epoch seconds of "gpu K=2", "cpu K=2" and "PyG" (a string: the run's error;
    None: not run). Each run must give a finite time; on CUDA gpu's at most ``max_gpu_vs_cpu`` x cpu's."""
    out = []
    gpu, cpu, pyg = (epoch_s.get(k) for k in ("gpu K=2", "cpu K=2", "PyG"))
    for name, sec in epoch_s.items():
        if sec is None:
            continue
        if not finite(sec) or sec <= 0:
            out.append(Verdict("speed", name, "-", False, sec if isinstance(sec, str) else f"epoch time {sec}"))
            continue
        measured, ok, why = f"median epoch {sec:.4f} s", True, ""
        if name == "gpu K=2":
            if finite(cpu) and cpu > 0:
                measured += f"; {sec / cpu:.2f}x `cpu` K=2"
                if cuda and sec > max_gpu_vs_cpu * cpu:
                    ok, why = False, f"{sec / cpu:.2f}x `cpu` K=2's epoch (at most {max_gpu_vs_cpu:g}x on CUDA)"
            if finite(pyg) and pyg > 0:
                measured += f"; {sec / pyg:.2f}x PyG"
        out.append(Verdict("speed", name, measured, ok, why))
    return out


def straggler_verdict(run: str, gossip: dict | str, allreduce: dict | str, slow: int, max_ratio: float) -> Verdict:
    """Gossip's median epoch at most ``max_ratio`` x all-reduce's with the same straggler, and the
    straggler (rank ``slow``) trained less than an even share and no more than any other worker. The
    arguments are the runs' summary.json (a string: the run's error)."""
    if isinstance(gossip, str) or isinstance(allreduce, str):
        return Verdict("straggler", run, "-", False, gossip if isinstance(gossip, str) else allreduce)
    g, a = gossip.get("median_epoch_s"), allreduce.get("median_epoch_s")
    if not (finite(g) and finite(a) and g > 0 and a > 0):
        return Verdict("straggler", run, f"epoch s {g} / {a}", False, "a median epoch is not a positive number")
    batches = gossip.get("batches_per_worker") or []
    measured = (f"gossip {g:.4f} s, all-reduce {a:.4f} s an epoch: {g / a:.2f}x (at most {max_ratio:g}x); "
                f"gossip's batches by rank {batches}")
    whys = []
    if g > max_ratio * a:
        whys.append(f"gossip's epoch is {g / a:.2f}x all-reduce's (at most {max_ratio:g}x)")
    others = [n for r, n in enumerate(batches) if r != slow]
    if not (0 <= slow < len(batches) and others and batches[slow] < sum(batches) / len(batches)
            and batches[slow] <= min(others)):
        whys.append(f"the straggler (rank {slow}) did not train the fewest batches: {batches}")
    return Verdict("straggler", run, measured, not whys, "; ".join(whys))


# --- running things --------------------------------------------------------------------------------

def dorylus(args, *argv) -> str | None:
    """`python -m dorylus_py ARGV`; None, or why it failed in one line."""
    argv = [str(a) for a in argv]
    try:
        proc = subprocess.run(children.module("dorylus_py", *argv), capture_output=True, text=True, env=CHILD_ENV,
                              timeout=args.run_timeout)
    except subprocess.TimeoutExpired:
        return f"`dorylus {argv[0]}` ran past --run-timeout {args.run_timeout} s"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return f"`dorylus {argv[0]}` exited {proc.returncode}: {last}"
    return None


def losses(args, run_dir: Path, *argv) -> list[float] | str:
    err = dorylus(args, "train", "--out", run_dir, "--quiet", *argv)
    return err or [row["loss"] for row in read_lines(run_dir / "metrics.jsonl")]


def check_reference(args, tmp: Path) -> list[Verdict]:
    graph = tmp / "small.npz"
    if err := dorylus(args, "synth", "--out", graph, "--nodes", args.ref_nodes, "--edges", args.ref_edges):
        return [Verdict("reference", "small graph", "-", False, err)]
    out, refs = [], {}
    for model in args.models:
        for k, dropout in ((2, "0"), (1, "0.5")):
            common = ["--data", graph, "--epochs", args.ref_epochs, "--model", model, "--dropout", dropout]
            if (model, dropout) not in refs:
                refs[model, dropout] = losses(args, tmp / f"ref-{model}-{dropout}", *common, "--backend", "reference")
            got = losses(args, tmp / f"gpu-{model}-{k}-{dropout}", *common, "--backend", "gpu", "--device",
                         args.device, "-k", k)
            out.append(losses_verdict(f"{model}, `gpu` K={k} sync, dropout {dropout}", got, refs[model, dropout],
                                      args.rtol))
            print(out[-1].row(), flush=True)
    return out


def median_epoch(rows: list[float], warmup: int) -> float:
    return statistics.median(rows[warmup:])


def check_speed(args, tmp: Path) -> list[Verdict]:
    try:
        graph, parts = synth_parts(tmp, args.nodes, args.edges)
    except subprocess.CalledProcessError as e:
        last = ((e.stderr or b"").decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        return [Verdict("speed", f"{args.nodes:,}-vertex graph", "-", False, f"synth or prepare failed: {last}")]
    epoch_s: dict[str, float | str | None] = {}
    for name, backend in (("gpu K=2", ["--backend", "gpu", "--device", args.device]),
                          ("cpu K=2", ["--backend", "cpu"])):
        run_dir = tmp / name.replace(" ", "").replace("=", "")
        err = dorylus(args, "train", "--data", parts, "--out", run_dir, "--quiet", "--epochs", args.epochs,
                      "--feature-norm", "none", "-k", "2", *backend)
        epoch_s[name] = err or median_epoch([row["epoch_s"] for row in read_lines(run_dir / "metrics.jsonl")],
                                            args.warmup)
    epoch_s["PyG"] = None if args.no_pyg else pyg_epoch_s(args, graph)
    out = speed_verdicts(epoch_s, args.device.startswith("cuda"), args.max_gpu_vs_cpu)
    for v in out:
        v.run = f"{v.run}, {args.nodes:,} vertices, {args.edges:,} edges"
        print(v.row(), flush=True)
    return out


def pyg_epoch_s(args, graph: Path) -> float | str:
    """PyG's median epoch on --device, in bench_runtime.py's worker (the same model and epoch)."""
    cmd = [*children.python(HERE / "bench_runtime.py"), "--worker", "pyg", "--data", str(graph), "--epochs",
           str(args.epochs), "--warmup", "0", "--threads", str(args.threads), "--device", args.device]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout, env=CHILD_ENV)
    except subprocess.TimeoutExpired:
        return f"PyG ran past --run-timeout {args.run_timeout} s"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        hint = " (pip install '.[bench]', or --no-pyg)" if "torch_geometric" in last else ""
        return f"PyG exited {proc.returncode}: {last}{hint}"
    return median_epoch(json.loads(proc.stdout.strip().splitlines()[-1]), args.warmup)


def check_straggler(args, tmp: Path) -> list[Verdict]:
    graph = tmp / "gossip.npz"
    run = f"{args.workers} workers, rank {SLOW_RANK} slowed {args.slowdown:g}x, {args.gossip_nodes:,} vertices"
    if err := dorylus(args, "synth", "--out", graph, "--nodes", args.gossip_nodes, "--edges", args.gossip_edges,
                      "--homophily", "0.5", "--feature-signal", "0.15"):
        return [Verdict("straggler", run, "-", False, err)]
    summaries = {}
    for mode in ("allreduce", "gossip"):
        run_dir = tmp / mode
        err = dorylus(args, "train", "--data", graph, "--out", run_dir, "--quiet", "--mode", mode, "--workers",
                      args.workers, "--epochs", args.gossip_epochs, "--clusters", args.clusters,
                      "--clusters-per-batch", args.per_batch, "--straggler", f"{SLOW_RANK}:{args.slowdown}",
                      "--device", args.device)
        summaries[mode] = err or json.loads((run_dir / "summary.json").read_text())
    out = [straggler_verdict(run, summaries["gossip"], summaries["allreduce"], SLOW_RANK, args.max_gossip_ratio)]
    print(out[-1].row(), flush=True)
    return out


RUNNERS = {"reference": check_reference, "speed": check_speed, "straggler": check_straggler}


# --- arguments, device and the table ---------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.error = fail  # one line, exit 2
    add = ap.add_argument
    add("--device", default="cuda", help="torch device of every check: cuda, cuda:N or cpu (default cuda)")
    add("--checks", default=",".join(CHECKS), help="comma list of reference, speed, straggler (default all)")
    add("--markdown", type=Path, metavar="FILE", help="write the table to FILE (rewritten after each check)")
    add("--run-timeout", type=int, default=300, help="seconds one run may take, else it failed (default 300)")
    add("--models", default=",".join(MODELS), help="reference: comma list of gcn, gat, sage (default all)")
    add("--ref-nodes", type=int, default=2_000, help="reference: vertices of its graph (default 2,000)")
    add("--ref-edges", type=int, default=20_000, help="reference: edges (default 20,000)")
    add("--ref-epochs", type=int, default=5, help="reference: epochs of each run (default 5)")
    add("--rtol", type=float, default=1e-4, help="reference: largest relative difference of a loss (default 1e-4)")
    add("--nodes", type=int, default=200_000, help="speed: vertices of its graph (default 200,000)")
    add("--edges", type=int, default=4_000_000, help="speed: edges (default 4,000,000)")
    add("--epochs", type=int, default=12, help="speed: epochs of each trainer (default 12)")
    add("--warmup", type=int, default=3, help="speed: first epochs left out of each median (default 3)")
    add("--threads", type=int, default=os.cpu_count() or 1, help="speed: PyG's torch threads (default: the cores)")
    add("--no-pyg", action="store_true", help="speed: leave PyG out (no torch_geometric)")
    add("--max-gpu-vs-cpu", type=float, default=1.0, help="speed, CUDA only: `gpu` epoch / `cpu` epoch (default 1.0)")
    add("--gossip-nodes", type=int, default=50_000, help="straggler: vertices of its graph (default 50,000)")
    add("--gossip-edges", type=int, default=500_000, help="straggler: edges (default 500,000)")
    add("--gossip-epochs", type=int, default=10, help="straggler: epochs of each mode (default 10)")
    add("--workers", type=int, default=2, help="straggler: workers, all on --device (default 2)")
    add("--slowdown", type=float, default=3.0, help="straggler: worker 1's compute takes this x as long (default 3)")
    add("--clusters", type=int, default=80, help="straggler: Cluster-GCN clusters (default 80)")
    add("--per-batch", type=int, default=4, help="straggler: clusters per batch (default 4)")
    add("--max-gossip-ratio", type=float, default=1.0, help="straggler: gossip epoch / all-reduce epoch (default 1.0)")
    args = ap.parse_args(argv)
    args.checks = split(args.checks, CHECKS, "checks")
    args.models = split(args.models, MODELS, "models")
    lows = {"run_timeout": 1, "ref_nodes": 100, "ref_edges": 100, "ref_epochs": 1, "nodes": 100, "edges": 100,
            "epochs": 1, "threads": 1, "gossip_nodes": 100, "gossip_edges": 100, "gossip_epochs": 1, "workers": 2,
            "clusters": 1, "per_batch": 1}
    for name, low in lows.items():
        if getattr(args, name) < low:
            fail(f"--{name.replace('_', '-')} must be at least {low}, got {getattr(args, name)}")
    for name in ("rtol", "max_gpu_vs_cpu", "max_gossip_ratio"):
        if not getattr(args, name) > 0:
            fail(f"--{name.replace('_', '-')} must be above 0, got {getattr(args, name)}")
    if not 0 <= args.warmup < args.epochs:
        fail(f"--warmup must be in [0, --epochs), got {args.warmup}")
    if not args.slowdown > 1:
        fail(f"--slowdown must be above 1 (the check needs a straggler), got {args.slowdown}")
    if args.per_batch > args.clusters:
        fail(f"--per-batch ({args.per_batch}) must be at most --clusters ({args.clusters})")
    if args.markdown and not args.markdown.parent.is_dir():
        fail(f"--markdown: folder {args.markdown.parent} does not exist")
    return args


def split(value: str, allowed: tuple, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or any(v not in allowed for v in items):
        fail(f"--{what}: {value!r}; give a comma list of {', '.join(allowed)}")
    return list(dict.fromkeys(items))


def describe_device(device: str) -> str:
    """The device in words, for the table's head; no CUDA device where one is asked for is exit 2."""
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            fail("no CUDA device visible to torch (--device cpu runs every check on the CPU)")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            fail(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s)")
        name = f"{torch.cuda.get_device_name(index)} ({device}), CUDA {torch.version.cuda}"
    else:
        name = f"{device} ({platform.processor() or platform.machine()})"
    return f"{name}, torch {torch.__version__}, {os.cpu_count()} CPU cores"


def head(args, device: str, verdicts: list[Verdict], started: float, done: list[str]) -> str:
    failed = sum(not v.ok for v in verdicts)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cut = "" if done == args.checks else f" (of {', '.join(args.checks)}: cut short)"
    return (f"`benchmarks/gpu_check.py`, {when}: {device}; checks {', '.join(done) or 'none'}{cut}; "
            f"{len(verdicts) - failed} of {len(verdicts)} rows passed; {time.perf_counter() - started:.0f} s")


def main(argv=None) -> int:
    args = parse_args(argv)
    device = describe_device(args.device)
    # every child (dorylus runs, bench_runtime's PyG worker) imports this checkout's code, installed or not
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    started, verdicts, done = time.perf_counter(), [], []
    columns = ["| check | run | measured | verdict |", "| --- | --- | --- | --- |"]
    print(device, flush=True)
    with tempfile.TemporaryDirectory(prefix="dorylus-gpucheck-") as tmp:
        for name in args.checks:
            sub = Path(tmp) / name
            sub.mkdir()
            verdicts += RUNNERS[name](args, sub)
            done.append(name)
            if args.markdown:
                text = head(args, device, verdicts, started, done)
                args.markdown.write_text("\n".join([text, "", *columns, *(v.row() for v in verdicts), ""]))
    report(head(args, device, verdicts, started, done), [*columns, *(v.row() for v in verdicts)], args.markdown)
    for v in verdicts:
        if not v.ok:
            print(f"gpu_check.py: FAIL {v.check}, {v.run}: {v.why}", file=sys.stderr)
    return 1 if any(not v.ok for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
