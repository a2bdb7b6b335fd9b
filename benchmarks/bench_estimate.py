"""The cost estimator's epoch time against measured `cpu` runs, and against estimators blind to what changed.

Calibrated on a `cpu` run with 2 graph servers (20 features x 4 = 128-wide 30 k-vertex / 600 k-edge graph,
64 hidden, 2 chunks a server, one tensor thread, 5 epochs), the estimator predicts a run with 1 graph
server and one with 4x the features; beside each estimate, the estimate of an estimator blind to the
server count (or to the feature width), from the same calibration. K servers on one machine would share
its cores, where the model prices one instance per server: so every process of a K-server run is held
to K cores (CPU affinity), one per server, and the instance named is the same for all runs. The runs
alternate, each configuration ``--repeats`` times; each row is one repeat's ratios to the calibration
run just before it (the same load), so the estimate of the calibration run itself is 1.00x.

The default suite checks the same claims with quantities the load does not move
(``tests/cost/test_estimate.py``); these epoch times swing with other work on a shared machine.

    python benchmarks/bench_estimate.py --scratch /tmp/bench-estimate [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import replace
from pathlib import Path

from dorylus_py.cli import main as dorylus
from dorylus_py.cost.estimate import Calibration, setup_of, workload_of
from dorylus_py.cost.model import Prices, read_record

INSTANCE = "c5.xlarge"  # every server alike: only the vCPU ratio between calibration and estimate counts
RUNS = {  # name -> (features, graph servers), the calibration first
    "calibration": (128, 2),
    "1 server": (128, 1),
    "4x features": (512, 2),
}


def steady_epoch_s(run_dir: Path) -> float:
    _, metrics, *_ = read_record(run_dir)
    return statistics.median(m["epoch_s"] for m in metrics[1:])


def train(scratch: Path, name: str, repeat: int) -> Path:
    features, servers = RUNS[name]
    data = scratch / f"g{features}.npz"
    if not data.exists():
        assert dorylus(["synth", "--out", str(data), "--nodes", "30000", "--edges", "600000", "--features",
                        str(features), "--classes", "8"]) == 0
    out = scratch / f"{name.replace(' ', '-')}-{repeat}"
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores[:servers])  # the job's processes inherit it: one core a server
    try:
        assert dorylus(["train", "--backend", "cpu", "--data", str(data), "--graph-servers", str(servers),
                        "--partitioner", "hash", "--chunks", "2", "--tensor-threads", "1", "--hidden", "64",
                        "--epochs", "5", "--dropout", "0", "--quiet", "--out", str(out)]) == 0
    finally:
        os.sched_setaffinity(0, cores)
    return out


def estimate(cal: Calibration, run_dir: Path, blind_to: str | None = None, calibration: Path | None = None) -> float:
    config, *_ = read_record(run_dir)
    work, setup = workload_of(config), setup_of(config, INSTANCE)
    if blind_to is not None:
        base, *_ = read_record(calibration)
        if blind_to == "servers":
            setup = replace(setup, graph_servers=setup_of(base, INSTANCE).graph_servers)
        else:
            work = replace(work, dims=[workload_of(base).dims[0], *work.dims[1:]])
    return cal.estimate(work, setup, Prices.load())["epoch s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scratch", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # the graph servers inherit it
    args.scratch.mkdir(parents=True, exist_ok=True)
    print(f"{'run':<12} {'repeat':>6} {'measured':>9} {'estimated':>10} {'blind':>7}   (x the calibration run's epoch)")
    for repeat in range(1, args.repeats + 1):
        calibration = train(args.scratch, "calibration", repeat)
        cal = Calibration.from_record(str(calibration), INSTANCE)
        base = steady_epoch_s(calibration)
        for name, blind_to in (("1 server", "servers"), ("4x features", "features")):
            run = train(args.scratch, name, repeat)
            print(f"{name:<12} {repeat:>6} {steady_epoch_s(run) / base:>8.2f}x {estimate(cal, run) / base:>9.2f}x "
                  f"{estimate(cal, run, blind_to, calibration) / base:>6.2f}x", flush=True)


if __name__ == "__main__":
    main()
