"""A whole job frozen at once (its VM paused: every process SIGSTOPped) for longer than the 6 s after which a
silent server is presumed dead: on waking, neither the driver nor a server takes the freeze for the other's
silence (``dorylus_py/awake.py``), so the job goes on without a restart. Before, the driver declared a
server lost (or the server left, the driver silent) and restarted the job from its checkpoint. A server
frozen alone is still found by the driver, which ran meanwhile."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from dorylus_py.serving.heartbeat import SILENCE_S


def frozen_for(data, out, which) -> tuple[dict, str]:
    """Train 30 epochs; from epoch 3 on, freeze ``which(driver pid)``'s processes for longer than the
    silence; the summary and stderr once the job ends."""
    cmd = [sys.executable, "-m", "dorylus_py", "train", "--data", str(data), "--out", str(out),
           "--quiet", "--backend", "local", "-k", "2", "--lambdas", "2", "--epochs", "30", "--checkpoint-every", "5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics, deadline = out / "metrics.jsonl", time.monotonic() + 120
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "no epoch 3"
            time.sleep(0.05)
        frozen = which(proc.pid)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(SILENCE_S + 3)
        for pid in reversed(frozen):
            with contextlib.suppress(ProcessLookupError):  # a server the driver killed meanwhile
                os.kill(pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    return json.loads((out / "summary.json").read_text()), err


@pytest.mark.long
def test_a_job_frozen_whole_for_longer_than_the_silence_goes_on_without_a_restart(graph_npz, tmp_path):
    summary, err = frozen_for(graph_npz, tmp_path / "run", lambda driver: [driver] + [
        p.pid for p in psutil.Process(driver).children(recursive=True)])
    assert summary["restarts"] == 0 and summary["epochs"] == 30, (summary["restarts"], err[-2000:])
    assert "presumed dead" not in err and "has not answered" not in err


@pytest.mark.long
def test_a_server_frozen_alone_is_still_found_by_the_driver(graph_npz, tmp_path):
    def graph_server_0(driver):
        return [p.pid for p in psutil.Process(driver).children() if "graph_servers" in " ".join(p.cmdline())
                and p.cmdline()[-2:] == ["--rank", "0"]]

    summary, err = frozen_for(graph_npz, tmp_path / "run", graph_server_0)
    assert "graph-server-0 has not been heard from for 6 s (presumed dead)" in err, err[-2000:]
    assert summary["restarts"] == 1 and summary["epochs"] == 30
