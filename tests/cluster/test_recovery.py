"""Processes killed mid-run: a dead emulated Lambda is replaced, a dead graph or weight server is
restarted from the last checkpoint, and a sync run ends with the loss of an undisturbed one.

Each test runs the driver on a thread of this process, waits (on the run record, not on the clock)
until the job is well under way, then kills one of its processes with SIGKILL."""

import json
import os
import platform
import signal
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from dorylus_py.cluster.launcher import train_distributed
from dorylus_py.config import TrainConfig
from dorylus_py.partition import prepare
from dorylus_py.training import RunRecord
from tests.cluster import assert_gradients_once, running_children

EPOCHS = 8


def config(**kw):
    return TrainConfig(**{"backend": "local", "graph_servers": 2, "epochs": EPOCHS, "chunks": 3, "lambdas": 4,
                          "dropout": 0.5, "feature_norm": "none", "checkpoint_every": 2} | kw)


@pytest.fixture(scope="module")
def parts(small_graph, tmp_path_factory):
    path = tmp_path_factory.mktemp("recovery") / "parts"
    prepare(small_graph, path, 2)
    return path


@pytest.fixture(scope="module")
def undisturbed(parts, tmp_path_factory):
    cfg = config()
    out = tmp_path_factory.mktemp("undisturbed") / "run"
    return train_distributed(cfg, parts, RunRecord(out, cfg.to_dict()), "none", show_progress=False)


class Running:
    """``train_distributed`` on a thread; ``result`` or ``error`` once it ends."""

    def __init__(self, cfg, parts, run_dir):
        self.run_dir, self.result, self.error = run_dir, None, None
        self.thread = threading.Thread(target=self._go, args=(cfg, parts), daemon=True)
        self.thread.start()

    def _go(self, cfg, parts):
        try:
            self.result = train_distributed(cfg, parts, RunRecord(self.run_dir, cfg.to_dict()), "none", show_progress=False)
        except BaseException as e:  # noqa: BLE001  (the test reads it)
            self.error = e

    def wait_for_epoch(self, epoch, timeout_s=300):
        metrics = self.run_dir / "metrics.jsonl"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.thread.is_alive():
            if metrics.exists() and len(metrics.read_text().splitlines()) >= epoch:
                return
            time.sleep(0.05)
        raise AssertionError(f"epoch {epoch} never came ({self.error!r})")

    def join(self, timeout_s=300):
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the job hangs"
        if self.error is not None:
            raise self.error
        return self.result


def servers():
    return {" ".join(p.cmdline()): p for p in psutil.Process().children() if "--rank" in p.cmdline()}


def server(role_module, rank):
    return next(p for cmd, p in servers().items() if f"-m {role_module} " in cmd and cmd.endswith(f"--rank {rank}"))


SLEEPS = {"x86_64": {35, 230}, "aarch64": {101, 115}}  # nanosleep, clock_nanosleep: time.sleep's system calls


def stop_in_latency_sleep(pid: int, timeout_s: float = 60.0) -> None:
    """Freeze the worker (SIGSTOP) at a moment it sleeps the emulated invoke latency, which it does only
    inside an invocation (``platforms/local.py``): frozen, it cannot finish that task, so a kill fails it.
    Each try stops it, waits until the kernel says it is stopped, reads the system call it was stopped
    in (``/proc/PID/syscall``), and lets it go on if that was not the sleep; the deadline is a hang guard."""
    sleeps = SLEEPS.get(platform.machine())
    if sleeps is None or not Path(f"/proc/{pid}/syscall").exists():
        pytest.skip("needs Linux's /proc/PID/syscall on x86_64 or aarch64")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        os.kill(pid, signal.SIGSTOP)
        while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "Tt":
            assert time.monotonic() < deadline, "the worker did not stop"
            time.sleep(0.001)  # the kernel delivers SIGSTOP asynchronously
        call = Path(f"/proc/{pid}/syscall").read_text().split()[0]
        if call.isdigit() and int(call) in sleeps:
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.005)  # let it run on to its next invocation
    raise AssertionError(f"worker {pid} was never caught in its latency sleep")


def losses(result):
    return [r["loss"] for r in result.history]


