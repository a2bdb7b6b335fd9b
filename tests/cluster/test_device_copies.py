"""Whole jobs on the graph stages' device path (issue 33), on the CPU: with ``DORYLUS_DEVICE_COPIES=1``
every graph server keeps device twins of its buffers, copies in what its loop thread writes and copies
out what a stage wrote, as on a GPU. A missed copy in either direction changes a loss, so these runs
must equal the same jobs without twins bit for bit, and the reference where it numbers vertices alike."""

import pytest

from dorylus_py.cluster.launcher import train_distributed
from dorylus_py.config import TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.training import RunRecord, train_reference
from graph_servers.device_rows import COPIES_ENV
from tests.cluster import assert_gradients_once

KEYS = ("loss", "train_acc", "val_acc", "test_acc")


def run(graph, tmp_path, name, monkeypatch, copies: bool, **kw):
    monkeypatch.setenv(COPIES_ENV, "1" if copies else "0")  # the graph-server processes inherit it
    cfg = TrainConfig(**{"epochs": 2, "dropout": 0.5, "chunks": 3, "feature_norm": "none", "backend": "cpu",
                         "graph_servers": 2, "hidden": 8, "checkpoint_every": 0} | kw)
    parts = tmp_path / f"parts-{cfg.graph_servers}"
    if not parts.exists():
        prepare(graph, parts, cfg.graph_servers)
    return train_distributed(cfg, parts, RunRecord(tmp_path / name, cfg.to_dict()), "none", show_progress=False)


def history(result):
    return [[r[k] for k in KEYS] for r in result.history]


@pytest.mark.parametrize("kw", [
    {"model": "gcn", "fuse": "on"},  # the fused last layer's graph stages, its dropout drawn by the server
    {"model": "gcn", "fuse": "on", "remat": True},  # twins that share memory as remat's buffers do
    {"model": "sage"},
    {"model": "gat", "heads": 2, "attn_dropout": 0.3},
], ids=["gcn-fused", "gcn-remat", "sage", "gat"])
@pytest.mark.long
def test_sync_with_device_twins_equals_the_host_path_bit_for_bit(small_graph, tmp_path, monkeypatch, kw):
    host = run(small_graph, tmp_path, "host", monkeypatch, copies=False, **kw)
    twins = run(small_graph, tmp_path, "twins", monkeypatch, copies=True, **kw)
    assert history(twins) == history(host)
    assert_gradients_once(twins.summary, 2 * 2 * 3 * 2)  # epochs x layers x chunks x servers


def test_one_server_with_device_twins_equals_the_reference(small_graph, tmp_path, monkeypatch):
    """One partition numbers vertices as the reference does, so even its dropout matches."""
    ref = train_reference(small_graph, TrainConfig(epochs=2, dropout=0.5, feature_norm="none", hidden=8),
                          show_progress=False)
    got = run(small_graph, tmp_path, "twins", monkeypatch, copies=True, graph_servers=1, chunks=4)
    assert [r["loss"] for r in got.history] == pytest.approx([r["loss"] for r in ref.history], rel=1e-4)


def test_async_with_device_twins_learns(small_graph, tmp_path, monkeypatch):
    got = run(small_graph, tmp_path, "twins", monkeypatch, copies=True, mode="async", staleness=1, epochs=6,
              dropout=0.0, lr=0.05)
    losses = [r["loss"] for r in got.history]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.06  # as without twins (-0.14); ln 4 = 1.386 is chance
