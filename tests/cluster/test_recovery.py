"""Processes killed mid-run: a dead emulated Lambda is replaced, a dead graph or weight server is
restarted from the last checkpoint, and a sync run ends with the loss of an undisturbed one.

Each test runs the driver on a thread of this process, waits (on the run record, not on the clock)
until the job is well under way, then kills one of its processes with SIGKILL."""

import json
import os
import signal
import threading
import time

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


def freeze_while_it_holds_a_task(job, pid: int, timeout_s: float = 120.0) -> None:
    """Freeze the worker (SIGSTOP) and leave it frozen once the job stands still behind it: the graph
    server keeps sending a lease it does not know is frozen its share of every stage's tasks, so in sync
    mode the next epoch waits on the frozen worker's copies until they are overdue (at least
    ``--relaunch-min-s``). The epochs' count, not the clock, says it holds one; the deadline is a hang guard."""
    metrics = job.run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    os.kill(pid, signal.SIGSTOP)
    while time.monotonic() < deadline:
        before = len(metrics.read_text().splitlines())
        time.sleep(1.0)
        if len(metrics.read_text().splitlines()) == before:
            return
    raise AssertionError(f"the job went on without worker {pid}")


def losses(result):
    return [r["loss"] for r in result.history]


@pytest.mark.long
@pytest.mark.parametrize("stream_rows", [0, 37], ids=["whole", "streamed"])
def test_a_killed_lambda_worker_is_replaced_and_the_run_is_unchanged(parts, undisturbed, tmp_path, stream_rows):
    """A worker killed while its lease holds copies (streamed: parts of them run, their rows staged): the
    copies fail and run again, each result and gradient takes effect once, and the losses are an
    undisturbed run's."""
    job = Running(config(stream_rows=stream_rows, relaunch_min_s=60), parts, tmp_path / "run")
    job.wait_for_epoch(2)
    workers = [w for fs in server("graph_servers", 1).children() if "multiprocessing.forkserver" in " ".join(fs.cmdline())
               for w in fs.children()]  # forked by the server's fork server (platforms/local.py)
    assert len(workers) == 2  # --lambdas 4 shared by 2 graph servers
    assert all(w.environ().get("THP_MEM_ALLOC_ENABLE") == "1" for w in workers)  # huge pages, from their server
    freeze_while_it_holds_a_task(job, workers[0].pid)  # not overdue for a minute: the kill is what ends its copies
    os.kill(workers[0].pid, signal.SIGKILL)
    got = job.join()
    assert got.summary["restarts"] == 0 and got.summary["relaunches"] >= 1
    np.testing.assert_allclose(losses(got), losses(undisturbed), rtol=1e-5 if stream_rows else 1e-6)
    assert_gradients_once(got.summary, EPOCHS * 2 * 2 * 3)  # the dead worker's copies ran again, their gradients once
    end = [json.loads(line.split(" end ", 1)[1]) for line in (tmp_path / "run" / "logs" / "graph-server-1.log")
           .read_text().splitlines() if " end {" in line]
    assert end and end[-1]["workers_replaced"] == 1
    tasks = [json.loads(line) for line in (tmp_path / "run" / "tasks.jsonl").read_text().splitlines()]
    died = [t for t in tasks if t["error"].startswith("worker died")]
    assert died and {t["server"] for t in died} == {1}  # the copies its lease held failed, and ran again:
    key = lambda t: (t["kind"], t["train"], t["epoch"], t["layer"], t["chunk"])  # noqa: E731
    for dead in died:
        assert [t["ok"] for t in tasks if t["server"] == 1 and key(t) == key(dead) and "lease" in t] == [False, True]
    leases = [json.loads(line) for line in (tmp_path / "run" / "leases.jsonl").read_text().splitlines()]
    assert [t["error"][:11] for t in leases if not t["ok"]] == ["worker died"]


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
