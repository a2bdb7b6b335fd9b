"""The estimator's size-independent terms: a fixed cost per tensor task and idle time per chunk."""

import pytest

from dorylus_py.cost.estimate import (
    Calibration,
    Setup,
    Workload,
    _fixed_task_seconds,
    _idle_seconds,
)
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


def test_chunks_auto_is_resolved_as_dorylus_train_would_for_records_and_every_searched_configuration():
    from dorylus_py.cost.estimate import search, setup_of

    config = {"backend": "local", "graph_servers": 2, "lambdas": 6, "chunks": "auto", "mode": "sync",
              "graph": {"nodes": 1000, "edges": 10_000, "features": 8, "classes": 2}}
    assert setup_of(config, "c5.2xlarge").chunks == 3  # a record written through the API keeps "auto"
    assert setup_of(config | {"chunks": 5}, "c5.2xlarge").chunks == 5
    assert setup_of(config | {"mode": "async"}, "c5.2xlarge").chunks == 3  # async too: one per Lambda
    assert setup_of(config | {"mode": "async", "lambdas": "auto"}, "c5.2xlarge").chunks == 4
    cal = Calibration(graph_s_per_unit=1e-6, tensor_s_per_unit=1e-8, billed_per_measured=1.0, tasks_per_server_chunk=8,
                      startup_s=0.0, overlap=1.0, instance="c5.2xlarge", memory_mb=3008, source="hand", task_s=0.01,
                      idle_s_per_chunk=0.1)
    base = Setup("lambda", 2, 1, "c5.2xlarge", 32, 3008, chunks=16, epochs=1)
    work = Workload(100_000, 1_000_000, [8, 4, 2])
    rows = search(cal, work, base, Prices.load(), ["c5.2xlarge"], "auto")
    requests = {(r["backend"], r["graph servers"], r["lambdas"]): r["requests"] for r in rows}
    assert requests[("lambda", 2, 64)] == 8 * 2 * 32  # 32 chunks a server: one per Lambda
    assert requests[("lambda", 4, 16)] == 8 * 4 * 4
    fixed = {(r["backend"], r["graph servers"], r["lambdas"]): r["requests"]
             for r in search(cal, work, base, Prices.load(), ["c5.2xlarge"])}
    assert fixed[("lambda", 2, 64)] == 8 * 2 * 16  # without chunks: the base's for every configuration
