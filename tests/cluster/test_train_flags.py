"""`dorylus train` flags that must do what they say, on real distributed jobs: --resume RUN_DIR after
Ctrl-C, --no-data-copy, the data flags in config.json, server counts from a prepared store or a cluster
file."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dorylus_py.cli import main
from tests.cluster.test_cluster_file import free_ports
from tests.training.test_run_records import read


def newest_checkpoint(run_dir) -> int:
    latest = run_dir / "checkpoints" / "latest.json"
    return json.loads(latest.read_text())["epoch"] if latest.exists() else 0


@pytest.mark.long
def test_resume_run_dir_after_ctrl_c_continues_exactly(graph_npz, tmp_path, capsys):
    """Ctrl-C a run (its record says interrupted and is reportable); `--resume RUN_DIR --epochs N` goes on
    from its newest checkpoint in the same record, as if it had never stopped: same losses as a straight run."""
    common = ["--backend", "cpu", "--data", str(graph_npz), "-k", "2", "--chunks", "2", "--checkpoint-every", "2", "--quiet"]
    b = tmp_path / "b"
    proc = subprocess.Popen([sys.executable, "-m", "dorylus_py", "train", *common, "--epochs", "100000", "--out", str(b)],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while newest_checkpoint(b) < 2 or len(read(b, "metrics.jsonl")) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, "the run never reached its first checkpoint"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.strip().splitlines()[-1].startswith("error: interrupted; every process stopped")
    assert read(b, "summary.json")["status"] == "interrupted"
    assert main(["report", str(b)]) == 0 and "interrupted" in capsys.readouterr().out

    done = newest_checkpoint(b)
    assert main(["train", "--resume", str(b), "--epochs", str(done + 2), "--quiet"]) == 0
    assert main(["train", *common, "--epochs", str(done + 2), "--out", str(tmp_path / "a")]) == 0
    a_rows, b_rows = read(tmp_path / "a", "metrics.jsonl"), read(b, "metrics.jsonl")
    assert [r["epoch"] for r in b_rows] == list(range(1, done + 3))  # epochs after the checkpoint were redone
    np.testing.assert_allclose([r["loss"] for r in b_rows], [r["loss"] for r in a_rows], rtol=1e-5)
    walls = [r["wall_s"] for r in b_rows]
    assert walls == sorted(walls)  # the resumed part goes on with the record's clock
    summary = read(b, "summary.json")
    assert summary["status"] == "completed" and summary["epochs"] == done + 2 and summary["wall_s"] == walls[-1]
    assert read(b, "config.json")["resumed_after"] == [done]
    wa, wb = np.load(tmp_path / "a" / "weights.npz"), np.load(b / "weights.npz")
    for k in wa.files:
        np.testing.assert_allclose(wa[k], wb[k], rtol=1e-5, atol=1e-7)

    capsys.readouterr()
    assert main(["train", "--resume", str(b), "--epochs", str(done + 2)]) == 2
    assert "leaves nothing to do" in capsys.readouterr().err
    assert main(["train", "--resume", str(b), "--epochs", str(done + 4), "--hidden", "8"]) == 2
    assert capsys.readouterr().err.startswith("error: --hidden: --resume")
    assert read(b, "summary.json")["epochs"] == done + 2  # refused before anything was written


@pytest.mark.long
def test_no_data_copy_and_the_data_flags_in_config(graph_npz, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--backend", "cpu", "--data", str(graph_npz), "-k", "2", "--epochs", "2", "--partitioner", "hash",
                 "--train-frac", "0.2", "--split-seed", "3", "--no-data-copy", "--quiet", "--out", str(run)]) == 0
    config = read(run, "config.json")
    assert config["partitioner"] == "hash" and config["no_data_copy"] and config["store"] is None
    assert config["sources"] == {"features": None, "labels": None, "masks": None, "train_frac": 0.2, "val_frac": 0.1,
                                 "split_seed": 3}
    assert not (run / "partitions").exists() and (run / "checkpoints").exists()
    # the copy can be made again: a resumed run re-partitions the same way, and drops it again
    assert main(["train", "--resume", str(run), "--epochs", "3", "--quiet"]) == 0
    assert [r["epoch"] for r in read(run, "metrics.jsonl")] == [1, 2, 3] and not (run / "partitions").exists()

    kept = tmp_path / "kept"
    assert main(["train", "--backend", "cpu", "--data", str(graph_npz), "-k", "2", "--epochs", "1", "--quiet",
                 "--out", str(kept)]) == 0
    assert read(kept, "config.json")["store"] == str(kept / "partitions")
    assert json.loads((kept / "partitions" / "manifest.json").read_text())["partitioner"] == "metis"


def test_graph_servers_default_to_the_prepared_stores_partitions(graph_npz, tmp_path):
    assert main(["prepare", str(graph_npz), "-k", "3", "--out", str(tmp_path / "p3")]) == 0
    assert main(["train", "--backend", "cpu", "--data", str(tmp_path / "p3"), "--epochs", "1", "--quiet",
                 "--out", str(tmp_path / "run")]) == 0
    config = read(tmp_path / "run", "config.json")
    assert config["graph_servers"] == 3 and config["store"] == str(tmp_path / "p3")
    assert not (tmp_path / "run" / "partitions").exists()  # no copy: the store itself was read


def test_server_counts_come_from_the_cluster_file(graph_npz, tmp_path, capsys, monkeypatch):
    """A one-graph-server cluster file with a one-partition store, and no count flags: the job runs on
    what the file lists. A count flag that disagrees with the file, or a store of another size, is an
    error before anything is written."""
    assert main(["prepare", str(graph_npz), "-k", "1", "--out", str(tmp_path / "p1")]) == 0
    assert main(["prepare", str(graph_npz), "-k", "2", "--out", str(tmp_path / "p2")]) == 0
    d, g0, w0 = free_ports(3)
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"driver": f"tcp://127.0.0.1:{d}", "graph_servers": [f"tcp://127.0.0.1:{g0}"],
                                   "weight_servers": [f"tcp://127.0.0.1:{w0}"]}))
    train = ["train", "--backend", "cpu", "--cluster", str(cluster), "--epochs", "2", "--quiet"]
    for flags, message in [(["-k", "2", "--data", str(tmp_path / "p1")],
                            f"--graph-servers 2 disagrees with {cluster}, which lists 1 graph servers"),
                           (["--weight-servers", "2", "--data", str(tmp_path / "p1")],
                            f"--weight-servers 2 disagrees with {cluster}, which lists 1 weight servers"),
                           (["--data", str(tmp_path / "p2")], f"{tmp_path / 'p2'} holds 2 partitions but {cluster} lists 1")]:
        assert main([*train, *flags, "--out", str(tmp_path / "bad")]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()

    monkeypatch.setenv("DORYLUS_KEY", "ab" * 32)
    servers = [subprocess.Popen([sys.executable, "-m", "dorylus_py", role, "--cluster", str(cluster), "--rank", "0",
                                 "--bind", "127.0.0.1", "--jobs", "1"], stderr=subprocess.PIPE, text=True)
               for role in ("graph-server", "weight-server")]
    try:
        assert main([*train, "--data", str(tmp_path / "p1"), "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err
        for p in servers:
            assert p.wait(timeout=30) == 0, p.stderr.read()
    finally:
        for p in servers:
            p.kill()
    config = read(tmp_path / "run", "config.json")
    assert (config["graph_servers"], config["weight_servers"], config["cluster"]) == (1, 1, str(cluster))
    assert len(read(tmp_path / "run", "metrics.jsonl")) == 2 and not (tmp_path / "run" / "partitions").exists()
