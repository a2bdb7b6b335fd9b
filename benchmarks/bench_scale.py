"""The largest graphs this machine trains: time and memory of every step, and the cost model's error.

For each size (vertices/edges, 64 features, 10 classes): `dorylus synth`, `dorylus prepare` with 2
partitions (auto: METIS where its estimate fits, else Fennel), and `dorylus train` with 2 graph servers
on each backend (`cpu`, `local` with emulated Lambdas), 3 epochs. Every step runs as its own process
tree; the sampler records each process's peak RSS (VmHWM: driver, graph servers, weight server, Lambda
workers) and the job's peak total, as the sum of RSS and of PSS (PSS counts pages shared between
processes, such as torch's libraries, once: the memory the job really occupies). The graph servers
report their graph structure in bytes per edge held. The epoch time is the median of epochs 2..E.
`dorylus cost estimate`, calibrated on the smallest size's run of the same backend, predicts the
other sizes' epoch times; the error is printed beside the measurement. As the machine is shared and its
load swings, the smallest size is trained again right before each larger size (same backend, same
load): the estimate from that run is the one printed first, the one from the first run follows.

Before a size, the job's memory is projected from the previous size (per edge) and the size is
skipped, with the projection printed, when it would not fit the memory available now.

    python benchmarks/bench_scale.py --scratch /work/scratch-scale/bench \\
        [--sizes 0.2M/4M,2M/40M,5M/100M,10M/200M --epochs 3 --backends cpu,local --chunks 8 --keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path

import psutil

from dorylus_py import children

ROOT = Path(__file__).resolve().parents[1]
GB = 2**30


def parse_size(text: str) -> tuple[int, int]:
    """``2M/40M`` -> (2_000_000, 40_000_000)."""
    def one(s: str) -> int:
        scale = {"k": 10**3, "M": 10**6, "G": 10**9}.get(s[-1], 1)
        return int(float(s[:-1] if s[-1] in "kMG" else s) * scale)

    nodes, edges = text.split("/")
    return one(nodes), one(edges)


def _status(pid: int) -> dict:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    out[key] = int(value.split()[0]) * 1024
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["Pss"] = int(line.split()[1]) * 1024
    except OSError:
        return {}
    return out


def role_of(cmdline: list[str]) -> str:
    cmd = " ".join(cmdline)
    if "graph_servers" in cmd:
        return f"graph server {cmdline[cmdline.index('--rank') + 1]}" if "--rank" in cmdline else "graph server"
    if "dorylus_py.weights" in cmd:
        return "weight server"
    if "resource_tracker" in cmd:
        return "resource tracker"  # multiprocessing's, one per graph server that spawns emulated Lambdas
    if "multiprocessing" in cmd or "dorylus_py" not in cmd:
        return "lambda worker"
    return "driver"


class TreeSampler:
    """Peak memory of a process and all its descendants, sampled every ``period`` seconds."""

    def __init__(self, pid: int, period: float = 0.25):
        self.root, self.period = psutil.Process(pid), period
        self.peaks: dict[int, tuple[str, int]] = {}  # pid -> (role, VmHWM)
        self.rss_total = self.pss_total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            rss = pss = 0
            for p in procs:
                s = _status(p.pid)
                if not s:
                    continue
                try:
                    role = self.peaks[p.pid][0] if p.pid in self.peaks else role_of(p.cmdline())
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                self.peaks[p.pid] = (role, max(self.peaks.get(p.pid, (role, 0))[1], s.get("VmHWM", 0)))
                rss += s.get("VmRSS", 0)
                pss += s.get("Pss", 0)
            self.rss_total, self.pss_total = max(self.rss_total, rss), max(self.pss_total, pss)
            self._stop.wait(self.period)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        by_role: dict[str, int] = {}
        for role, peak in self.peaks.values():
            by_role[role] = max(by_role.get(role, 0), peak)
        workers = [peak for role, peak in self.peaks.values() if role == "lambda worker"]
        return {"peak_by_role": by_role, "lambda_workers": len(workers), "job_rss_peak": self.rss_total,
                "job_pss_peak": self.pss_total}


def run(cmd: list[str], log: Path) -> dict:
    """Run ``cmd`` (its output to ``log``); return wall seconds, memory peaks, and the exit status."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        sampler = TreeSampler(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    mem = sampler.stop()
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}: {' | '.join(tail)}")
    return {"wall_s": time.perf_counter() - t0, "peak_rss": usage.ru_maxrss * 1024, **mem}


def dorylus(*args: str) -> list[str]:
    return children.module("dorylus_py", *args)


def structure_per_edge(run_dir: Path) -> list[float]:
    """Each graph server's structure bytes per edge held, from its start line."""
    out = []
    for log in sorted((run_dir / "logs").glob("graph-server-*.log")):
        for line in log.read_text().splitlines():
            if " start {" in line:
                out.append(json.loads(line[line.index("{"):])["structure_bytes_per_edge"])
                break
    return out


