"""The estimator's size-independent terms: a fixed cost per tensor task and idle time per chunk."""

import pytest

from dorylus_py.cost.estimate import Calibration, Setup, Workload, _fixed_task_seconds, _idle_seconds
from dorylus_py.cost.model import Prices


def _task(kind, layer, seconds, server=0, chunk=0, epoch=2, start=0.0):
    return {"kind": kind, "layer": layer, "server": server, "chunk": chunk, "epoch": epoch, "start": start,
            "end": start + seconds}


def test_fixed_task_cost_is_the_intercept_of_duration_against_work():
    work = Workload(nodes=1000, edges=10_000, dims=[64, 16, 10])
    rows = work.nodes / 2  # two chunks below
    per_unit, fixed = 2e-7, 0.004
    tasks = []
    for chunk in range(2):
        for kind, layer, units in (("fwd", 0, 64 * 16), ("fwd", 1, 16 * 10), ("bwd", 1, 2 * 16 * 10), ("loss", 1, 10)):
            tasks.append(_task(kind, layer, fixed + per_unit * rows * units, chunk=chunk))
    assert _fixed_task_seconds(tasks, work) == pytest.approx(fixed)
    assert _fixed_task_seconds(tasks[:2], work) == 0.0  # too few to tell


def test_idle_is_epoch_time_minus_the_busiest_servers_busy_time():
    tasks = [_task("fwd", 0, 1.0, server=0, start=0.0), _task("fwd", 0, 1.0, server=0, start=0.5),  # busy 1.5
             _task("gather", 0, 0.5, server=1, start=0.0)]
    metrics = [{"epoch": 2, "epoch_s": 2.0}, {"epoch": 3, "epoch_s": 2.5}]  # epoch 3: nothing ran
    assert _idle_seconds(tasks, metrics, 2) == pytest.approx((0.5 + 2.5) / 2)


def test_idle_grows_with_chunks_and_work_with_the_graph():
    cal = Calibration(graph_s_per_unit=1e-6, tensor_s_per_unit=1e-8, billed_per_measured=1.0, tasks_per_server_chunk=8,
                      startup_s=0.0, overlap=1.0, instance="c5.2xlarge", memory_mb=3008, source="hand", task_s=0.01,
                      idle_s_per_chunk=0.1)
    prices = Prices.load()
    setup = Setup("cpu", 2, 1, "c5.2xlarge", 4, 3008, chunks=4, epochs=1)
    small, large = Workload(1000, 10_000, [8, 4, 2]), Workload(10_000, 100_000, [8, 4, 2])
    e_small, e_large = (cal.estimate(w, setup, prices)["epoch s"] for w in (small, large))
    fixed = 0.1 * 4 + 0.01 * 8 * 2 * 4 / (2 * 2)  # idle, and the per-task cost over 2 servers x 2 threads
    assert e_large - fixed == pytest.approx(10 * (e_small - fixed))
