"""The Lambda network, emulated in process against a shaped one: the same job through the local
emulator's per-worker 200 Mbps link (``--lambda-bandwidth-mbps 200``, one machine, nothing shaped) and
through the lab (``dorylus_py/lab``: a Lambda service on a host of its own, ``--backend lambda`` over a
link shaped with tc).

Job: Cora (the package's ``dorylus_py/datasets/cora.npz``), 2 graph servers, sync, ``--lambdas 4``, dropout 0,
``--row-cache-mb 0`` (every epoch pulls the features again, 15.5 MB: without that, epochs after the
first move a few hundred KB and no link shows) and with the cache. Rows:

- ``emulator, unlimited`` and ``emulator, 200 Mbps a Lambda``: ``--backend local`` on one machine;
- ``lab, 200 Mbps a host pair``: the issue's shaping, Lambda host <-> each server 200 Mbit/s each way,
  server <-> server 10 Gbit/s (every Lambda of the host shares the host's link, as a host would);
- ``lab, 200 Mbps a Lambda``: the Lambda host's links at 200 Mbit/s times the service's workers (what
  Dorylus measured is a Lambda's own link: each Lambda brings one);
- ``lab, unshaped``.

Each row: the median epoch (epochs 2..) and the per-epoch losses' largest difference from the first
row's. CurveZMQ is on in the lab rows (``--no-curve``: off). Needs root. Rows alternate with
``--repeats``; a loaded 2-core machine is noisy, so quote the load averages printed.

    sudo python benchmarks/bench_lab.py [--epochs 8 --repeats 1] [--cache both|off|on]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from itertools import combinations
from pathlib import Path

from dorylus_py import children, datasets
from dorylus_py.lab.cluster import LabCluster, Placement
from dorylus_py.lab.lambda_service import Function
from dorylus_py.lab.shaping import Link

DATASETS = datasets.FOLDER
LAMBDAS = 4


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def links(lambda_mbit: float | None) -> list[Link]:
    if lambda_mbit is None:
        return []
    return [Link("d", s, lambda_mbit, 1) for s in "abc"] + [Link(x, y, 10_000, 0.1) for x, y in combinations("abc", 2)]


def record(out: Path) -> tuple[float, list[float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["epoch_s"] for r in rows[1:]), [r["loss"] for r in rows]


def emulator(parts: Path, out: Path, flags: list[str]) -> tuple[float, list[float]]:
    cmd = [*children.module("dorylus_py"), "train", "--data", str(parts), "--out", str(out), "--backend", "local",
           "--quiet", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return record(out)


def lab(parts: Path, out: Path, flags: list[str], lambda_mbit: float | None, curve: bool) -> tuple[float, list[float]]:
    with LabCluster(out.parent / f"{out.name}-lab", Placement.standard(2), links(lambda_mbit), curve=curve,
                    function=Function(concurrency=LAMBDAS)) as cluster:
        code = cluster.train(parts, out, cluster.lambda_flags() + flags, timeout_s=1800)
        if code:
            sys.exit(f"lab job failed:\n{cluster.log('driver')[-2000:]}")
    return record(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--cache", choices=["both", "off", "on"], default="both")
    ap.add_argument("--no-curve", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-lab-") as tmp:
        root = Path(tmp)
        parts = root / "cora-2"
        subprocess.run([*children.module("dorylus_py"), "prepare", str(DATASETS / "cora.npz"), "-k", "2", "--out",
                        str(parts)], check=True, capture_output=True)
        print(load(), flush=True)
        caches = {"both": ["off", "on"], "off": ["off"], "on": ["on"]}[args.cache]
        results: dict[str, list] = {}
        for cache in caches:
            flags = ["--epochs", str(args.epochs), "--dropout", "0", "--lambdas", str(LAMBDAS), "--mode", "sync",
                     "--feature-norm", "none"] + (["--row-cache-mb", "0"] if cache == "off" else [])
            rows = {"emulator, unlimited": lambda out: emulator(parts, out, flags),
                    "emulator, 200 Mbps a Lambda": lambda out: emulator(parts, out, [*flags, "--lambda-bandwidth-mbps", "200"]),
                    "lab, 200 Mbps a host pair": lambda out: lab(parts, out, flags, 200, not args.no_curve),
                    f"lab, 200 Mbps a Lambda ({200 * LAMBDAS} a host pair)":
                        lambda out: lab(parts, out, flags, 200 * LAMBDAS, not args.no_curve),
                    "lab, unshaped": lambda out: lab(parts, out, flags, None, not args.no_curve)}
            for r in range(args.repeats):
                for i, (name, run) in enumerate(rows.items()):
                    results.setdefault(f"cache {cache}: {name}", []).append(run(root / f"{cache}-{i}-{r}"))
                    print(f"  {cache} {name} repeat {r}: {results[f'cache {cache}: {name}'][-1][0]:.3f} s", flush=True)
        print(load())
        for cache in caches:
            base = None
            print(f"\nrow cache {cache} (--repeats {args.repeats}, CurveZMQ {'off' if args.no_curve else 'on'} in the lab)")
            print(f"{'':48} {'epoch s':>8} {'vs emulator 200':>16} {'max |loss diff|':>16}")
            emulated = statistics.median(e for e, _ in results[f"cache {cache}: emulator, 200 Mbps a Lambda"])
            for key, runs in results.items():
                if not key.startswith(f"cache {cache}:"):
                    continue
                epoch = statistics.median(e for e, _ in runs)
                base = base or runs[0][1]
                diff = max(abs(a - b) for _, loss in runs for a, b in zip(loss, base))
                print(f"{key.split(': ', 1)[1]:48} {epoch:8.3f} {epoch / emulated:15.2f}x {diff:16.1e}")


if __name__ == "__main__":
    main()
