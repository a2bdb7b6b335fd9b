"""Whole jobs with the Lambda optimisations of issue 14: the autotuned pool (``--lambdas auto``), capped
Lambda bandwidth (``--lambda-bandwidth-mbps``), the warm workers' static-row cache (``--row-cache-mb``),
and what they must not change (sync mode still equals full-batch training)."""

import json

import numpy as np
import pytest

from dorylus_py.cluster.launcher import train_distributed
from dorylus_py.config import TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.training import RunRecord, train_reference
from tests.cluster import assert_gradients_once


def run(graph, tmp_path, name, **kw):
    cfg = TrainConfig(**{"epochs": 3, "dropout": 0.0, "chunks": 3, "lambdas": 2, "feature_norm": "none",
                         "backend": "local", "checkpoint_every": 0} | kw)
    parts = tmp_path / f"parts-{cfg.graph_servers}"
    if not parts.exists():
        prepare(graph, parts, cfg.graph_servers)
    record = RunRecord(tmp_path / name, cfg.to_dict())
    return train_distributed(cfg, parts, record, "none", show_progress=False)


def losses(result):
    return [r["loss"] for r in result.history]


def rows(tmp_path, name):
    return [json.loads(line) for line in (tmp_path / name / "tasks.jsonl").read_text().splitlines()]


def test_an_autotuned_pool_stays_in_its_bounds_and_changes_no_result(small_graph, tmp_path):
    ref = train_reference(small_graph, TrainConfig(epochs=5, dropout=0.0, feature_norm="none"), show_progress=False)
    got = run(small_graph, tmp_path, "auto", epochs=5, lambdas="auto", lambdas_min=2, lambdas_max=8, chunks=4,
              lambda_latency_ms=30)
    np.testing.assert_allclose(losses(got), losses(ref), rtol=1e-4)
    assert_gradients_once(got.summary, 5 * 2 * 2 * 4)  # epochs x layers x chunks of 2 servers
    resizes = [r for r in rows(tmp_path, "auto") if r["kind"] == "resize"]
    assert resizes, "30 ms of latency and 4 chunks per server on one worker each: the pool should grow"
    assert all(1 <= r["size"] <= 4 and r["reason"] and r["billed_ms"] == 0 for r in resizes)
    logs = "".join(p.read_text() for p in (tmp_path / "auto" / "logs").glob("graph-server-*"))
    assert "lambdas 1 -> " in logs


def test_a_capped_link_changes_no_result_and_makes_tasks_take_the_time_their_bytes_need(small_graph, tmp_path):
    ref = train_reference(small_graph, TrainConfig(epochs=2, dropout=0.0, feature_norm="none"), show_progress=False)
    got = run(small_graph, tmp_path, "slow", epochs=2, lambdas=4, lambda_bandwidth_mbps=1)
    np.testing.assert_allclose(losses(got), losses(ref), rtol=1e-4)
    assert_gradients_once(got.summary, 2 * 2 * 2 * 3)
    rows_per_chunk = small_graph.num_nodes / 2 / 3
    need_s = rows_per_chunk * small_graph.features.shape[1] * 4 * 8 / 1e6  # a chunk's features, at 1 Mbps
    fwd0 = [r for r in rows(tmp_path, "slow") if r["kind"] == "fwd" and r["train"] and r["layer"] == 0 and r["ok"]]
    assert len(fwd0) >= 12 and min(r["end"] - r["start"] for r in fwd0) >= 0.9 * need_s, (need_s, fwd0)


@pytest.mark.parametrize("model", ["gcn", pytest.param("sage", marks=pytest.mark.slow)])  # sage: the same path
@pytest.mark.long
def test_the_row_cache_changes_no_bit_and_sends_each_chunks_features_once(small_graph, tmp_path, model):
    epochs, kw = 3, {"model": model, "dropout": 0.5}
    cached = run(small_graph, tmp_path, "cached", epochs=epochs, **kw)  # one worker per graph server: it sees every chunk
    uncached = run(small_graph, tmp_path, "uncached", epochs=epochs, row_cache_mb=0, **kw)
    assert losses(cached) == losses(uncached)
    assert [r["val_acc"] for r in cached.history] == [r["val_acc"] for r in uncached.history]
    sent = {name: [sum(r["servers"][k]["bytes"] for r in result.history) for k in range(2)]
            for name, result in (("cached", cached), ("uncached", uncached))}
    features = small_graph.features.shape[1] * 4 * small_graph.num_nodes  # bytes of all the servers' rows
    # uncached: three pulls of every chunk's features an epoch; cached: only the first
    saved = sum(sent["uncached"]) - sum(sent["cached"])
    assert saved == pytest.approx((3 * epochs - 1) * features, rel=0.05), sent
