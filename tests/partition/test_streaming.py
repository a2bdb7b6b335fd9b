"""The streaming prepare: an .npz read in blocks gives the same store as the graph in memory."""

import zipfile

import numpy as np
import pytest

from dorylus_py import cli
from dorylus_py.data import extsort, write_npz
from dorylus_py.data.formats import read_npz
from dorylus_py.data.synth import SynthConfig, write_synth
from dorylus_py.errors import DataError
from dorylus_py.partition import PartitionStore, build, csr, prepare
from dorylus_py.partition.source import open_source
from tests.data.test_formats import same


def _files(manifest) -> list:
    return [sorted((name, meta["sha256"]) for name, meta in part["files"].items()) for part in manifest["parts"]]


@pytest.fixture(scope="module")
def synth_npz(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "g.npz"
    write_synth(SynthConfig(nodes=3_000, edges=40_000, features=8, classes=5, seed=4), path)
    return path


def test_streamed_npz_gives_the_store_of_the_graph_in_memory(synth_npz, tmp_path, monkeypatch):
    in_memory = prepare(read_npz(synth_npz), tmp_path / "a", 3, "fennel")
    streamed = prepare(open_source(synth_npz), tmp_path / "b", 3, "fennel")
    assert _files(streamed) == _files(in_memory)
    # tiny blocks and buckets: every boundary case of the streaming steps, the same bytes
    monkeypatch.setattr(extsort, "BUCKET_KEYS", 997)
    monkeypatch.setattr(csr, "EDGE_BLOCK", 1_001)
    monkeypatch.setattr(build, "FEATURE_BLOCK", 101)
    small = prepare(open_source(synth_npz), tmp_path / "c", 3, "fennel")
    assert _files(small) == _files(in_memory)
    assert same(PartitionStore.open(tmp_path / "c").assemble(), read_npz(synth_npz))


def test_duplicates_and_self_loops_are_dropped_as_graph_does(small_graph, tmp_path, caplog):
    src, dst = small_graph.edges()
    src = np.concatenate([src, src[:50], np.arange(20)])
    dst = np.concatenate([dst, dst[:50], np.arange(20)])
    path = tmp_path / "dups.npz"
    np.savez(path, src=src, dst=dst, features=small_graph.features, labels=small_graph.labels,
             train_mask=small_graph.train_mask, val_mask=small_graph.val_mask, test_mask=small_graph.test_mask)
    m = prepare(open_source(path), tmp_path / "p", 2, "hash")
    assert m["edges"] == small_graph.num_edges
    assert "dropped 20 self loops and 50 duplicate edges" in caplog.text
    assert same(PartitionStore.open(tmp_path / "p").assemble(), small_graph)


@pytest.mark.parametrize("change, message", [
    (lambda a: a["src"].__setitem__(7, 10**6), "source vertex id 1000000 is out of range"),
    (lambda a: a["features"].__setitem__((33, 2), np.nan), "features contain NaN or infinity \\(first at vertex 33\\)"),
    (lambda a: a.pop("labels"), "missing array\\(s\\) labels"),
    (lambda a: a.__setitem__("dst", a["dst"][:-1]), "source ids but"),
])
def test_bad_npz_is_named_and_leaves_nothing(small_graph, tmp_path, change, message):
    src, dst = small_graph.edges()
    arrays = {"src": src.copy(), "dst": dst, "features": small_graph.features.copy(), "labels": small_graph.labels}
    change(arrays)
    np.savez(tmp_path / "bad.npz", **arrays)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DataError, match=message):
        prepare(open_source(tmp_path / "bad.npz"), out / "p", 2, "fennel")
    assert list(out.iterdir()) == []  # no store, no scratch files


def test_compressed_npz_streams_too(small_graph, tmp_path):
    plain = tmp_path / "g.npz"
    write_npz(small_graph, plain)
    packed = tmp_path / "packed.npz"
    with np.load(plain) as z:
        np.savez_compressed(packed, **{k: z[k] for k in z.files})
    with zipfile.ZipFile(packed) as z:
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist())
    a = prepare(open_source(plain), tmp_path / "a", 2, "hash")
    b = prepare(open_source(packed), tmp_path / "b", 2, "hash")
    assert _files(a) == _files(b)


def test_cli_prepare_reports_its_cut_beside_hash_and_why_auto_chose(synth_npz, tmp_path, capsys):
    assert cli.main(["prepare", str(synth_npz), "-k", "2", "--out", str(tmp_path / "p"), "--memory-budget", "0.0001",
                     "--feature-dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "partitioner auto: METIS would need about" in out and "(fennel)" in out and "hash would cut" in out
    assert PartitionStore.open(tmp_path / "p").manifest["feature_dtype"] == "bfloat16"
    assert cli.main(["prepare", str(synth_npz), "-k", "2", "--out", str(tmp_path / "q"), "--memory-budget", "-1"]) == 2
    assert "--memory-budget must be > 0" in capsys.readouterr().err
