"""OGB's binary layout (`raw/data.npz` and `raw/node-label.npz`, as ogbn-papers100M ships), written here as the
`ogb` package's DatasetSaver and loader lay it out: `check` reads the same graph as from the csv layout,
`prepare` streams it (the two rows of `edge_index` side by side, never whole), and what the arrays or their
counts get wrong is one line and exit 2. And the folder names: a root of dataset folders (the `ogb` package's
`dataset/`, holding `ogbn_arxiv/`) or a dataset's `raw/` gets a line naming the folder to give."""

import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from dorylus_py.cli import main
from dorylus_py.data import SynthConfig, generate, load_graph
from dorylus_py.data.npystream import NpyMember, npz_members
from dorylus_py.partition import PartitionStore
from tests.data.test_ogb import write_ogb, write_split


def write_ogb_binary(graph, root: Path, split: str = "time", **replace) -> Path:
    """``graph`` (undirected) as an OGB folder in the binary layout, each undirected edge once; ``replace``:
    arrays of data.npz to write instead (None: leave it out), ``node_label`` that of node-label.npz."""
    src, dst = graph.edges()
    once = src < dst
    arrays = {"edge_index": np.stack([src[once], dst[once]]).astype(np.int64), "node_feat": graph.features,
              "node_year": np.full((graph.num_nodes, 1), 2020, np.int64),  # papers100M's: read past
              "num_nodes_list": np.array([graph.num_nodes], np.int64),
              "num_edges_list": np.array([once.sum()], np.int64)}
    label = np.where(graph.labels < 0, np.nan, graph.labels).astype(np.float64)[:, None]  # (N, 1), as OGB's
    label = replace.pop("node_label", label)
    arrays = {k: v for k, v in (arrays | replace).items() if v is not None}
    (root / "raw").mkdir(parents=True)
    np.savez_compressed(root / "raw" / "data.npz", **arrays)
    np.savez_compressed(root / "raw" / "node-label.npz", node_label=label)
    write_split(root / "split" / split, graph.train_mask, graph.val_mask, graph.test_mask)
    return root


@pytest.fixture(scope="module")
def graph():
    return generate(SynthConfig(nodes=400, edges=3_000, features=6, classes=3, seed=2))


