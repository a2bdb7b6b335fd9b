"""Real worker processes killed with SIGKILL mid-run: the others notice within seconds, train the dead
worker's batches, finish with one worker fewer and say so; when the recorder (rank 0) dies, the next
lowest rank takes over the record. Never a hang: every job runs under a deadline."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dorylus_py.data import SynthConfig, generate, write_npz

DEADLINE_S = 300  # a whole job, start-up of every process included, on a loaded 2-core machine


@pytest.fixture(scope="module")
def graph_npz(tmp_path_factory) -> Path:
    """Easy enough that accuracy settles within 0.3 point from run to run (measured 95.9-96.1 %)."""
    path = tmp_path_factory.mktemp("faults") / "g.npz"
    write_npz(generate(SynthConfig(nodes=3000, edges=30_000, features=32, classes=4, homophily=0.7,
                                   feature_signal=0.3, seed=5)), path)
    return path


def _wait_for(check, what: str, timeout_s: float = DEADLINE_S):
    deadline = time.monotonic() + timeout_s
    while (value := check()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling a file another process writes
    return value


def _rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(x) for x in lines if x.endswith("}")]


def _pid(out: Path, rank: int) -> int | None:
    log = out / "logs" / f"worker-{rank}.log"
    for line in log.read_text().splitlines() if log.exists() else []:
        if line.startswith(f"worker {rank}: pid "):
            return int(line.split()[-1])
    return None


def _job(data: Path, out: Path, workers: int, epochs: int, kill: tuple[int, int] | None = None, extra=(), before_kill=None):
    """Run ``dorylus train --mode gossip``; ``kill`` = (rank, after this many rows), ``before_kill(launcher
    pid)`` called just before it. Returns the summary, rows, task rows, the CLI's output and when the kill
    was sent."""
    cmd = [sys.executable, "-m", "dorylus_py", "train", "--data", str(data), "--out", str(out), "--mode", "gossip",
           "--workers", str(workers), "--epochs", str(epochs), "--clusters", "24", "--clusters-per-batch", "2",
           "--peer-timeout-s", "2", "--quiet", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed_at = None
    try:
        if kill is not None:
            rank, after = kill
            _wait_for(lambda: True if len(_rows(out)) >= after else None, f"{after} epochs recorded")
            if before_kill is not None:
                before_kill(proc.pid)
            os.kill(_wait_for(lambda: _pid(out, rank), f"worker {rank}'s pid"), signal.SIGKILL)
            killed_at = time.time()
        stdout, stderr = proc.communicate(timeout=DEADLINE_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    tasks = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    return summary, _rows(out), tasks, stdout + stderr, killed_at


def _every_batch_trained(rows: list[dict], tasks: list[dict], per_epoch: int = 12) -> None:
    for row in rows:
        trained = {t["batch"] for t in tasks if t["kind"] == "batch" and t["epoch"] == row["epoch"]}
        assert trained == set(range(per_epoch)), f"epoch {row['epoch']} misses {set(range(per_epoch)) - trained}"


@pytest.mark.long
def test_a_killed_worker_is_noticed_and_the_job_finishes_without_it(graph_npz, tmp_path):
    """4 workers, worker 2 killed after 3 epochs: 3 finish, no less accurate (by more than 1 point) than an
    undisturbed run. One-sided: losing a worker could only cost accuracy; it once came out 1.04 points *above*
    the calm run (5 of 480 test vertices), which a two-sided bound failed."""
    summary, rows, tasks, output, killed_at = _job(graph_npz, tmp_path / "killed", 4, 150, kill=(2, 3))
    assert summary["worker_deaths"] == [2] and summary["workers"] == 4 and summary["workers_at_end"] == 3
    assert summary["deaths"][0]["noticed_at"] - killed_at < 10.0  # within seconds (timeout 2 s)
    assert "worker 2 was killed (SIGKILL); the other workers go on without it" in output
    assert "the job finished with 3 workers" in output
    assert [r["epoch"] for r in rows] == list(range(1, 151)) and rows[-1]["workers"] == 3
    _every_batch_trained(rows, tasks)
    calm = _job(graph_npz, tmp_path / "calm", 4, 150)[0]
    assert calm["worker_deaths"] == [] and sum(calm["batches_per_worker"]) == 150 * 12  # exactly once without deaths
    assert summary["test_acc_at_best_val"] >= calm["test_acc_at_best_val"] - 0.01, (summary, calm)


@pytest.mark.long
def test_the_next_rank_takes_over_the_record_when_the_recorder_dies(graph_npz, tmp_path):
    """3 workers averaging every 5 epochs (--average-every), rank 0 killed after 2 epochs."""
    summary, rows, tasks, output, _ = _job(graph_npz, tmp_path / "r", 3, 100, kill=(0, 2), extra=["--average-every", "5"])
    assert summary["recorded_by"] == 1 and summary["worker_deaths"] == [0] and summary["workers_at_end"] == 2
    assert summary["average_every"] == 5
    assert [r["epoch"] for r in rows] == list(range(1, 101))  # the rows rank 0 wrote, rewritten by rank 1
    _every_batch_trained(rows, tasks)
    assert (tmp_path / "r" / "best_weights.npz").exists() and summary["test_acc_at_best_val"] > 0.9


def _peer_to_peer(launcher_pid: int) -> None:
    """Every TCP connection of a worker joins it to another worker's inbox (or to the launcher's start-up
    rendezvous store), and the launcher has none to a worker's inbox: it is in no message's path."""
    launcher = psutil.Process(launcher_pid)
    workers = [p for p in launcher.children() if "dorylus_py.decentral" in p.cmdline()]
    conns = {p.pid: p.net_connections("tcp") for p in [launcher, *workers]}
    listening = {pid: {c.laddr.port for c in cs if c.status == psutil.CONN_LISTEN} for pid, cs in conns.items()}
    inboxes = set().union(*(listening[p.pid] for p in workers))
    direct = 0
    for p in workers:
        for c in conns[p.pid]:
            if c.status == psutil.CONN_ESTABLISHED and c.raddr:
                mine, theirs = c.laddr.port in listening[p.pid], c.raddr.port
                assert mine or theirs in inboxes - listening[p.pid] or theirs in listening[launcher_pid], (p.pid, c)
                direct += theirs in inboxes
    assert direct >= len(workers), "the workers did not connect to each other"
    assert not [c for c in conns[launcher_pid] if c.raddr and c.raddr.port in inboxes]


@pytest.mark.parametrize("seed", [2, 3, 5])
@pytest.mark.long
def test_random_real_jobs_end(graph_npz, tmp_path, seed):
    """2-6 workers, a random straggler, a random worker killed at a random epoch: the job ends, and while it
    ran the workers talked to each other directly. Fifty such jobs of threads on an in-memory network run
    in test_stress.py."""
    rng = random.Random(seed)
    workers = rng.randint(2, 6)
    kill = (rng.randrange(workers), rng.randint(1, 5))
    extra = ["--straggler", f"{rng.randrange(workers)}:{rng.choice([1.5, 3, 5])}", "--seed", str(seed)]
    summary, rows, tasks, _, _ = _job(graph_npz, tmp_path / "j", workers, 30, kill=kill, extra=extra,
                                      before_kill=_peer_to_peer)
    assert [r["epoch"] for r in rows] == list(range(1, 31))
    # the workers run ahead of the record: a worker that had reported all its batches may die after the last
    # one was trained, and the job end before its death is noticed (it needs --peer-timeout-s)
    assert summary["worker_deaths"] in ([], [kill[0]]) and summary["workers_at_end"] == workers - len(summary["worker_deaths"])
    _every_batch_trained(rows, tasks)
