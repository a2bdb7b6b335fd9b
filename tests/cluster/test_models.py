"""GAT and GraphSAGE through the whole distributed system (ApplyEdge tasks in the tensor workers,
weights by row block over the weight servers), against their reference trainers."""

import json

import numpy as np
import pytest

from dorylus_py.cluster.launcher import train_distributed
from dorylus_py.config import TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.training import RunRecord, train_reference
from tests.cluster import assert_gradients_once

GAT = dict(model="gat", hidden=4, heads=2)


def config(**kw) -> TrainConfig:
    return TrainConfig(**{"epochs": 3, "dropout": 0.0, "chunks": 3, "lambdas": 3, "feature_norm": "none"} | kw)


def run(graph, tmp_path, name, **kw):
    cfg = config(**kw)
    parts = tmp_path / f"parts-{cfg.graph_servers}"
    if not parts.exists():
        prepare(graph, parts, cfg.graph_servers)
    return train_distributed(cfg, parts, RunRecord(tmp_path / name, cfg.to_dict()), "none", show_progress=False)


def losses(result):
    return [r["loss"] for r in result.history]


@pytest.mark.parametrize("model, backend, k", [("gat", "cpu", 1), ("gat", "cpu", 3), ("gat", "local", 2),
                                              ("sage", "cpu", 2), ("sage", "local", 3)])
def test_sync_equals_the_reference(small_graph, tmp_path, model, backend, k):
    kw = GAT if model == "gat" else dict(model="sage")
    ref = train_reference(small_graph, config(**kw), show_progress=False)
    got = run(small_graph, tmp_path, "run", backend=backend, graph_servers=k, **kw)
    np.testing.assert_allclose(losses(got), losses(ref), rtol=1e-4)
    assert [r["val_acc"] for r in got.history] == pytest.approx([r["val_acc"] for r in ref.history], abs=1e-6)
    assert_gradients_once(got.summary, 3 * 2 * 3 * k)  # epochs x layers x chunks
    weights = np.load(tmp_path / "run" / "weights.npz")
    assert sorted(weights.files) == sorted(ref_tensor_names(model))
    if model == "gat":
        tasks = [json.loads(line) for line in (tmp_path / "run" / "tasks.jsonl").read_text().splitlines()]
        kinds = {t["kind"] for t in tasks}
        assert {"edge_fwd", "edge_bwd", "attn_grad"} <= kinds  # ApplyEdge in the workers, the SDDMM on the server
        assert all(t["where"] != "graph-server" for t in tasks if t["kind"].startswith("edge"))


def ref_tensor_names(model):
    if model == "gat":
        return [f"{b}{l}" for l in (0, 1) for b in ("W", "att_src", "att_dst", "b")]
    return [f"{b}{l}" for l in (0, 1) for b in ("W_self", "W_neigh", "b")]


@pytest.mark.long
def test_weights_spread_by_block_over_more_servers_than_layers_train_identically(small_graph, tmp_path):
    runs = [run(small_graph, tmp_path, f"m{m}", backend="cpu", graph_servers=2, weight_servers=m, epochs=2, **GAT)
            for m in (1, 2, 3)]
    assert losses(runs[1]) == losses(runs[0]) == losses(runs[2])  # bit for bit
    first = np.load(tmp_path / "m1" / "weights.npz")
    for m in (2, 3):
        other = np.load(tmp_path / f"m{m}" / "weights.npz")
        assert all(np.array_equal(first[k], other[k]) for k in first.files)
    assert runs[2].summary["weight_updates"] == 2 * 2 * 3  # each of 3 servers steps its blocks of 2 layers per epoch
    for r in runs:
        assert_gradients_once(r.summary, 2 * 2 * 2 * 3)


def test_attention_dropout_keyed_by_edge_reproduces_the_reference(small_graph, tmp_path):
    """One partition numbers vertices and edges as the reference does: dropout of inputs and of
    attention coefficients matches exactly, whichever chunk (or relaunch) draws it."""
    kw = dict(GAT, dropout=0.5, attn_dropout=0.3)
    ref = train_reference(small_graph, config(**kw), show_progress=False)
    got = run(small_graph, tmp_path, "run", backend="cpu", graph_servers=1, chunks=4, **kw)
    np.testing.assert_allclose(losses(got), losses(ref), rtol=1e-4)
    assert_gradients_once(got.summary, 3 * 2 * 4)


@pytest.mark.long
def test_gat_attention_dropout_over_two_partitions_does_not_depend_on_the_chunking(small_graph, tmp_path):
    """Edges keyed by their block position: every chunking of K = 2 draws the same masks (two runs per chunk)."""
    from dorylus_py.cluster.launcher import train_distributed
    from dorylus_py.config import TrainConfig
    from dorylus_py.training import RunRecord

    prepare(small_graph, tmp_path / "p", 2)
    runs = []
    for chunks in (1, 3):
        cfg = TrainConfig(epochs=2, chunks=chunks, lambdas=2, feature_norm="none", model="gat", hidden=4, heads=2,
                          dropout=0.0, attn_dropout=0.5, backend="cpu", graph_servers=2)
        result = train_distributed(cfg, tmp_path / "p", RunRecord(tmp_path / f"c{chunks}", cfg.to_dict()), "none",
                                   show_progress=False)
        runs.append([r["loss"] for r in result.history])
    np.testing.assert_allclose(runs[0], runs[1], rtol=1e-5)
    no_dropout = TrainConfig(epochs=2, chunks=3, lambdas=2, feature_norm="none", model="gat", hidden=4, heads=2,
                             dropout=0.0, attn_dropout=0.0, backend="cpu", graph_servers=2)
    plain = train_distributed(no_dropout, tmp_path / "p", RunRecord(tmp_path / "plain", no_dropout.to_dict()), "none",
                              show_progress=False)
    assert [r["loss"] for r in plain.history] != pytest.approx(runs[0], rel=1e-4)  # the dropout did something


def test_gat_async_with_failing_lambdas_applies_each_gradient_once(small_graph, tmp_path):
    got = run(small_graph, tmp_path, "run", backend="local", graph_servers=2, epochs=5, mode="async", staleness=1,
              lambda_fail_rate=0.2, relaunch_min_s=2.0, **GAT)
    assert got.summary["relaunches"] > 0
    assert got.summary["weight_updates"] == 5 * 2  # one per layer per epoch: every chunk gradient exactly once
    assert_gradients_once(got.summary, 5 * 2 * 2 * 3)
    assert [r["epoch"] for r in got.history] == list(range(1, 6))
    assert got.history[-1]["loss"] < got.history[0]["loss"]


@pytest.mark.long
def test_gat_checkpoint_resumes_on_another_number_of_weight_servers(small_graph, tmp_path):
    kw = dict(GAT, backend="cpu", graph_servers=1, dropout=0.5, checkpoint_every=2)
    straight = run(small_graph, tmp_path, "a", epochs=4, weight_servers=3, **kw)
    run(small_graph, tmp_path, "b1", epochs=2, weight_servers=3, **kw)
    cfg = config(epochs=4, weight_servers=2, **kw)
    resumed = train_distributed(cfg, tmp_path / "parts-1", RunRecord(tmp_path / "b2", cfg.to_dict()), "none",
                                show_progress=False, resume_from=str(tmp_path / "b1" / "checkpoints"))
    np.testing.assert_allclose(losses(resumed), losses(straight)[2:], rtol=1e-5)
    assert_gradients_once(resumed.summary, 2 * 2 * 3)  # the two epochs after the checkpoint