def estimate_epoch(calibration: Path, manifest: dict, backend: str, args) -> tuple[float, str]:
    """`dorylus cost estimate`'s epoch time for this graph, calibrated on ``calibration``."""
    from dorylus_py.cost.estimate import Calibration, Setup, Workload
    from dorylus_py.cost.model import Prices

    inst = "c5.2xlarge"
    chunks = chunks_for(manifest["nodes"], args)
    cmd = (f"dorylus cost estimate --calibration {calibration} --nodes {manifest['nodes']} --edges {manifest['edges']} "
           f"--features {manifest['features']} --classes {manifest['classes']} --backend {backend} -k 2 "
           f"--lambdas {args.lambdas} --chunks {chunks} --epochs {args.epochs}")
    cal = Calibration.from_record(str(calibration), inst)
    work = Workload(manifest["nodes"], manifest["edges"], [manifest["features"], 16, manifest["classes"]])
    setup = Setup(backend, 2, 1, inst, args.lambdas, 3008, chunks, args.epochs)
    return cal.estimate(work, setup, Prices.load(None, "us-east-1", "x86"))["epoch s"], cmd


def measure_size(nodes: int, edges: int, args, calibrations: dict, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    graph, parts = folder / "graph.npz", folder / "parts"
    row = {"nodes": nodes, "edges": edges, "load_before": os.getloadavg()}
    if not graph.exists():
        row["synth"] = run(dorylus("synth", "--out", str(graph), "--nodes", str(nodes), "--edges", str(edges),
                                   "--features", str(args.features), "--overwrite"), folder / "synth.log")
    if not (parts / "manifest.json").exists():
        row["prepare"] = run(dorylus("prepare", str(graph), "-k", "2", "--out", str(parts), "--overwrite",
                                     "--feature-dtype", args.feature_dtype), folder / "prepare.log")
    manifest = json.loads((parts / "manifest.json").read_text())
    row["store_bytes"] = sum(f.stat().st_size for f in parts.rglob("*") if f.is_file())
    row["partition"] = {k: manifest[k] for k in ("partitioner", "partitioner_note", "edge_cut_fraction",
                                                 "hash_edge_cut_fraction", "balance", "seconds")}
    for backend in args.backends:
        adjacent = None
        if backend in calibrations:  # the smallest size again, now, under the same load as this size
            first_parts, first_run = calibrations[backend]
            adjacent = folder / f"calibration-{backend}"
            train_run(first_parts, backend, adjacent, args, folder / f"calibration-{backend}.log")
        run_dir = folder / f"run-{backend}"
        train = train_run(parts, backend, run_dir, args, folder / f"train-{backend}.log")
        train["structure_bytes_per_edge"] = structure_per_edge(run_dir)
        if adjacent is not None:
            train["estimate_s"], train["estimate_cmd"] = estimate_epoch(adjacent, manifest, backend, args)
            train["estimate_error"] = train["estimate_s"] / train["epoch_s"] - 1
            first, _ = estimate_epoch(first_run, manifest, backend, args)
            train["estimate_first_error"] = first / train["epoch_s"] - 1
        else:
            calibrations[backend] = (parts, run_dir)
        train["load_after"] = os.getloadavg()
        row[backend] = train
    return row


def chunks_for(nodes: int, args) -> int:
    """Chunks per graph server: at least ``--chunks``, and at most ``--chunk-rows`` rows each (a tensor
    task's memory, in a Lambda or a server thread, grows with its rows)."""
    return max(args.chunks, -(-nodes // (2 * args.chunk_rows)))


def train_run(parts: Path, backend: str, run_dir: Path, args, log: Path) -> dict:
    """`dorylus train` of ``parts`` on ``backend`` with 2 graph servers; its median epoch (epochs 2..E)."""
    nodes = json.loads((parts / "manifest.json").read_text())["nodes"]
    train = run(dorylus("train", "--data", str(parts), "--backend", backend, "-k", "2", "--epochs", str(args.epochs),
                        "--chunks", str(chunks_for(nodes, args)), "--lambdas", str(args.lambdas), "--out", str(run_dir),
                        "--overwrite", "--quiet"), log)
    train["chunks"] = chunks_for(nodes, args)
    epochs = [json.loads(line)["epoch_s"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train["epoch_s"] = statistics.median(epochs[1:] or epochs)
    return train


def _largest_step(row: dict) -> int:
    """The largest training job's memory (``prepare`` is left out: it picks METIS only where METIS's
    own estimate fits, so its memory does not grow in a line; at 2 M / 40 M METIS took 5.7 GB, at
    10 M / 200 M Fennel 2.3 GB)."""
    steps = [v for k, v in row.items() if k in ("cpu", "local")]
    return max([s.get("job_pss_peak", 0) for s in steps] + [s.get("peak_rss", 0) for s in steps])


def projected_bytes(done: list[dict], edges: int) -> int:
    """The largest step's memory at ``edges``: a line through the last two sizes measured (processes
    have a fixed part: interpreters, torch), or proportional to one size when only one is known."""
    measured = [r for r in done if "skipped" not in r]
    last = measured[-1]
    if len(measured) < 2:
        return int(_largest_step(last) * edges / last["edges"])
    before = measured[-2]
    slope = (_largest_step(last) - _largest_step(before)) / (last["edges"] - before["edges"])
    return int(_largest_step(last) + slope * (edges - last["edges"]))


def report(rows: list[dict]) -> str:
    g = lambda b: f"{b / GB:.2f}"  # noqa: E731
    lines = ["| size | step | wall s | peak GB | notes |", "| --- | --- | ---: | ---: | --- |"]
    for r in rows:
        size = f"{r['nodes'] / 1e6:g}M/{r['edges'] / 1e6:g}M"
        if "skipped" in r:
            lines.append(f"| {size} | skipped | | | {r['skipped']} |")
            continue
        if "synth" in r:
            lines.append(f"| {size} | synth | {r['synth']['wall_s']:.1f} | {g(r['synth']['peak_rss'])} | |")
        p = r["partition"]
        if "prepare" in r:
            lines.append(f"| {size} | prepare | {r['prepare']['wall_s']:.1f} | {g(r['prepare']['peak_rss'])} | "
                         f"{p['partitioner']}: cut {100 * p['edge_cut_fraction']:.1f} % (hash {100 * p['hash_edge_cut_fraction']:.1f} %), "
                         f"balance {p['balance']:.3f}; store {g(r['store_bytes'])} GB |")
        for backend in ("cpu", "local"):
            if backend not in r:
                continue
            t = r[backend]
            roles = ", ".join(f"{k} {g(v)}" for k, v in sorted(t["peak_by_role"].items()))
            est = (f"; estimate {t['estimate_s']:.2f} s ({100 * t['estimate_error']:+.0f} %; from the first "
                   f"calibration run {100 * t['estimate_first_error']:+.0f} %)" if "estimate_s" in t else "; calibration run")
            lines.append(f"| {size} | train {backend}, {t['chunks']} chunks | epoch {t['epoch_s']:.2f}{est} | {g(t['job_pss_peak'])} PSS, "
                         f"{g(t['job_rss_peak'])} RSS | beyond store {g(t['job_pss_peak'] - r['store_bytes'])} GB PSS; "
                         f"{roles} ({t['lambda_workers']} workers); structure B/edge "
                         f"{', '.join(f'{b:.1f}' for b in t['structure_bytes_per_edge'])}; load {t['load_after'][0]:.1f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0.2M/4M,2M/40M,10M/200M", help="VERTICES/EDGES, comma separated, smallest first")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--backends", default="cpu,local")
    ap.add_argument("--chunks", type=int, default=8, help="chunks per graph server, at least (default 8)")
    ap.add_argument("--chunk-rows", type=int, default=150_000, help="rows per chunk, at most (default 150,000)")
    ap.add_argument("--lambdas", type=int, default=4, help="local: emulated Lambdas in all (default 4)")
    ap.add_argument("--feature-dtype", default="float32", help="prepare's --feature-dtype (default float32)")
    ap.add_argument("--scratch", required=True, type=Path, help="folder for the graphs, stores and runs (GBs)")
    ap.add_argument("--keep", action="store_true", help="keep each size's graph and store (default: delete them)")
    ap.add_argument("--headroom", type=float, default=0.9, help="run a size only if its projection < this x available")
    args = ap.parse_args()
    args.backends = args.backends.split(",")
    rows, calibrations = [], {}
    for text in args.sizes.split(","):
        nodes, edges = parse_size(text)
        folder = args.scratch / text.replace("/", "_")
        if rows and "skipped" not in rows[-1]:
            need, free = projected_bytes(rows, edges), psutil.virtual_memory().available
            if need > args.headroom * free:
                rows.append({"nodes": nodes, "edges": edges, "skipped": f"projected {need / GB:.1f} GB > "
                             f"{args.headroom} x {free / GB:.1f} GB available now"})
                print(f"{text}: skipped ({rows[-1]['skipped']})", flush=True)
                continue
        print(f"{text}: running (load {os.getloadavg()[0]:.1f})", flush=True)
        rows.append(measure_size(nodes, edges, args, calibrations, folder))
        if not args.keep:  # the smallest size's store stays until the end: later sizes calibrate on it
            (folder / "graph.npz").unlink(missing_ok=True)
            if len(rows) > 1:
                shutil.rmtree(folder / "parts", ignore_errors=True)
        (args.scratch / "results.json").write_text(json.dumps(rows, indent=1, default=str))
        print(report(rows[-1:]), flush=True)
    if not args.keep and rows:
        shutil.rmtree(args.scratch / args.sizes.split(",")[0].replace("/", "_") / "parts", ignore_errors=True)
    print("\n" + report(rows))
    for r in rows:
        for backend in ("cpu", "local"):
            if backend in r and "estimate_cmd" in r[backend]:
                print(f"estimate ({r['nodes']:,} vertices, {backend}): {r[backend]['estimate_cmd']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