def test_check_reads_the_same_graph_as_from_the_csv_layout(graph, tmp_path, capsys):
    binary, csv = write_ogb_binary(graph, tmp_path / "ogbn_bin"), write_ogb(graph, tmp_path / "ogbn_csv")
    for read in (load_graph(binary), load_graph(csv)):
        assert np.array_equal(read.indptr, graph.indptr) and np.array_equal(read.indices, graph.indices)
        np.testing.assert_array_equal(read.features, graph.features)
        assert np.array_equal(read.labels, graph.labels) and read.num_classes == graph.num_classes
        for split in ("train", "val", "test"):
            assert np.array_equal(read.mask(split), graph.mask(split))
    assert main(["check", str(binary), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == graph.summary()


def test_prepare_streams_the_two_rows_of_edge_index_side_by_side(graph, tmp_path, monkeypatch):
    """Neither ``load_graph`` nor a whole read of ``edge_index`` or ``node_feat``: blocks of each row."""
    import dorylus_py.partition.source as source

    folder = write_ogb_binary(graph, tmp_path / "ogbn_bin")
    whole = NpyMember.read

    def small_only(member):
        assert len(member) <= graph.num_nodes and member.shape[1:] in ((), (1,)), f"read whole: {member.where}"
        return whole(member)

    monkeypatch.setattr(source, "load_graph", lambda *a: pytest.fail("prepare loaded the OGB folder whole"))
    monkeypatch.setattr(NpyMember, "read", small_only)
    assert main(["prepare", str(folder), "--partitions", "2", "--out", str(tmp_path / "store")]) == 0
    monkeypatch.undo()
    assembled = PartitionStore.open(tmp_path / "store").assemble()
    assert assembled.summary() == graph.summary()
    np.testing.assert_array_equal(assembled.features, graph.features)


@pytest.mark.parametrize("compressed", [True, False])
def test_a_row_of_a_member_is_read_in_blocks_of_its_own(tmp_path, compressed):
    a = np.arange(2 * 1001, dtype=">i8").reshape(2, 1001)  # big-endian, as any writer may store it
    (np.savez_compressed if compressed else np.savez)(tmp_path / "a.npz", edge_index=a)
    member = npz_members(tmp_path / "a.npz")["edge_index"]
    for row in (0, 1):
        for size in (1, 7, 1001, 5000):
            blocks = list(member.row_blocks(row, size))
            assert max(len(b) for b in blocks) <= size
            np.testing.assert_array_equal(np.concatenate(blocks), a[row])


def _spoil_bytes(folder: Path) -> None:
    """Flip bytes inside the deflated edge_index of data.npz (its zip directory intact)."""
    path = folder / "raw" / "data.npz"
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("edge_index.npy")
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size // 2
    data[start:start + 64] = bytes(64)
    path.write_bytes(bytes(data))


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _lying_header(folder: Path) -> None:
    """A node_feat whose header claims 10^6 rows, its data those of 400 (the zip's sizes say so)."""
    arrays = dict(np.load(folder / "raw" / "data.npz"))
    with zipfile.ZipFile(folder / "raw" / "data.npz", "w") as z:
        for name, a in arrays.items():
            with z.open(f"{name}.npy", "w") as f:
                header = {"descr": np.lib.format.dtype_to_descr(a.dtype), "fortran_order": False,
                          "shape": (10**6, *a.shape[1:]) if name == "node_feat" else a.shape}
                np.lib.format.write_array_header_1_0(f, header)
                f.write(a.tobytes())


N = 400
MALFORMED = {  # name: (data.npz arrays replaced, or a spoiler of the folder; what the one line says)
    "no edge_index": ({"edge_index": None}, "data.npz: no edge_index (OGB's data.npz holds"),
    "more vertices than features": ({"num_nodes_list": np.array([N + 1])},
                                    "node_feat is float32 of shape (400, 6); num_nodes_list says 401 vertices"),
    "several graphs": ({"num_nodes_list": np.array([200, 200])}, "several graphs"),
    "a count of no graph": ({"num_nodes_list": np.array([2**40])}, "1,099,511,627,776 vertices, out of range"),
    "edge count": ({"num_edges_list": np.array([7])}, "num_edges_list says 7 edges, but edge_index holds"),
    "edge_index transposed": ({"edge_index": np.zeros((5, 2), np.int64), "num_edges_list": np.array([2])},
                              "edge_index is int64 of shape (5, 2), not integers of shape (2, edges)"),
    "edge id out of range": ({"edge_index": np.array([[0, 1, 2], [1, N, 3]]), "num_edges_list": np.array([3])},
                             "edge_index: edge 1 has vertex id 400, out of range [0, 400)"),
    "features not numbers": ({"node_feat": np.zeros((N, 6), bool)}, "node_feat is bool of shape (400, 6)"),
    "NaN feature": ({"node_feat": np.where(np.arange(N * 6).reshape(N, 6) == 50, np.nan, 1.0)},
                    "node_feat: features contain NaN or infinity (first at vertex 8)"),
    "labels per vertex": ({"node_label": np.zeros((N, 2))}, "node_label has 2 labels per vertex; only single-label"),
    "labels short": ({"node_label": np.zeros((N - 1, 1))}, "node_label is float64 of shape (399, 1)"),
    "fractional label": ({"node_label": np.full((N, 1), 1.5)}, "node-label.npz:node_label[0]: label 1.5 is not"),
    "no labels file": (lambda o: (o / "raw" / "node-label.npz").unlink(), "node-label.npz: missing"),
    "data.npz a FIFO": (lambda o: _fifo(o / "raw" / "data.npz"), "data.npz: not a regular file"),
    "corrupt deflate": (_spoil_bytes, "edge_index.npy: corrupt compressed data"),
    "a header claiming more rows": (_lying_header, "node_feat.npy: truncated or corrupt: its header claims shape"),
    "a pickled split": (lambda o: [(p.unlink(), p.with_name("split_dict.pt").write_bytes(b"x"))
                                   for p in (o / "split" / "time").glob("train.csv.gz")],
                        "split_dict.pt, a pickle, is not read"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("command", ["check", "prepare"])
def test_a_malformed_binary_folder_gets_one_line_and_exit_2(graph, tmp_path, capsys, case, command):
    spoil, message = MALFORMED[case]
    folder = write_ogb_binary(graph, tmp_path / "ogbn_bin", **(spoil if isinstance(spoil, dict) else {}))
    if callable(spoil):
        spoil(folder)
    out = tmp_path / "store"
    argv = ["check", str(folder)] if command == "check" else ["prepare", str(folder), "-k", "2", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert not out.exists()


@pytest.mark.parametrize("command", ["check", "prepare", "train"])
def test_the_root_of_dataset_folders_names_them(graph, tmp_path, capsys, command):
    """The `ogb` package keeps each dataset in ``ROOT/<name with _ for ->``: given ROOT, say which to give."""
    root = tmp_path / "dataset"
    write_ogb(graph, root / "ogbn_arxiv")
    write_ogb_binary(graph, root / "ogbn_papers100M")
    (root / "ogbn_arxiv.zip").write_bytes(b"")  # what the download leaves beside them
    argv = {"check": ["check", str(root)], "prepare": ["prepare", str(root), "-k", "2", "--out", str(tmp_path / "p")],
            "train": ["train", "--data", str(root), "--epochs", "1", "--out", str(tmp_path / "r")]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {root}: a folder of OGB datasets, not one; give one of them: {root / 'ogbn_arxiv'}, "
                   f"{root / 'ogbn_papers100M'}\n")
    assert main(["check", str(root / "ogbn_arxiv" / "raw")]) == 2
    err = capsys.readouterr().err
    assert f"the raw/ folder of an OGB dataset; give the dataset folder, {root / 'ogbn_arxiv'}\n" in err
    (root / "ogbn_arxiv" / "raw" / "edge.csv.gz").unlink()  # no dataset under it any more: the plain line
    (root / "ogbn_papers100M" / "raw" / "data.npz").unlink()
    assert main(["check", str(root)]) == 2
    assert "folder holds neither a manifest.json" in capsys.readouterr().err

