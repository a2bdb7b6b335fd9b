"""Nothing hangs and nothing is left behind: Ctrl-C, or a server that dies, stops the whole job."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from dorylus_py.data import write_npz


@pytest.fixture(autouse=True)
def no_job_outlives_its_test():
    """A failed test must not leave its 100,000-epoch job loading the machine for the tests after it."""
    yield
    for p in psutil.Process().children(recursive=True):
        try:
            if "dorylus_py" in " ".join(p.cmdline()) or "graph_servers" in " ".join(p.cmdline()):
                p.kill()
        except psutil.Error:  # gone already
            pass


def start_job(small_graph, tmp_path, *extra):
    write_npz(small_graph, tmp_path / "g.npz")
    proc = subprocess.Popen([sys.executable, "-m", "dorylus_py", "train", "--data", str(tmp_path / "g.npz"),
                             "--backend", "local", "-k", "2", "--lambdas", "2", "--epochs", "100000",
                             "--out", str(tmp_path / "run"), "--quiet", *extra], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    metrics = tmp_path / "run" / "metrics.jsonl"
    while time.monotonic() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
        time.sleep(0.2)
    assert metrics.stat().st_size > 0, "the job never finished an epoch"
    family = psutil.Process(proc.pid).children(recursive=True)
    assert len(family) >= 5  # 2 graph servers, a weight server, Lambda workers
    return proc, family


def assert_all_gone(family):
    gone, alive = psutil.wait_procs(family, timeout=20)
    assert not alive, [p.cmdline() for p in alive]


@pytest.mark.long
def test_ctrl_c_stops_every_process(small_graph, tmp_path):
    proc, family = start_job(small_graph, tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130  # 128 + SIGINT, as shells report an interrupted command
    assert err.strip().splitlines()[-1].startswith("error: interrupted; every process stopped")
    assert_all_gone(family)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "interrupted"


@pytest.mark.long
def test_a_dying_server_beyond_max_restarts_stops_the_job_with_its_name(small_graph, tmp_path):
    proc, family = start_job(small_graph, tmp_path, "--max-restarts", "0")
    victim = next(p for p in family if "graph_servers" in " ".join(p.cmdline()) and "--rank 1" in " ".join(p.cmdline()))
    os.kill(victim.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: graph-server-1 was killed by signal 9"), last
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed: " + last.removeprefix("error: ")
    assert last.endswith("the job stops after 0 restarts (--max-restarts)"), last
    assert_all_gone(family)
