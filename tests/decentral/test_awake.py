"""A worker's own freeze is not its peers' silence (``dorylus_py/awake.py``): the peer timeout runs on the
seconds the process was running. Frozen with SIGSTOP, as a paused VM or a starved process is: a gossip
job whose workers all froze together ends with one record and no deaths, where before, on waking, the
workers declared each other dead and the job ended with none (CI, stop 60: the stress test's seed 15)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CLOCK = """
import sys, time
from dorylus_py.awake import _clock, awake_now
a, m = awake_now(), time.monotonic()
print("ready", flush=True)
sys.stdin.readline()
print(awake_now() - a, time.monotonic() - m, _clock.frozen_s(), flush=True)
"""

JOB = """
import json, logging, pathlib, sys, tempfile, time, torch
logging.disable(logging.WARNING)
from tests.decentral.test_stress import Job, finals
from dorylus_py.data import SynthConfig, generate
from dorylus_py.partition.partitioners import assign
torch.set_num_threads(1)
g = generate(SynthConfig(nodes=300, edges=1_500, features=8, classes=3, seed=1))
owners = {12: assign(g, 12, "metis", 0)}
print("ready", flush=True)
job = Job(seed=1, world=3, epochs=8, clusters=12, per_batch=1, slow=0, kill_at=None, victim=0, target_acc=0.0)
job.run(g, owners, pathlib.Path(tempfile.mkdtemp()))
f = finals(job)
print(json.dumps({"finals": len(f), "errors": job.errors, "deaths": f[0]["worker_deaths"] if f else None}), flush=True)
"""


def child(code: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc


def freeze(proc: subprocess.Popen, seconds: float) -> None:
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def test_the_clock_leaves_out_a_freeze_and_counts_the_running_time():
    proc = child(CLOCK)
    try:
        time.sleep(0.5)
        freeze(proc, 1.5)
        time.sleep(0.5)
        out, err = proc.communicate("\n", timeout=30)
    finally:
        proc.kill()
    awake, wall, frozen = map(float, out.split())
    assert wall >= 2.4, out
    assert frozen >= 1.0, out  # the 1.5 s freeze, less a tick and the grace
    assert awake >= 0.9 and abs(awake + frozen - wall) < 0.05, out  # the running second is counted


def test_a_gossip_job_frozen_twice_for_twice_the_peer_timeout_ends_with_one_record_and_no_deaths():
    proc = child(JOB)
    try:
        for wait in (1.0, 0.5):  # the job under way (before this change: 4 of 4 ended with deaths, 3 with no record)
            time.sleep(wait)
            freeze(proc, 3.0)  # the stress test's peer timeout is 1.5 s
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"finals": 1, "errors": {}, "deaths": []}, result
