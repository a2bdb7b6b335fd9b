import json

import numpy as np
import pytest
import torch

from dorylus_py.data import Graph
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.kernels import NormalizedAdjacency
from dorylus_py.kernels.sparse import BlockAdjacency
from dorylus_py.partition import PartitionStore, load_dataset, prepare
from tests.data.test_formats import same


def _adjacency(p) -> BlockAdjacency:
    """A loaded partition's blocks, as a graph server holds them (views of the memory-mapped arrays)."""
    local_t = None if p.local_symmetric else (p.local_t_indptr, p.local_t_indices, p.local_t_weights)
    return BlockAdjacency.from_arrays((p.local_indptr, p.local_indices, p.local_weights),
                                      (p.ghost_indptr, p.ghost_indices, p.ghost_weights), local_t, p.num_local, p.num_ghosts)


@pytest.mark.parametrize("method", ["metis", "fennel", "hash"])
def test_cora_partitions_reassemble_exactly(cora, tmp_path, method):
    m = prepare(cora, tmp_path / "p", 4, method)
    assert m["partitions"] == 4 and len(m["parts"]) == 4
    assert sum(p["nodes"] for p in m["parts"]) == cora.num_nodes
    assert same(PartitionStore.open(tmp_path / "p").assemble(), cora)
    assert same(load_dataset(tmp_path / "p"), cora)
    if method == "metis":
        assert m["edge_cut"] < m["hash_edge_cut"] / 3  # METIS really minimises the cut
    if method == "fennel":
        assert m["edge_cut"] < m["hash_edge_cut"] / 2


def _directed(graph: Graph) -> Graph:
    """``graph`` with a third of its edges kept in one direction only."""
    src, dst = graph.edges()
    keep = (src < dst) | (np.arange(len(src)) % 3 != 0)
    return Graph.from_edges(src[keep], dst[keep], graph.features, graph.labels, graph.train_mask, graph.val_mask,
                            graph.test_mask, num_classes=graph.num_classes)


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("method", ["metis", "fennel"])
def test_distributed_gather_and_backward_equal_global(small_graph, tmp_path, parts, directed, method):
    """Forward: each partition's blocks, fed ghost rows through the peers' send lists, give the rows of
    Â·H. Backward: Â_LLᵀ (or Â_LL itself when symmetric) and Â_LGᵀ, summed at the owners, give Âᵀ·G."""
    graph = _directed(small_graph) if directed else small_graph
    m = prepare(graph, tmp_path / "p", parts, method)
    assert all(p["local_symmetric"] != directed for p in m["parts"]) or parts == 1 and not directed
    store = PartitionStore.open(tmp_path / "p")
    adj = NormalizedAdjacency.for_graph(graph)
    h, grad = torch.randn(graph.num_nodes, 6), torch.randn(graph.num_nodes, 5)
    expected, expected_t = torch.sparse.mm(adj.matrix, h), torch.sparse.mm(adj.transpose, grad)
    loaded = [store.load(k) for k in range(parts)]
    ids = [torch.from_numpy(np.array(p.global_ids)) for p in loaded]
    got_t = torch.zeros_like(expected_t)
    for p in loaded:
        adj = _adjacency(p)
        ghosts = torch.zeros(p.num_ghosts, 6)
        for peer in range(parts):  # what each peer sends, in its send-list order, lands in our ghost slice
            ghosts[p.ghosts_from(peer)] = h[ids[peer]][torch.from_numpy(np.array(loaded[peer].sends_to(p.index)))]
        zg = torch.cat([h[ids[p.index]], ghosts])
        torch.testing.assert_close(adj.gather(zg), expected[ids[p.index]], rtol=1e-5, atol=1e-6)
        half = p.num_local // 2  # a chunk's rows are views that give the same rows
        torch.testing.assert_close(adj.rows(half, p.num_local).gather(zg), expected[ids[p.index]][half:], rtol=1e-5, atol=1e-6)
        got_t[ids[p.index]] += adj.gather_t(grad[ids[p.index]])
        for a, b in ((0, half), (half, p.num_local)):  # contributions to the ghosts' owners, chunk by chunk
            touched, ghost_t = adj.rows(a, b).ghost_transpose()
            got_t[torch.from_numpy(np.array(p.ghost_ids)[touched])] += torch.sparse.mm(ghost_t, grad[ids[p.index]][a:b])
        assert p.ghosts_from(p.index).stop == p.ghosts_from(p.index).start  # never a ghost of itself
        assert p.local_indices.dtype == np.int32 and p.local_weights.dtype == np.float32
        assert adj.local.col_indices().data_ptr() == torch.from_numpy(np.asarray(p.local_indices)).data_ptr()  # no copy
        assert adj.symmetric == (not directed)
    torch.testing.assert_close(got_t, expected_t, rtol=1e-5, atol=1e-6)
    assert same(store.assemble(), graph)


