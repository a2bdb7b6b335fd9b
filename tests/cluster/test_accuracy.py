"""Cora through the whole `local` system (graph servers, weight server, emulated Lambdas), 3 seeds.

The published 2-layer GCN test accuracy is 81.5 %; sync mode must reach 80.5 % on average and
async mode with staleness 1 must reach 80.0 %. About 4-5 minutes on 2 cores.
"""

import numpy as np
import pytest

from dorylus_py.cluster.launcher import train_distributed
from dorylus_py.config import TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.training import RunRecord


@pytest.fixture(scope="module")
def cora_parts(cora, tmp_path_factory):
    path = tmp_path_factory.mktemp("cora") / "parts"
    prepare(cora, path, 2)
    return path


@pytest.mark.parametrize("mode, chunks, floor", [("sync", 1, 0.805), ("async", 2, 0.800)])
def test_cora_local_two_graph_servers(cora_parts, tmp_path, mode, chunks, floor):
    accs = []
    for seed in range(3):
        cfg = TrainConfig(backend="local", graph_servers=2, lambdas=4, chunks=chunks, mode=mode, staleness=1,
                          seed=seed, feature_norm="row")
        record = RunRecord(tmp_path / f"{mode}-{seed}", cfg.to_dict())
        accs.append(train_distributed(cfg, cora_parts, record, "row", show_progress=False).summary["test_acc_at_best_val"])
    assert np.mean(accs) >= floor, accs
