"""A dataset is input like any other: a small file must not take the machine, and no value in it may set the
memory or break float32 training. Each attack of issue 52 (items 3 and 6) as a test: gzip bombs in an OGB
folder, counts no file can hold, a label of 2^62, a class count of NaN or 1e10, features of 3e38."""

from __future__ import annotations

import gzip
import io
import resource
import shutil
import tracemalloc
import zipfile

import numpy as np
import pytest

from dorylus_py.cli import main
from dorylus_py.data.graph import MAX_CLASSES
from dorylus_py.errors import DataError
from tests.data.test_ogb import write_random_ogb
from tests.test_memory import probe

BOMB_LINE_MIB = 256  # the bomb: one line of 256 MiB of "1," in about 260 KB of gzip
# What the refusal may add to the peak of the same command on a valid folder: the 1 MiB line cap, a 4 MiB
# block and its parse, gzip's buffers. Measured 2026-12-05: +0 to +10 MB; before the defence, +3.5 GB in 28 s.
BOMB_EXTRA_MB = 40
BOMB_CPU_SECONDS = 10  # the child's CPU time: measured 1.0-1.4 s; 28 s before (CPU, as load stretches wall time)


def gzip_bomb(path, mib: int) -> None:
    """One line of ``mib`` MiB of ``1,`` as concatenated gzip members (a reader must read them all): 1 KB
    a member, so the bomb is made in milliseconds, not by compressing 256 MiB."""
    member = gzip.compress(b"1," * (1 << 19), compresslevel=9)
    path.write_bytes(member * mib + gzip.compress(b"1\n"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A valid OGB folder, and copies whose node-feat.csv.gz or edge.csv.gz is the bomb."""
    root = tmp_path_factory.mktemp("ogb")
    write_random_ogb(root / "valid", 200, 600)
    for name in ("node-feat", "edge"):
        shutil.copytree(root / "valid", root / name)
        gzip_bomb(root / name / "raw" / f"{name}.csv.gz", BOMB_LINE_MIB)
        assert (root / name / "raw" / f"{name}.csv.gz").stat().st_size < 300_000
    return root


@pytest.fixture(scope="module")
def baselines(folders):
    """Each command's peak on the valid folder."""
    return {cmd: probe(folders, 0, *argv)["self_mb"]
            for cmd, argv in (("check", ["check", "valid"]), ("prepare", ["prepare", "valid", "-k", 2, "--out", "p"]))}


@pytest.mark.parametrize("name", ["node-feat", "edge"])
@pytest.mark.parametrize("command", ["check", "prepare"])
def test_a_gzip_bomb_is_one_line_in_seconds_within_a_bounded_peak(folders, baselines, name, command):
    argv = ["check", name] if command == "check" else ["prepare", name, "-k", 2, "--out", f"out-{name}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = probe(folders, 0, *argv, code=2, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert run["self_mb"] < baselines[command] + BOMB_EXTRA_MB, (run["self_mb"], baselines)
    assert seconds < BOMB_CPU_SECONDS, seconds
    err = run["stderr"].strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert f"{name}.csv.gz:1: a line longer than 1,048,576 bytes" in err, err
    assert not (folders / f"out-{name}").exists()


def rewrite(path, text: str) -> None:
    with gzip.open(path, "wt") as f:
        f.write(text)


def edit_line(path, line: int, text: str) -> None:
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    lines[line - 1] = text
    rewrite(path, "\n".join(lines) + "\n")


@pytest.fixture()
def ogb(tmp_path):
    return write_random_ogb(tmp_path / "ogbn_x", 60, 200)


COUNTS = [
    ("num-edge-list", "4000000000000000000", "num-edge-list.csv.gz: 4,000,000,000,000,000,000 edges, out of range"),
    ("num-edge-list", str(2**35), f"num-edge-list.csv.gz: {2**35:,} edges, more than edge.csv.gz"),
    ("num-edge-list", "201", "edge.csv.gz: 200 edges but num-edge-list.csv.gz says 201"),
    ("num-edge-list", "199", "edge.csv.gz: more than 199 rows (num-edge-list.csv.gz says 199 edges)"),
    ("num-edge-list", "-3", "num-edge-list.csv.gz: -3 edges, out of range"),
    ("num-node-list", str(2**40), f"num-node-list.csv.gz: {2**40:,} vertices, out of range [0, 2,147,483,647]"),
    ("num-node-list", str(2**30), f"num-node-list.csv.gz: {2**30:,} vertices, more than node-feat.csv.gz"),
    ("num-node-list", "60\n60", "num-node-list.csv.gz: more than 1 rows (one graph"),
    ("num-node-list", "61", "but num-node-list.csv.gz says 61 vertices"),  # labels or features, whichever first
]


@pytest.mark.parametrize("file, text, message", COUNTS)
@pytest.mark.parametrize("command", ["check", "prepare"])
def test_a_count_no_file_holds_is_one_line(ogb, tmp_path, capsys, file, text, message, command):
    """4e18 edges was `OSError: Too many open files` (a bucket file per 8 M keys); counts are checked against
    what the files can hold (deflate makes at most 1,032 bytes of one) before anything is sized by them,
    and against what they do hold as they are read."""
    rewrite(ogb / "raw" / f"{file}.csv.gz", text + "\n")
    argv = ["check", ogb] if command == "check" else ["prepare", ogb, "-k", 2, "--out", tmp_path / "p"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 1 and message in err, err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("label, message", [
    ("1000000000000000000", "label 1e+18 of vertex 4 is beyond the 65,536 classes"),
    (str(2**33), f"label {2**33} of vertex 4 is beyond the 65,536 classes"),
    ("1e300", "label 1e+300 of vertex 4 is beyond"),
    ("inf", "label inf of vertex 4 is beyond"),
    (str(MAX_CLASSES), f"label {MAX_CLASSES} of vertex 4 is beyond"),
])
def test_an_ogb_label_beyond_the_class_cap_is_one_line_naming_it(ogb, capsys, label, message):
    edit_line(ogb / "raw" / "node-label.csv.gz", 5, label)
    assert main(["check", ogb]) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 1 and "node-label.csv.gz:5: " + message in err, err


def cora_like(tmp_path, **arrays):
    """A small npz dataset with ``arrays`` replaced."""
    rng = np.random.default_rng(0)
    base = {"src": rng.integers(0, 50, 200), "dst": rng.integers(0, 50, 200),
            "features": rng.random((50, 4), np.float32), "labels": np.arange(50) % 3}
    path = tmp_path / "g.npz"
    np.savez(path, **(base | arrays))
    return path


LABELS = np.arange(50) % 3
NPZ = [
    ({"labels": np.where(LABELS == 2, 2**62, LABELS)}, "g.npz: label 4611686018427387904 of vertex 2 is beyond the "
                                                       "65,536 classes"),
    ({"labels": np.where(LABELS == 2, 2**31, LABELS)}, "g.npz: label 2147483648 of vertex 2 is beyond"),
    ({"num_classes": np.float64("nan")}, "g.npz: num_classes must be an integer, got nan"),
    ({"num_classes": np.array("seven")}, "g.npz: num_classes must be one integer, got an array of dtype <U5"),
    ({"num_classes": np.array([3, 4])}, "g.npz: num_classes must be one integer, got an array of shape (2,)"),
    ({"num_classes": np.int64(10**10)}, "g.npz: 10,000,000,000 classes, more than the 65,536 a model is trained"),
    ({"num_classes": np.float64(3.5)}, "g.npz: num_classes must be an integer, got 3.5"),
]


@pytest.mark.parametrize("arrays, message", NPZ)
@pytest.mark.parametrize("command", ["check", "prepare"])
def test_an_npz_class_count_or_label_no_model_could_have_is_one_line(tmp_path, capsys, arrays, message, command):
    """Each was a traceback, a MemoryError from np.arange(2^62 + 1), or (1e10) a 640 GB allocation at train time."""
    path = cora_like(tmp_path, **arrays)
    argv = ["check", path] if command == "check" else ["prepare", path, "-k", 2, "--out", tmp_path / "p"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 1 and message in err, err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("value", [3e38, -2e9, np.inf, np.nan])
@pytest.mark.parametrize("backend", ["reference", "cpu", "local"])
def test_features_float32_training_cannot_survive_are_refused_alike_on_every_backend(tmp_path, capsys, value,
                                                                                    backend):
    """3e38 is finite: it ended `completed` with a NaN loss on reference and in 20 relaunches on local."""
    features = np.random.default_rng(0).random((50, 4), np.float32)
    features[7, 2] = value
    path = cora_like(tmp_path, features=features)
    assert main(["train", "--data", path, "--backend", backend, "--epochs", 1, "--quiet",
                 "--out", tmp_path / "run"]) == 2
    err = capsys.readouterr().err
    want = "NaN or infinity (first at vertex 7)" if not np.isfinite(value) else \
        f"feature {value:.3g} of vertex 7 is beyond ±1,000,000,000"
    assert err.count("error: ") == 1 and want in err, err
    assert not (tmp_path / "run").exists()


def test_a_feature_within_the_bound_trains(tmp_path):
    features = np.random.default_rng(0).random((50, 4), np.float32)
    features[7, 2] = -1e9
    assert main(["check", cora_like(tmp_path, features=features)]) == 0


def test_an_ogb_feature_beyond_the_bound_is_refused_as_it_streams(ogb, tmp_path, capsys):
    edit_line(ogb / "raw" / "node-feat.csv.gz", 30, ",".join(["3e38"] + ["0.5"] * 15))
    assert main(["prepare", ogb, "-k", 2, "--out", tmp_path / "p"]) == 2
    assert "node-feat.csv.gz: feature 3e+38 of vertex 29 is beyond" in capsys.readouterr().err


def test_a_store_manifest_class_count_is_checked_before_training(tmp_path, capsys):
    """A prepared store's manifest sizes the model: 1e10 classes made the weight server ask for 640 GB."""
    import json

    assert main(["prepare", cora_like(tmp_path), "-k", 2, "--out", tmp_path / "p"]) == 0
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    (tmp_path / "p" / "manifest.json").write_text(json.dumps(manifest | {"classes": 10**10}))
    capsys.readouterr()
    assert main(["train", "--data", tmp_path / "p", "--backend", "cpu", "--epochs", 1, "--quiet",
                 "--out", tmp_path / "run"]) == 2
    assert "manifest.json: classes 10000000000 is not a class count in [2, 65,536]" in capsys.readouterr().err


def npz_with_labels(path, header: dict, data_mib: int) -> None:
    """A 50-vertex npz whose labels.npy has ``header`` and ``data_mib`` MiB of zeros, deflated, written in
    pieces (so the test itself never holds them)."""
    rng = np.random.default_rng(0)
    np.savez(path, src=rng.integers(0, 50, 200), dst=rng.integers(0, 50, 200), features=rng.random((50, 4), np.float32))
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<i8", "fortran_order": False} | header)
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as z, z.open("labels.npy", "w", force_zip64=True) as f:
        f.write(buf.getvalue())
        for _ in range(data_mib):
            f.write(bytes(1 << 20))


@pytest.mark.parametrize("command", ["check", "prepare"])
def test_an_npz_member_is_sized_by_its_header_only_as_far_as_the_zip_holds_it(tmp_path, capsys, command):
    """A header is checked against the member's size in the zip before np.load sizes an array by it; prepare
    reads a per-vertex array only if its header says N entries."""
    npz_with_labels(tmp_path / "lie.npz", {"shape": (2**40,)}, 0)  # 8 TiB claimed, nothing there
    argv = [command, tmp_path / "lie.npz"] + (["-k", 2, "--out", tmp_path / "p"] if command == "prepare" else [])
    assert main(argv) == 2  # was np.load's MemoryError traceback
    assert "lie.npz:labels.npy: truncated or corrupt: its header claims shape (1099511627776,)" in \
        capsys.readouterr().err


def test_prepare_reads_no_per_vertex_array_longer_than_the_graph(tmp_path, capsys):
    npz_with_labels(tmp_path / "long.npz", {"shape": (2**24,)}, 128)  # 128 MiB of labels in a 130 KB file
    assert (tmp_path / "long.npz").stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        code = main(["prepare", tmp_path / "long.npz", "-k", 2, "--out", tmp_path / "p"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2 and "long.npz: 16777216 labels but the graph has 50 vertices" in capsys.readouterr().err
    assert peak < 16 << 20, peak  # the labels were never read


def test_an_edge_list_is_read_in_bounded_blocks_as_loadtxt_read_it(tmp_path, monkeypatch):
    """The text edge list (np.loadtxt before: the whole file, a line of any length) goes through the same
    bounded blocks: the same edges, comments and blank lines included, across block boundaries."""
    import dorylus_py.data.textblocks as textblocks
    from dorylus_py.data import Sources, load_graph

    rng = np.random.default_rng(3)
    edges = rng.integers(0, 500, (3000, 2))
    lines = [f"{a}\t{b}" if i % 7 else f" {a}  {b} # note" for i, (a, b) in enumerate(edges)]
    lines[100:100] = ["# a comment", "", "   "]
    (tmp_path / "g.txt").write_text("\n".join(lines) + "\n")
    np.save(tmp_path / "x.npy", rng.random((500, 3), np.float32))
    np.save(tmp_path / "y.npy", np.arange(500) % 4)
    sources = Sources(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    monkeypatch.setattr(textblocks, "BLOCK_BYTES", 257)  # many blocks, lines cut anywhere
    graph = load_graph(tmp_path / "g.txt", sources)
    want = np.loadtxt(tmp_path / "g.txt", dtype=np.int64, comments="#")
    assert graph.num_edges == len(np.unique(want[want[:, 0] != want[:, 1]], axis=0))
    src, dst = graph.edges()
    assert set(zip(src.tolist(), dst.tolist())) == {(a, b) for a, b in want.tolist() if a != b}
    monkeypatch.undo()
    for text, message in [("0 1\n" + "1" * (1 << 21) + " 2\n", "g.txt:2: a line longer than 1,048,576 bytes"),
                          ("0 1\n1-2 3\n", "g.txt:2: not an edge list of 'src dst' integer pairs"),
                          ("0 1\n1 2 3\n", "g.txt:2: 3 values; an edge list has 2 per line")]:
        (tmp_path / "g.txt").write_text(text)
        with pytest.raises(DataError, match=message):
            load_graph(tmp_path / "g.txt", sources)
