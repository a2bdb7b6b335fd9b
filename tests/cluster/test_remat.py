"""``--remat``: sync graph servers keep only what backward reads (``graph_servers/graph_state.py``).
Nothing may change but the memory: the same losses and accuracies to the bit, for every model and the
fused last layer, whose input backward now recomputes. Which buffers it shares:
``tests/graph_servers/test_graph_state.py``."""

import json

import pytest

from dorylus_py.cluster.launcher import train_distributed
from dorylus_py.config import ConfigError, TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.training import RunRecord
from tests.cluster import assert_gradients_once


def run(graph, tmp_path, name, **kw):
    cfg = TrainConfig(**{"epochs": 3, "dropout": 0.5, "chunks": 3, "feature_norm": "none", "backend": "cpu",
                         "checkpoint_every": 0, "hidden": 8} | kw)
    parts = tmp_path / "parts"
    if not parts.exists():
        prepare(graph, parts, cfg.graph_servers)
    result = train_distributed(cfg, parts, RunRecord(tmp_path / name, cfg.to_dict()), "none", show_progress=False)
    starts = [json.loads(line.split(" start ", 1)[1]) for p in sorted((tmp_path / name / "logs").glob("graph-server-*"))
              for line in p.read_text().splitlines() if " start {" in line]
    return result, starts


@pytest.mark.parametrize("kw", [
    {"model": "gcn", "fuse": "on"},  # the fused last layer: P̃ recomputed for its backward
    {"model": "gcn", "fuse": "off", "backend": "local", "lambdas": 2},
    {"model": "sage"},
    pytest.param({"model": "gat", "heads": 2}, marks=pytest.mark.slow),
], ids=["gcn-fused", "gcn-local", "sage", "gat"])
@pytest.mark.long
def test_remat_changes_no_bit_and_keeps_fewer_buffers(small_graph, tmp_path, kw):
    kept, kept_starts = run(small_graph, tmp_path, "kept", **kw)
    remat, remat_starts = run(small_graph, tmp_path, "remat", remat=True, **kw)
    for key in ("loss", "train_acc", "val_acc", "test_acc"):
        assert [r[key] for r in remat.history] == [r[key] for r in kept.history], key
    assert_gradients_once(remat.summary, 3 * 2 * 2 * 3)
    for a, b in zip(kept_starts, remat_starts):
        assert not a["remat"] and b["remat"]
        assert b["buffer_bytes"] < 0.75 * a["buffer_bytes"], (a["buffer_bytes"], b["buffer_bytes"])


def test_remat_is_refused_where_buffers_are_never_free():
    for kw in ({"backend": "local", "mode": "async"}, {"backend": "reference"}):
        with pytest.raises(ConfigError, match='^remat=True is for mode="sync"'):
            TrainConfig(remat=True, **kw).check()
    TrainConfig(remat=True, backend="cpu").check()
