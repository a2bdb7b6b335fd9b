"""The CLI end to end: real subcommands, and every bad input named in one line with exit code 2."""

import json
import subprocess
import sys

import numpy as np
import pytest

from dorylus_py.cli import main
from dorylus_py.data import write_bsnap, write_npz


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_synth_check_prepare_train(tmp_path, capsys):
    g = tmp_path / "g.npz"
    code, out, _ = run(capsys, "synth", "--out", g, "--nodes", 500, "--edges", 4000, "--features", 8, "--classes", 3)
    assert code == 0 and "500 vertices, 4,000 edges" in out
    code, out, _ = run(capsys, "check", g, "--json")
    assert code == 0 and json.loads(out)["edges"] == 4000
    code, out, _ = run(capsys, "prepare", g, "--partitions", 3, "--out", tmp_path / "p", "--partitioner", "hash")
    assert code == 0 and "edge cut" in out and "balance" in out
    code, out, _ = run(capsys, "train", "--data", tmp_path / "p", "--epochs", 3, "--out", tmp_path / "run", "--quiet")
    assert code == 0 and "run record in" in out
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 3
    assert json.loads((tmp_path / "run" / "config.json").read_text())["graph"]["nodes"] == 500


def test_help_explains_each_command(capsys):
    for cmd in ("synth", "check", "prepare", "train"):
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        assert e.value.code == 0
        assert len(capsys.readouterr().out.splitlines()) > 5


def bad_npz(tmp_path, small_graph, **override):
    src, dst = small_graph.edges()
    arrays = dict(src=src, dst=dst, features=small_graph.features, labels=small_graph.labels,
                  train_mask=small_graph.train_mask, val_mask=small_graph.val_mask, test_mask=small_graph.test_mask)
    arrays.update(override)
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    "override, message",
    [
        (lambda g: dict(src=np.r_[g.edges()[0][:-1], 10**6]), "source vertex id 1000000 is out of range"),
        (lambda g: dict(features=g.features[:-1]), "labels but the graph has"),
        (lambda g: dict(features=np.where(np.arange(g.num_nodes)[:, None] == 5, np.nan, g.features)), "NaN"),
        (lambda g: dict(labels=np.r_[g.labels[:-1], -7]), "label -7 of vertex"),
        (lambda g: dict(val_mask=g.train_mask), "train and val masks overlap"),
        (lambda g: dict(train_mask=np.zeros(g.num_nodes, bool)), "the train split is empty"),
    ],
)
@pytest.mark.parametrize("command", ["check", "prepare", "train"])
def test_bad_dataset_one_line_exit_2_nothing_written(tmp_path, capsys, small_graph, override, message, command):
    path = bad_npz(tmp_path, small_graph, **override(small_graph))
    extra = {"check": [], "prepare": ["-k", 2, "--out", tmp_path / "p"], "train": ["--out", tmp_path / "run"]}[command]
    argv = [command, path] if command != "train" else [command, "--data", path]
    code, out, err = run(capsys, *argv, *extra)
    assert code == 2
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npz"]


def test_truncated_files_exit_2(tmp_path, capsys, small_graph):
    write_bsnap(small_graph, tmp_path / "ds")
    data = (tmp_path / "ds" / "graph.bsnap").read_bytes()
    (tmp_path / "ds" / "graph.bsnap").write_bytes(data[:-3])
    code, _, err = run(capsys, "check", tmp_path / "ds")
    assert code == 2 and "graph.bsnap" in err and "truncated" in err
    write_npz(small_graph, tmp_path / "g.npz")
    data = (tmp_path / "g.npz").read_bytes()
    (tmp_path / "g.npz").write_bytes(data[:1000])
    code, _, err = run(capsys, "prepare", tmp_path / "g.npz", "-k", 2, "--out", tmp_path / "p")
    assert code == 2 and "g.npz: not a readable .npz" in err
    assert not (tmp_path / "p").exists()


def test_bad_flags_exit_2(tmp_path, capsys, small_graph):
    write_npz(small_graph, tmp_path / "g.npz")
    for argv, message in [
        (["prepare", tmp_path / "g.npz", "-k", 0, "--out", tmp_path / "p"], "--partitions must be >= 1"),
        (["train", "--data", tmp_path / "g.npz", "--layers", 0], "--layers must be >= 1"),
        (["train", "--data", tmp_path / "g.npz", "--feature-norm", "row", "--out", tmp_path / "r"], "needs non-negative features"),
        (["synth", "--out", tmp_path / "s.npz", "--nodes", 10, "--edges", 10**4], "impossible"),
        (["check", tmp_path / "missing.npz"], "no such file"),
    ]:
        code, _, err = run(capsys, *argv)
        assert code == 2 and err.startswith("error: ") and message in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.npz"]


def test_console_script_no_traceback(tmp_path):
    """The installed entry point itself: exit code 2 and one line on stderr."""
    (tmp_path / "e.txt").write_text("0 1\n")
    proc = subprocess.run([sys.executable, "-m", "dorylus_py", "check", str(tmp_path / "e.txt")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'e.txt'}: an edge list needs --features FILE.npy and --labels FILE.npy"]