@pytest.mark.long
def test_a_killed_lambda_worker_is_replaced_and_the_run_is_unchanged(parts, undisturbed, tmp_path):
    job = Running(config(lambda_latency_ms=100), parts, tmp_path / "run")  # workers are busy nearly all the time
    job.wait_for_epoch(2)
    workers = [w for fs in server("graph_servers", 1).children() if "multiprocessing.forkserver" in " ".join(fs.cmdline())
               for w in fs.children()]  # forked by the server's fork server (platforms/local.py)
    assert len(workers) == 2  # --lambdas 4 shared by 2 graph servers
    assert all(w.environ().get("THP_MEM_ALLOC_ENABLE") == "1" for w in workers)  # huge pages, from their server
    stop_in_latency_sleep(workers[0].pid)  # frozen while it holds a task
    os.kill(workers[0].pid, signal.SIGKILL)
    got = job.join()
    assert got.summary["restarts"] == 0
    np.testing.assert_allclose(losses(got), losses(undisturbed), rtol=1e-6)
    assert_gradients_once(got.summary, EPOCHS * 2 * 2 * 3)  # the dead worker's task ran again, its gradient went once
    end = [json.loads(line.split(" end ", 1)[1]) for line in (tmp_path / "run" / "logs" / "graph-server-1.log")
           .read_text().splitlines() if " end {" in line]
    assert end and end[-1]["workers_replaced"] == 1
    tasks = [json.loads(line) for line in (tmp_path / "run" / "tasks.jsonl").read_text().splitlines()]
    died = [t for t in tasks if t["error"].startswith("worker died")]
    assert len(died) == 1 and died[0]["server"] == 1  # the task it was running failed, and was run again:
    key = lambda t: (t["kind"], t["train"], t["epoch"], t["layer"], t["chunk"])  # noqa: E731
    assert [t["ok"] for t in tasks if t["where"] == "local-lambda" and key(t) == key(died[0]) and t["server"] == 1
            ] == [False, True]


@pytest.mark.parametrize("victim", [("graph_servers", 1), ("dorylus_py.weights", 0)])
@pytest.mark.long
def test_a_killed_server_is_restarted_from_the_checkpoint(parts, undisturbed, tmp_path, victim):
    job = Running(config(), parts, tmp_path / "run")
    job.wait_for_epoch(3)
    os.kill(server(*victim).pid, signal.SIGKILL)
    got = job.join()
    assert got.summary["restarts"] == 1
    assert [r["epoch"] for r in got.history] == list(range(1, EPOCHS + 1))
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in metrics] == list(range(1, EPOCHS + 1))  # redone epochs are not written twice
    np.testing.assert_allclose(losses(got), losses(undisturbed), rtol=1e-5)
    assert_gradients_once(got.summary)  # per start: the epochs after the checkpoint are sent again, by new servers
    assert not running_children()  # nothing left behind


@pytest.mark.long
def test_an_async_run_recovers_too(parts, tmp_path):
    # 50 ms Lambda latency: on a loaded machine an async run of this graph could end before the kill
    cfg = config(mode="async", staleness=1, epochs=6, dropout=0.0, lambda_latency_ms=50)
    job = Running(cfg, parts, tmp_path / "run")
    job.wait_for_epoch(3)
    os.kill(server("graph_servers", 0).pid, signal.SIGKILL)
    got = job.join()
    assert got.summary["restarts"] == 1 and [r["epoch"] for r in got.history] == list(range(1, 7))
    assert got.history[-1]["loss"] < got.history[0]["loss"]


def test_a_graph_server_dying_after_training_does_not_fail_the_job(parts, tmp_path, monkeypatch):
    from dorylus_py.cluster.launcher import _Run

    finish = _Run.finish

    def kill_then_finish(self, link):  # every epoch is recorded; the weights come from the weight servers
        proc, _ = link.procs["graph-server-0"]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)  # dead and reaped: a check of it would see the signal at once
        return finish(self, link)

    monkeypatch.setattr(_Run, "finish", kill_then_finish)
    cfg = config(epochs=2)
    got = train_distributed(cfg, parts, RunRecord(tmp_path / "run", cfg.to_dict()), "none", show_progress=False)
    assert got.summary["restarts"] == 0 and [r["epoch"] for r in got.history] == [1, 2]
    assert (tmp_path / "run" / "weights.npz").exists()


def test_a_server_dying_before_its_hello_is_restarted_like_any_other(parts, tmp_path, monkeypatch):
    from dorylus_py.cluster.driver_link import DriverLink

    spawn, killed = DriverLink.spawn, []

    def spawn_then_kill(self, name, module, rank):  # the first graph-server-1 dies before it can say hello
        spawn(self, name, module, rank)
        if name == "graph-server-1" and not killed:
            proc, _ = self.procs[name]
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            killed.append(proc.pid)

    monkeypatch.setattr(DriverLink, "spawn", spawn_then_kill)
    cfg = config(epochs=2)
    got = train_distributed(cfg, parts, RunRecord(tmp_path / "run", cfg.to_dict()), "none", show_progress=False)
    assert killed and got.summary["restarts"] == 1 and [r["epoch"] for r in got.history] == [1, 2]
    assert not running_children()
