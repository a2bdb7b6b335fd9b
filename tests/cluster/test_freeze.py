"""A whole job frozen at once (its VM paused: every process SIGSTOPped) for longer than the 6 s after which a
silent server is presumed dead: on waking, neither the driver nor a server takes the freeze for the other's
silence (``dorylus_py/awake.py``), so the job goes on without a restart. Before, the driver declared a
server lost (or the server left, the driver silent) and restarted the job from its checkpoint. A server
frozen alone is still found: tests/cluster/test_recovery.py, tests/lab/test_faults.py."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from dorylus_py.serving.heartbeat import SILENCE_S


@pytest.mark.long
def test_a_job_frozen_whole_for_longer_than_the_silence_goes_on_without_a_restart(graph_npz, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "dorylus_py", "train", "--data", str(graph_npz), "--out", str(out), "--quiet",
           "--backend", "local", "-k", "2", "--lambdas", "2", "--epochs", "30", "--checkpoint-every", "5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        metrics, deadline = out / "metrics.jsonl", time.monotonic() + 120
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "no epoch 3"
            time.sleep(0.05)
        frozen = [proc.pid] + [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(SILENCE_S + 3)
        for pid in reversed(frozen):
            os.kill(pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["restarts"] == 0 and summary["epochs"] == 30, (summary["restarts"], err[-2000:])
    assert "presumed dead" not in err and "has not answered" not in err