def test_stored_structure_is_8_bytes_per_entry_plus_row_pointers(small_graph, tmp_path):
    m = prepare(small_graph, tmp_path / "p", 2, "hash")
    store = PartitionStore.open(tmp_path / "p")
    for k, meta in enumerate(m["parts"]):
        p = store.load(k)
        assert p.structure_bytes() == meta["structure_bytes"] == 8 * meta["nnz"] + 2 * 4 * (meta["nodes"] + 1)
        assert p.local_symmetric and len(p.local_t_indices) == 0


def test_manifest_has_what_a_driver_needs(small_graph, tmp_path):
    m = prepare(small_graph, tmp_path / "p", 2, "fennel")
    s = small_graph.summary()
    assert m["summary"] == s
    assert m["features_nonnegative"] == bool((small_graph.features >= 0).all())
    assert m["hash_edge_cut"] > m["edge_cut"] > 0
    assert m["edge_cut_fraction"] == pytest.approx(m["edge_cut"] / small_graph.num_edges)


@pytest.mark.parametrize("dtype, tol", [("float16", 1e-3), ("bfloat16", 8e-3)])
def test_narrow_feature_storage_reads_back_as_float32(small_graph, tmp_path, dtype, tol):
    m = prepare(small_graph, tmp_path / "p", 2, "hash", feature_dtype=dtype)
    wide = prepare(small_graph, tmp_path / "w", 2, "hash")
    store = PartitionStore.open(tmp_path / "p")
    for k in range(2):
        p = store.load(k)
        assert p.features.itemsize == 2
        rows = p.feature_rows(3, 40)
        assert rows.dtype == np.float32
        exact = small_graph.features[np.asarray(p.global_ids)[3:40]]
        np.testing.assert_allclose(rows, exact, rtol=tol, atol=tol)
        narrow_bytes = m["parts"][k]["files"]["features.npy"]["bytes"]
        assert narrow_bytes < 0.51 * wide["parts"][k]["files"]["features.npy"]["bytes"]
    with pytest.raises(ConfigError, match="--feature-dtype"):
        prepare(small_graph, tmp_path / "q", 2, feature_dtype="int8")


def test_store_detects_corruption_truncation_and_old_versions(small_graph, tmp_path):
    prepare(small_graph, tmp_path / "p", 2, "hash")
    store = PartitionStore.open(tmp_path / "p")
    f = tmp_path / "p" / "part-00001" / "features.npy"
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 0xFF
    f.write_bytes(bytes(raw))
    store.load(0)  # the other partition is untouched and loads on its own
    with pytest.raises(DataError, match="features.npy: checksum mismatch"):
        store.load(1)
    f.write_bytes(bytes(raw[:-4]))
    with pytest.raises(DataError, match="features.npy: .* bytes, manifest says .* \\(truncated"):
        store.load(1)
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    (tmp_path / "p" / "manifest.json").write_text(json.dumps(manifest | {"version": 1}))
    with pytest.raises(DataError, match="format version 1 is not supported .* prepare the dataset again"):
        PartitionStore.open(tmp_path / "p")
    (tmp_path / "p" / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="manifest.json: not valid JSON"):
        PartitionStore.open(tmp_path / "p")


def test_prepare_refuses_to_overwrite_and_leaves_nothing_on_failure(small_graph, tmp_path):
    prepare(small_graph, tmp_path / "p", 2)
    with pytest.raises(DataError, match="already exists"):
        prepare(small_graph, tmp_path / "p", 2)
    with pytest.raises(ConfigError, match="exceeds"):
        prepare(small_graph, tmp_path / "q", small_graph.num_nodes + 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]
    m = prepare(small_graph, tmp_path / "p", 3, overwrite=True)
    assert json.loads((tmp_path / "p" / "manifest.json").read_text())["partitions"] == m["partitions"] == 3
