"""Cluster-GCN batches: the normalisation against a dense computation, and the per-epoch plan."""

import numpy as np
import pytest
import torch

from dorylus_py.decentral.batches import ClusterBatches, enhanced_adjacency
from dorylus_py.errors import ConfigError


def _dense_expected(graph, nodes, lam):
    a = np.zeros((graph.num_nodes, graph.num_nodes))
    src, dst = graph.edges()
    a[dst, src] = 1.0  # row = destination, as Gather reads it
    sub = a[np.ix_(nodes, nodes)] + np.eye(len(nodes))
    norm = sub / sub.sum(axis=1, keepdims=True)  # (D + I)^-1 (A + I)
    return norm + lam * np.diag(np.diag(norm))


@pytest.mark.parametrize("lam", [0.0, 1.0, 0.3])
def test_enhanced_adjacency_matches_dense(small_graph, lam):
    rng = np.random.default_rng(0)
    nodes = np.sort(rng.choice(small_graph.num_nodes, 150, replace=False))
    adj = enhanced_adjacency(small_graph.indptr, small_graph.indices, nodes, small_graph.num_nodes, lam)
    got = adj.matrix.to_dense().numpy()
    np.testing.assert_allclose(got, _dense_expected(small_graph, nodes, lam), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(adj.transpose.to_dense().numpy(), got.T, rtol=1e-6)


def test_epoch_plan_covers_every_cluster_once_and_is_shared(small_graph):
    a = ClusterBatches(small_graph, small_graph.features, clusters=10, per_batch=3, diag_lambda=1.0, seed=5)
    b = ClusterBatches(small_graph, small_graph.features, clusters=10, per_batch=3, diag_lambda=1.0, seed=5,
                       owner=a.owner)
    assert a.batches_per_epoch == 4
    for epoch in (1, 2):
        plan = a.epoch_plan(epoch)
        assert sorted(np.concatenate(plan).tolist()) == list(range(10))
        assert all(np.array_equal(x, y) for x, y in zip(plan, b.epoch_plan(epoch)))
    assert not all(np.array_equal(x, y) for x, y in zip(a.epoch_plan(1), a.epoch_plan(2)))
    nodes = np.concatenate([a.batch(1, i).nodes for i in range(a.batches_per_epoch)])
    assert sorted(nodes.tolist()) == list(range(small_graph.num_nodes))  # every vertex in exactly one batch
    batch = a.batch(1, 0)
    assert torch.equal(batch.y, torch.from_numpy(small_graph.labels[batch.nodes]))


def test_bad_cluster_settings(small_graph):
    with pytest.raises(ConfigError, match="clusters-per-batch"):
        ClusterBatches(small_graph, small_graph.features, clusters=4, per_batch=5, diag_lambda=1.0)
    with pytest.raises(ConfigError, match="does not fit"):
        ClusterBatches(small_graph, small_graph.features, clusters=4, per_batch=2, diag_lambda=1.0,
                       owner=np.full(small_graph.num_nodes, 7))
