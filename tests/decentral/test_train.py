"""Decentralised training end to end through the CLI: the run record, exact-ratio accuracies, errors,
torchrun, and accuracy against all-reduce on Cora."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from dorylus_py.cli import main
from dorylus_py.data import write_npz


def _train(tmp_path, data, name, *extra) -> tuple[dict, list[dict], list[dict]]:
    out = tmp_path / name
    assert main(["train", "--data", str(data), "--out", str(out), "--quiet", "--workers", "4", *extra]) == 0
    summary = json.loads((out / "summary.json").read_text())
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    tasks = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    return summary, metrics, tasks


@pytest.fixture()
def small_npz(small_graph, tmp_path):
    path = tmp_path / "g.npz"
    write_npz(small_graph, path)
    return path


def _exact(value: float, count: int) -> bool:
    """``value`` is a ratio k / count as Python computes it, not float32 noise."""
    return value == round(value * count) / count


def test_gossip_with_a_straggler_trains_every_batch_once_per_epoch(tmp_path, small_npz, small_graph, capsys):
    summary, metrics, tasks = _train(tmp_path, small_npz, "g", "--mode", "gossip", "--epochs", "6", "--clusters", "12",
                                     "--clusters-per-batch", "2", "--straggler", "1:20")
    assert [m["epoch"] for m in metrics] == list(range(1, 7))
    batches = [t for t in tasks if t["kind"] == "batch"]
    for epoch in range(1, 7):
        assert sorted(t["batch"] for t in batches if t["epoch"] == epoch) == list(range(6))  # exactly once
    per_worker = Counter(t["server"] for t in batches)
    assert summary["batches_per_worker"] == [per_worker[r] for r in range(4)] and summary["batches_trained"] == 36
    # What the ICPADS paper claims, and nothing that timing decides: the slowed worker trains less than an even
    # share and the others take up its work (together more than theirs). How the rest is shared among the others
    # is timing's (under load another worker is slow too: [17, 2, 1, 16] once), so it is not asserted.
    even = 36 / 4
    assert per_worker[1] < even and sum(n for r, n in per_worker.items() if r != 1) > 3 * even, per_worker
    assert summary["gossip_rounds"] > 0 and summary["worker_deaths"] == [] and summary["workers_at_end"] == 4
    assert summary["recorded_by"] == 0 and summary["average_every"] == 0
    n_val = int(small_graph.mask("val").sum())
    assert all(_exact(m["val_acc"], n_val) for m in metrics) and _exact(summary["final_val_acc"], n_val)
    assert all(round(m["wall_s"], 4) == m["wall_s"] for m in metrics)
    assert "[" in capsys.readouterr().out  # batches by rank in the CLI's line
    assert main(["report", str(tmp_path / "g")]) == 0  # reports read decentralised records like any other
    assert "gossip x4" in capsys.readouterr().out


def test_allreduce_run_record(tmp_path, small_npz):
    summary, metrics, tasks = _train(tmp_path, small_npz, "a", "--mode", "allreduce", "--epochs", "3", "--clusters", "12",
                                     "--clusters-per-batch", "2", "--target-acc", "0.01")
    assert len(metrics) == 1  # the target is met at epoch 1: every worker stops within the next epoch
    kinds = Counter(t["kind"] for t in tasks)
    assert kinds["batch"] == 6 and kinds["allreduce"] == 4 * 2  # 2 steps per epoch, 4 workers
    assert summary["mode"] == "allreduce" and np.isfinite(summary["final_loss"])
    first = [2, 2, 1, 1]  # epoch 1's deal; a worker may train later epochs' shares before the stop reaches it
    # (under a loaded suite [6, 6, 3, 2]: all three epochs), never more than the budget's three
    assert all(f <= n <= 3 * f for n, f in zip(summary["batches_per_worker"], first, strict=True)), summary["batches_per_worker"]
    assert summary["gossip_rounds"] == 0


@pytest.mark.parametrize("flags, message", [
    (["--mode", "gossip", "--backend", "local"], "drop --backend"),
    (["--mode", "gossip", "--straggler", "7:2"], "--straggler"),
    (["--mode", "gossip", "--straggler", "1:x"], "--straggler"),
    (["--mode", "allreduce", "--clusters", "4", "--clusters-per-batch", "5"], "clusters-per-batch"),
    (["--mode", "allreduce", "--average-every", "2"], "--average-every"),
    (["--mode", "gossip", "--average-every", "-1"], "--average-every"),
    (["--mode", "gossip", "--peer-timeout-s", "0"], "--peer-timeout-s"),
    (["--mode", "gossip", "--device", "cuda"], "CUDA"),
])
def test_bad_flags_exit_2(tmp_path, small_npz, capsys, flags, message):
    if "cuda" in flags:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
    assert main(["train", "--data", str(small_npz), "--out", str(tmp_path / "x"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.long
def test_cora_gossip_within_1_5_points_of_allreduce(tmp_path, cora):
    """2 seeds each, 4 CPU workers, 60 epochs (accuracy at the best validation epoch)."""
    path = tmp_path / "cora.npz"
    write_npz(cora, path)
    acc = {}
    for mode in ("gossip", "allreduce"):
        acc[mode] = np.mean([_train(tmp_path, path, f"{mode}{s}", "--mode", mode, "--epochs", "60", "--seed", str(s))[0]
                             ["test_acc_at_best_val"] for s in range(2)])
    assert acc["gossip"] > 0.78 and abs(acc["gossip"] - acc["allreduce"]) <= 0.015, acc


@pytest.mark.long
def test_same_entry_point_under_torchrun(tmp_path, small_npz):
    import os
    import subprocess
    import sys

    out = tmp_path / "tr"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "dorylus_py",
         "train", "--data", str(small_npz), "--mode", "gossip", "--epochs", "2", "--clusters", "8", "--quiet",
         "--out", str(out)], capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, DORYLUS_KEY="ef" * 32))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["batches_trained"] == 4 and summary["epochs"] == 2
    assert summary["recorded_by"] == 0 and sum(summary["batches_per_worker"]) == 4


@pytest.mark.long
def test_an_interrupted_gossip_run_keeps_its_best_model(small_npz, tmp_path):
    """Ctrl-C (SIGINT to the CLI) after a few evaluated epochs: exit 130, status `interrupted`, the best
    model so far in `best_weights.npz`, and `report` reads the record."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "dorylus_py", "train", "--data", str(small_npz), "--out", str(run),
                             "--quiet", "--workers", "2", "--mode", "gossip", "--epochs", "100000", "--clusters", "12"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    deadline, metrics = time.monotonic() + 180, run / "metrics.jsonl"
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)  # polling a file another process writes; no event to wait on
        assert proc.poll() is None, proc.communicate()[1][-600:]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-600:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and (run / "best_weights.npz").exists()
    assert main(["report", str(run)]) == 0
