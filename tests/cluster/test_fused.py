"""Whole jobs with GCN's fused last layer (``--fuse on``) against ``--fuse off``: the same per-epoch loss,
fewer tensor-task invocations per epoch (no loss task, no forward or backward task of the last layer)."""

import json
from collections import Counter

import numpy as np
import pytest

from dorylus_py.cli import build_parser
from dorylus_py.cluster.launcher import train_distributed
from dorylus_py.config import TrainConfig
from dorylus_py.errors import ConfigError
from dorylus_py.models.spec import fuses_last_layer
from dorylus_py.plan import plan
from dorylus_py.partition import prepare
from dorylus_py.training import RunRecord, train_reference
from tests.cluster import assert_gradients_once


def run(graph, tmp_path, name, **kw):
    cfg = TrainConfig(**{"epochs": 3, "dropout": 0.0, "chunks": 3, "lambdas": 3, "feature_norm": "none",
                         "graph_servers": 2, "checkpoint_every": 0} | kw)
    parts = tmp_path / f"parts-{cfg.graph_servers}"
    if not parts.exists():
        prepare(graph, parts, cfg.graph_servers)
    record = RunRecord(tmp_path / name, cfg.to_dict())
    return train_distributed(cfg, parts, record, "none", show_progress=False)


def tensor_tasks(tmp_path, name, epoch):
    """(kind, train, layer) -> tensor tasks of ``epoch`` (graph work left out; a relaunch's copies, which a
    loaded machine may cause, count once)."""
    rows = [json.loads(line) for line in (tmp_path / name / "tasks.jsonl").read_text().splitlines()]
    return Counter((r["kind"], r["train"], r["layer"]) for r in {
        (r["kind"], r["train"], r["layer"], r["server"], r["chunk"]): r for r in rows
        if r["epoch"] == epoch and r["where"] != "graph-server" and r["kind"] != "resize"}.values())


def losses(result):
    return [r["loss"] for r in result.history]


@pytest.mark.long
def test_fused_sync_run_equals_unfused_with_fewer_invocations_per_epoch(small_graph, tmp_path):
    """Dropout on: the graph server draws the last layer's mask that a task would, by global vertex id."""
    fused = run(small_graph, tmp_path, "fused", backend="local", dropout=0.5, fuse="on")
    plain = run(small_graph, tmp_path, "plain", backend="local", dropout=0.5, fuse="off")
    np.testing.assert_allclose(losses(fused), losses(plain), rtol=1e-6)
    assert [r["val_acc"] for r in fused.history] == [r["val_acc"] for r in plain.history]
    assert fused.summary["weight_updates"] == plain.summary["weight_updates"] == 3 * 2
    assert_gradients_once(fused.summary, 3 * 2 * 2 * 3)  # the fused task carries the last layer's
    assert_gradients_once(plain.summary, 3 * 2 * 2 * 3)
    chunks = 2 * 3
    for epoch in (2, 3):
        got, before = tensor_tasks(tmp_path, "fused", epoch), tensor_tasks(tmp_path, "plain", epoch)
        assert before[("loss", True, 1)] == before[("bwd", True, 1)] == before[("fwd", True, 1)] == chunks
        assert got[("fused", True, 1)] == chunks
        assert not {("loss", True, 1), ("bwd", True, 1), ("fwd", True, 1)} & set(got)
        assert sum(got.values()) == sum(before.values()) - 2 * chunks  # 3 tasks -> 1 per chunk
        assert sum(got.values()) <= sum(before.values()) - before[("loss", True, 1)]  # at least the loss tasks' share


def test_fused_sync_run_equals_the_reference(small_graph, tmp_path):
    ref = train_reference(small_graph, TrainConfig(epochs=3, dropout=0.0, feature_norm="none"), show_progress=False)
    got = run(small_graph, tmp_path, "run", backend="cpu", graph_servers=3, fuse="on")  # auto: unfused on cpu
    np.testing.assert_allclose(losses(got), losses(ref), rtol=1e-6)
    assert [r["val_acc"] for r in got.history] == pytest.approx([r["val_acc"] for r in ref.history], abs=1e-6)
    assert_gradients_once(got.summary, 3 * 2 * 3 * 3)
    logs = "".join(p.read_text() for p in (tmp_path / "run" / "logs").glob("graph-server-*"))
    assert '"fused_last_layer": true' in logs


def test_async_fused_run_trains_and_applies_every_gradient_once(small_graph, tmp_path):
    got = run(small_graph, tmp_path, "run", backend="cpu", epochs=6, mode="async", staleness=1, dropout=0.5, fuse="on")
    assert [r["epoch"] for r in got.history] == list(range(1, 7))
    assert got.summary["weight_updates"] == 6 * 2
    assert_gradients_once(got.summary, 6 * 2 * 2 * 3)
    assert got.history[-1]["loss"] < got.history[0]["loss"]
    assert set(tensor_tasks(tmp_path, "run", 6)) == {("fwd", True, 0), ("fused", True, 1), ("bwd", True, 0),
                                                      ("fwd", False, 0), ("fwd", False, 1), ("eval", False, 1)}


def test_fuse_flags_backends_and_models_without_fusion():
    parse = build_parser().parse_args
    assert parse(["train", "--no-fuse"]).fuse == "off" and parse(["train", "--fuse", "on"]).fuse == "on"
    assert parse(["train"]).fuse == "auto"
    def fused(**settings) -> bool:  # on a graph of 16 features and 10 classes (hidden 16 unless given), as planned
        c = plan(TrainConfig(**settings), 16, 10, 1000).config
        return fuses_last_layer(c.model, c.layers, c.fuse)

    assert fused(backend="local", lambda_latency_ms=20) and fused(backend="lambda", lambda_function="f")
    assert fused(backend="local", lambda_bandwidth_mbps=200) and fused(backend="cpu", fuse="on")
    assert not fused(backend="cpu") and not fused(backend="local")  # no round trip or link time to save
    assert not fused(backend="lambda", lambda_function="f", hidden=21)  # the last Gather over twice as wide
    assert fused(backend="lambda", lambda_function="f", hidden=20)
    assert not fused(backend="local", fuse="off") and not fused(backend="local", model="sage")
    assert not fused(backend="local", layers=1, fuse="on")
    with pytest.raises(ConfigError, match="^fuse must be one of auto, on, off"):
        TrainConfig(backend="local", fuse="yes").check()
    from dorylus_py.models import model_spec

    assert {s.task for s in model_spec("gcn", [8, 4, 2]).stages(fused=True)} >= {"fused"}
    for name, dims in (("gcn", [8, 2]), ("sage", [8, 4, 2]), ("gat", [8, 4, 2])):
        assert not fuses_last_layer(name, len(dims) - 1, "on")
        assert model_spec(name, dims).stages(fused=True) == model_spec(name, dims).stages(fused=False)
