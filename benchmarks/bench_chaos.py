"""Faults a real deployment meets, run on purpose: one table per graph and mode.

Scenarios (each a `dorylus train --backend local -k 2 --lambdas 4` run through the CLI, its own
processes): undisturbed; slow tasks (600 ms of Lambda latency with --relaunch-min-s 0.5, against the
same latency with the default relaunch allowance, which never relaunches: the old code livelocked
here); cold starts (3 s on each emulated Lambda's first invocation); 30 % of handler invocations
failing; one emulated Lambda worker killed (SIGKILL) a third of the way in; a graph server killed; a
weight server killed. Printed: finished, restarts, relaunches, final loss against the undisturbed
run (sync mode is deterministic, so 0 is expected; async is not), wall time against the baseline.

    python benchmarks/bench_chaos.py [--graphs cora,200k] [--modes sync,async] [--epochs-cora 30 --epochs-big 6]

Cora is the one the package ships (dorylus_py/datasets); "200k" is the 200 k-vertex,
4 M-edge, 128-feature benchmark graph of bench_runtime.py. About 25 minutes for everything on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from dorylus_py import children, datasets

HERE = Path(__file__).resolve().parent
CORA = datasets.FOLDER / "cora.npz"
SLOW = ["--lambda-latency-ms", "600"]
SCENARIOS = [  # name, flags, what to kill (role, rank) or None, baseline scenario
    ("undisturbed", [], None, "undisturbed"),
    ("slow tasks, default relaunch", SLOW, None, "undisturbed"),
    ("slow tasks, relaunch after 0.5 s", [*SLOW, "--relaunch-min-s", "0.5"], None, "slow tasks, default relaunch"),
    ("cold starts 3 s", ["--lambda-cold-start-ms", "3000"], None, "undisturbed"),
    ("30 % handler failures", ["--lambda-fail-rate", "0.3", "--relaunch-min-s", "2"], None, "undisturbed"),
    ("kill a Lambda worker", [], ("lambda", 1), "undisturbed"),
    ("kill a graph server", [], ("graph_servers", 1), "undisturbed"),
    ("kill a weight server", [], ("dorylus_py.weights", 0), "undisturbed"),
]


def victim(root: psutil.Process, what: tuple[str, int]) -> psutil.Process:
    role, rank = what
    servers = [p for p in root.children() if "--rank" in p.cmdline()]
    if role == "lambda":  # a worker of graph server `rank`
        gs = next(p for p in servers if "graph_servers" in p.cmdline() and p.cmdline()[-1] == str(rank))
        return next(w for fs in gs.children() if "multiprocessing.forkserver" in " ".join(fs.cmdline())
                    for w in fs.children())  # forked by the server's fork server (platforms/local.py)
    return next(p for p in servers if role in p.cmdline() and p.cmdline()[-1] == str(rank))


def kill_when(proc: subprocess.Popen, metrics: Path, epoch: int, what: tuple[str, int], done: threading.Event) -> None:
    while not done.is_set() and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= epoch:
            os.kill(victim(psutil.Process(proc.pid), what).pid, signal.SIGKILL)
            return
        time.sleep(0.05)


def run(store: Path, out: Path, mode: str, epochs: int, flags: list[str], kill: tuple | None) -> dict:
    cmd = [*children.module("dorylus_py"), "train", "--data", str(store), "--backend", "local", "-k", "2",
           "--lambdas", "4", "--mode", mode, "--epochs", str(epochs), "--checkpoint-every", str(max(1, epochs // 5)),
           "--out", str(out), "--quiet", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = threading.Event()
    if kill:
        threading.Thread(target=kill_when, args=(proc, out / "metrics.jsonl", max(2, epochs // 3), kill, done),
                         daemon=True).start()
    _, err = proc.communicate(timeout=3600)
    done.set()
    if proc.returncode:
        return {"finished": False, "error": err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"}
    s = json.loads((out / "summary.json").read_text())
    return {"finished": True, "restarts": s.get("restarts", 0), "relaunches": s["relaunches"], "loss": s["final_loss"],
            "wall": s["wall_s"]}


def table(title: str, results: dict) -> None:
    base = results["undisturbed"]
    print(f"\n{title}")
    print(f"{'scenario':<34}{'finished':>9}{'restarts':>9}{'relaunches':>11}{'loss vs undisturbed':>21}{'wall vs baseline':>26}")
    for name, _, _, baseline in SCENARIOS:
        r = results[name]
        if not r["finished"]:
            print(f"{name:<34}{'no':>9}   {r['error']}")
            continue
        rel = (r["loss"] - base["loss"]) / base["loss"]
        ref = results[baseline]
        ratio = f"{r['wall'] / ref['wall']:.2f}x ({baseline})" if ref.get("finished") and name != baseline else "-"
        print(f"{name:<34}{'yes':>9}{r['restarts']:>9}{r['relaunches']:>11}{rel:>+21.1e}  {ratio:>24}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="cora,200k")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--epochs-cora", type=int, default=30)
    ap.add_argument("--epochs-big", type=int, default=6)
    ap.add_argument("--only", help="comma-separated scenario names (default: all)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dorylus-chaos-"))
    py = children.module("dorylus_py")
    for graph in args.graphs.split(","):
        if graph == "cora":
            source, epochs = CORA, args.epochs_cora
        else:
            source, epochs = tmp / "big.npz", args.epochs_big
            subprocess.run([*py, "synth", "--out", source, "--nodes", "200000", "--edges", "4000000",
                            "--features", "128", "--classes", "10"], check=True, capture_output=True)
        store = tmp / f"{graph}-parts"
        subprocess.run([*py, "prepare", source, "-k", "2", "--out", store], check=True, capture_output=True)
        for mode in args.modes.split(","):
            results = {}
            for name, flags, kill, _ in SCENARIOS:
                if args.only and name not in args.only.split(",") and name != "undisturbed":
                    results[name] = {"finished": False, "error": "not run (--only)"}
                    continue
                results[name] = run(store, tmp / f"{graph}-{mode}-{len(results)}", mode, epochs, flags, kill)
                print(f"  {graph} {mode} {name}: {results[name]}", file=sys.stderr, flush=True)
            table(f"{graph}, {mode}, {epochs} epochs, local K=2, 4 Lambdas (load {os.getloadavg()[0]:.1f})", results)


if __name__ == "__main__":
    main()
