import numpy as np
import pytest

from dorylus_py.data import SynthConfig, generate
from dorylus_py.partition import assign, prepare
from dorylus_py.partition.partitioners import (
    _capped_argmax,
    choose,
    fennel,
    metis_bytes,
)


def _cut(graph, owner) -> float:
    src, dst = graph.edges()
    return float((owner[src] != owner[dst]).mean())


@pytest.fixture(scope="module")
def community_graph():
    return generate(SynthConfig(nodes=20_000, edges=300_000, features=4, homophily=0.6, seed=5))


@pytest.mark.parametrize("parts", [2, 4])
def test_fennel_cuts_far_fewer_edges_than_hash_and_balances_vertices_and_edges(community_graph, parts):
    g = community_graph
    owner = fennel(g.indptr, g.indices, parts)
    rows = np.bincount(owner, weights=np.diff(g.indptr) + 1, minlength=parts)
    vertices = np.bincount(owner, minlength=parts)
    assert vertices.max() / vertices.mean() <= 1.04 and rows.max() / rows.mean() <= 1.04
    hash_cut = _cut(g, assign(g, parts, "hash"))
    assert _cut(g, owner) < 0.8 * hash_cut
    assert _cut(g, assign(g, parts, "metis")) <= _cut(g, owner)  # METIS stays the best
    assert np.array_equal(owner, fennel(g.indptr, g.indices, parts))  # seeded


def test_every_method_gives_every_partition_vertices(small_graph):
    for method in ("metis", "fennel", "hash", "auto"):
        owner = assign(small_graph, 5, method)
        counts = np.bincount(owner, minlength=5)
        assert counts.min() > 0 and counts.max() / counts.mean() < 1.3


def test_capped_argmax_respects_room_in_every_constraint():
    rng = np.random.default_rng(0)
    score = rng.random((1000, 3))
    score[:, 0] += 1.0  # everyone wants column 0
    weight = np.stack([np.ones(1000), rng.integers(1, 40, 1000).astype(float)], axis=1)
    scale = weight.sum(axis=0)
    room = np.array([[0.2, 0.25], [0.5, 0.5], [0.5, 0.5]])
    choice = _capped_argmax(score, weight, room, scale)
    for k in range(3):
        assert (weight[choice == k].sum(axis=0) / scale <= room[k] + 1e-12).all()
    kept = choice == 0  # column 0 kept the rows that prefer it most
    assert (score[kept, 0] - score[kept, 1:].max(axis=1)).mean() > (score[~kept, 0] - score[~kept, 1:].max(axis=1)).mean()


def test_auto_picks_metis_only_when_its_estimate_fits(small_graph, tmp_path):
    need = metis_bytes(small_graph.num_nodes, small_graph.num_edges)
    assert choose(small_graph.num_nodes, small_graph.num_edges, 2, need)[0] == "metis"
    method, why = choose(small_graph.num_nodes, small_graph.num_edges, 2, need - 1)
    assert method == "fennel" and "over the" in why
    m = prepare(small_graph, tmp_path / "small", 2, "auto", memory_budget=need - 1)
    assert m["partitioner"] == "fennel" and "METIS would need" in m["partitioner_note"]
    m = prepare(small_graph, tmp_path / "big", 2, "auto", memory_budget=need)
    assert m["partitioner"] == "metis" and "within" in m["partitioner_note"]
