import numpy as np
import pytest

from dorylus_py.data import Sources, from_pyg, load_graph, write_bsnap, write_npz
from dorylus_py.errors import DataError


def same(a, b):
    return (
        np.array_equal(a.indptr, b.indptr)
        and np.array_equal(a.indices, b.indices)
        and np.array_equal(a.features, b.features)
        and np.array_equal(a.labels, b.labels)
        and all(np.array_equal(a.mask(s), b.mask(s)) for s in ("train", "val", "test"))
        and a.num_classes == b.num_classes
    )


def test_npz_round_trip(small_graph, tmp_path):
    write_npz(small_graph, tmp_path / "g.npz")
    assert same(load_graph(tmp_path / "g.npz"), small_graph)
    assert [p.name for p in tmp_path.iterdir()] == ["g.npz"]  # no temporary left behind


def test_reference_dataset_layout(cora):
    assert (cora.num_nodes, cora.num_edges, cora.num_features, cora.num_classes) == (2708, 10556, 1433, 7)
    assert (cora.train_mask.sum(), cora.val_mask.sum(), cora.test_mask.sum()) == (140, 500, 1000)


def test_citeseer_unlabelled_vertices_allowed(citeseer):
    assert (citeseer.labels == -1).sum() == 15


def test_bsnap_round_trip(small_graph, tmp_path):
    write_bsnap(small_graph, tmp_path / "ds")
    g = load_graph(tmp_path / "ds", Sources(split_seed=3))
    same_split = Sources(masks=str(tmp_path / "m.npz"))
    np.savez(tmp_path / "m.npz", **{f"{s}_mask": small_graph.mask(s) for s in ("train", "val", "test")})
    assert np.array_equal(g.indices, small_graph.indices) and np.array_equal(g.features, small_graph.features)
    assert same(load_graph(tmp_path / "ds" / "graph.bsnap", same_split), small_graph)
    header = np.fromfile(tmp_path / "ds" / "graph.bsnap", dtype=np.uint32, count=4)
    assert header[0] == 4 and header[1] == small_graph.num_nodes


@pytest.mark.parametrize(
    "name, cut, message",
    [
        ("graph.bsnap", 5, "truncated or corrupt"),
        ("graph.bsnap", -8 * 10**9, "shorter than the 16-byte header"),
        ("features.bsnap", 4, "float32 features need"),
        ("labels.bsnap", 4, "one uint32 label each"),
    ],
)
def test_bsnap_truncated(small_graph, tmp_path, name, cut, message):
    write_bsnap(small_graph, tmp_path)
    path = tmp_path / name
    data = path.read_bytes()
    path.write_bytes(data[:10] if cut < 0 else data[:-cut])
    with pytest.raises(DataError, match=message):
        load_graph(tmp_path)


def test_bsnap_label_out_of_range(small_graph, tmp_path):
    write_bsnap(small_graph, tmp_path)
    raw = bytearray((tmp_path / "labels.bsnap").read_bytes())
    raw[0:4] = np.uint32(2).tobytes()  # class count 2, but labels go to 3
    (tmp_path / "labels.bsnap").write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"labels.bsnap: label 3 of vertex \d+ is out of range \[0, 2\)"):
        load_graph(tmp_path)


def test_edge_list(tmp_path):
    (tmp_path / "g.txt").write_text("# a comment\n0 1\n1 0\n\n1 2   # trailing\n2 1\n")
    np.save(tmp_path / "x.npy", np.eye(3, dtype=np.float32))
    np.save(tmp_path / "y.npy", np.array([0, 1, 0]))
    g = load_graph(tmp_path / "g.txt", Sources(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"), train_frac=0.4))
    assert g.num_nodes == 3 and g.num_edges == 4 and g.train_mask.sum() == 1
    with pytest.raises(DataError, match="needs --features"):
        load_graph(tmp_path / "g.txt")
    (tmp_path / "bad.txt").write_text("0 1\n1 x\n")
    with pytest.raises(DataError, match="bad.txt:2: not an edge list"):
        load_graph(tmp_path / "bad.txt", Sources(str(tmp_path / "x.npy"), str(tmp_path / "y.npy")))
    (tmp_path / "far.txt").write_text("0 1\n1 3\n")
    with pytest.raises(DataError, match="far.txt: destination vertex id 3 is out of range"):
        load_graph(tmp_path / "far.txt", Sources(str(tmp_path / "x.npy"), str(tmp_path / "y.npy")))


def test_npz_errors(small_graph, tmp_path):
    write_npz(small_graph, tmp_path / "g.npz")
    data = (tmp_path / "g.npz").read_bytes()
    (tmp_path / "t.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="t.npz: not a readable .npz"):
        load_graph(tmp_path / "t.npz")
    np.savez(tmp_path / "m.npz", src=[0], dst=[1])
    with pytest.raises(DataError, match="missing array"):
        load_graph(tmp_path / "m.npz")
    with pytest.raises(DataError, match="no such file"):
        load_graph(tmp_path / "nope.npz")


def test_pyg_data(small_graph, tmp_path):
    torch = pytest.importorskip("torch")
    tg = pytest.importorskip("torch_geometric")
    src, dst = small_graph.edges()
    data = tg.data.Data(
        x=torch.from_numpy(small_graph.features),
        y=torch.from_numpy(small_graph.labels),
        edge_index=torch.from_numpy(np.stack([src, dst])),
        **{f"{s}_mask": torch.from_numpy(small_graph.mask(s)) for s in ("train", "val", "test")},
    )
    assert same(from_pyg(data), small_graph)
    torch.save(data, tmp_path / "g.pt")
    assert same(load_graph(tmp_path / "g.pt"), small_graph)
