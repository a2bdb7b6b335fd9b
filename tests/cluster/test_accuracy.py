"""Cora through the whole `local` system (graph servers, weight server, emulated Lambdas).

The published 2-layer GCN test accuracy is 81.5 %. Over 3 seeds, sync mode must reach 80.5 % on average
and async mode with staleness 1 must reach 80.0 % (``pytest --slow``, about 3 minutes on 2 cores). The
default suite trains seed 0 per mode (about 50 s): sync is deterministic (80.3 %) and must keep 80.5 %
less a point; async varies from run to run (seed 0 gave 78.4 % once), so its floor is 77.5 %: that
catches a broken pipeline, not a small loss of accuracy, which the 3-seed test is for. Async with
``--stale-smoothing 0.95`` and ``--stale-step inverse`` (issue 39) must keep async's one-seed floor.
"""

import numpy as np
import pytest

from dorylus_py.cluster.launcher import train_distributed
from dorylus_py.config import TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.training import RunRecord

MODES = [("sync", 1, 0.805), ("async", 2, 0.800)]  # mode, chunks, floor of the 3-seed mean
ONE_SEED_FLOOR = {"sync": 0.795, "async": 0.775}


@pytest.fixture(scope="module")
def cora_parts(cora, tmp_path_factory):
    path = tmp_path_factory.mktemp("cora") / "parts"
    prepare(cora, path, 2)
    return path


def _test_accuracy(parts, out, mode: str, chunks: int, seed: int, **settings) -> float:
    cfg = TrainConfig(backend="local", graph_servers=2, lambdas=4, chunks=chunks, mode=mode, staleness=1,
                      seed=seed, feature_norm="row", **settings)
    record = RunRecord(out / f"{mode}-{seed}-{len(settings)}", cfg.to_dict())
    return train_distributed(cfg, parts, record, "row", show_progress=False).summary["test_acc_at_best_val"]


@pytest.mark.parametrize("mode, chunks, floor", MODES)
@pytest.mark.long
def test_cora_local_two_graph_servers_one_seed(cora_parts, tmp_path, mode, chunks, floor):
    acc = _test_accuracy(cora_parts, tmp_path, mode, chunks, seed=0)
    assert acc >= ONE_SEED_FLOOR[mode], acc


@pytest.mark.long
@pytest.mark.parametrize("settings", [{"stale_smoothing": 0.95}, {"stale_smoothing": 0.95, "stale_step": "inverse"}],
                         ids=["smoothing", "smoothing-and-stale-step"])
def test_cora_async_with_stale_smoothing_one_seed(cora_parts, tmp_path, settings):
    acc = _test_accuracy(cora_parts, tmp_path, "async", 2, seed=0, **settings)
    assert acc >= ONE_SEED_FLOOR["async"], acc


@pytest.mark.slow
@pytest.mark.parametrize("mode, chunks, floor", MODES)
def test_cora_local_two_graph_servers(cora_parts, tmp_path, mode, chunks, floor):
    accs = [_test_accuracy(cora_parts, tmp_path, mode, chunks, seed) for seed in range(3)]
    assert np.mean(accs) >= floor, accs
