import json

import numpy as np
import pytest
import torch

from dorylus_py.data import load_graph
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.kernels import NormalizedAdjacency, spmm
from dorylus_py.partition import PartitionStore, assign, prepare
from tests.data.test_formats import same


@pytest.mark.parametrize("method", ["metis", "hash"])
def test_cora_partitions_reassemble_exactly(cora, tmp_path, method):
    m = prepare(cora, tmp_path / "p", 4, method)
    assert m["partitions"] == 4 and len(m["parts"]) == 4
    assert sum(p["nodes"] for p in m["parts"]) == cora.num_nodes
    assert same(PartitionStore.open(tmp_path / "p").assemble(), cora)
    assert same(load_graph(tmp_path / "p"), cora)
    if method == "metis":
        hash_cut = prepare(cora, tmp_path / "h", 4, "hash")["edge_cut"]
        assert m["edge_cut"] < hash_cut / 3  # METIS really minimises the cut


@pytest.mark.parametrize("parts", [1, 3])
def test_distributed_gather_equals_global(small_graph, tmp_path, parts):
    """Each partition's [local | ghost] CSR, fed ghost rows through the send lists, gives the rows of Â·H."""
    prepare(small_graph, tmp_path / "p", parts, "metis")
    store = PartitionStore.open(tmp_path / "p")
    h = torch.randn(small_graph.num_nodes, 6)
    expected = spmm(NormalizedAdjacency.for_graph(small_graph), h)
    loaded = [store.load(k) for k in range(parts)]
    local_h = [h[torch.from_numpy(np.array(p.global_ids))] for p in loaded]
    for p in loaded:
        ghosts = torch.zeros(p.num_ghosts, 6)
        for peer in range(parts):  # what each peer sends, in its send-list order, lands in our ghost slice
            sent = local_h[peer][torch.from_numpy(np.array(loaded[peer].sends_to(p.index)))]
            ghosts[p.ghosts_from(peer)] = sent
        adj = NormalizedAdjacency.from_csr(p.indptr, p.indices, p.weights, (p.num_local, p.num_local + p.num_ghosts))
        out = spmm(adj, torch.cat([local_h[p.index], ghosts]))
        torch.testing.assert_close(out, expected[torch.from_numpy(np.array(p.global_ids))], rtol=1e-5, atol=1e-6)
        assert p.ghosts_from(p.index).stop == p.ghosts_from(p.index).start  # never a ghost of itself


def test_store_detects_corruption_and_truncation(small_graph, tmp_path):
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


def test_assignment_is_balanced_and_complete(small_graph):
    for method in ("metis", "hash"):
        owner = assign(small_graph, 5, method)
        counts = np.bincount(owner, minlength=5)
        assert counts.min() > 0 and counts.max() / counts.mean() < 1.3
