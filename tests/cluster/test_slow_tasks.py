"""Slow and cold Lambdas: relaunch that cannot pile up copies, and results that stay exactly once.

Tasks that take longer than the relaunch allowance (600 ms of latency against --relaunch-min-s 0.5)
used to be relaunched over and over until the pool only ran stale copies. Now a copy that is not
wanted is told so at its first request, at most two copies of a task run at once, and allowances
are learned; the run's losses are those of a run without latency (sync mode is deterministic)."""

import json
from collections import defaultdict

import numpy as np
import pytest

from dorylus_py.cluster.launcher import train_distributed
from dorylus_py.config import TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.training import RunRecord
from tests.cluster import assert_gradients_once


@pytest.fixture(scope="module")
def parts(small_graph, tmp_path_factory):
    path = tmp_path_factory.mktemp("slow") / "parts"
    prepare(small_graph, path, 2)
    return path


def run(parts, run_dir, **kw):
    cfg = TrainConfig(**{"backend": "local", "graph_servers": 2, "epochs": 3, "chunks": 2, "lambdas": 4, "dropout": 0.5,
                         "feature_norm": "none", "checkpoint_every": 0} | kw)
    return train_distributed(cfg, parts, RunRecord(run_dir, cfg.to_dict()), "none", show_progress=False)


def most_copies_at_once(run_dir) -> int:
    """The largest number of copies of one task whose runs overlapped in time (tasks.jsonl)."""
    spans = defaultdict(list)
    for line in (run_dir / "tasks.jsonl").read_text().splitlines():
        t = json.loads(line)
        if t["where"] == "local-lambda":
            spans[(t["server"], t["kind"], t["train"], t["epoch"], t["layer"], t["chunk"])].append((t["start"], t["end"]))
    most = 0
    for intervals in spans.values():
        points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
        running = 0
        for _, step in points:
            running += step
            most = max(most, running)
    return most


@pytest.mark.parametrize("slow", [dict(lambda_latency_ms=600, relaunch_min_s=0.5), dict(lambda_cold_start_ms=3000)],
                         ids=["latency-600ms-relaunch-0.5s", "cold-start-3s"])
@pytest.mark.long
def test_slow_tasks_finish_without_piling_up_copies(parts, tmp_path, slow):
    plain = run(parts, tmp_path / "plain")
    got = run(parts, tmp_path / "slow", **slow)
    np.testing.assert_allclose([r["loss"] for r in got.history], [r["loss"] for r in plain.history], rtol=1e-6)
    assert most_copies_at_once(tmp_path / "slow") <= 2
    keys = 2 * 2 * 3 * 8  # servers x chunks x epochs x tensor stages per epoch (2 layers)
    assert got.summary["relaunches"] < keys // 2  # learned allowances: few extra copies, not one per tick
    assert got.summary["weight_updates"] == 3 * 2
    assert_gradients_once(got.summary, 3 * 2 * 2 * 2)  # however many copies ran, each gradient went once
