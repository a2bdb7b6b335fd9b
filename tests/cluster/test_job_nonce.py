"""The job nonce is the defence against replays across jobs: every start of a job draws a fresh one
(``DriverLink.begin``), and a server of one job refuses a message signed for another, even one signed
with the right key for its own address. Two jobs on the same servers, as separate processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import zmq

from dorylus_py.cli import main
from dorylus_py.data import write_npz
from dorylus_py.protocol import Message, Session
from dorylus_py.protocol.transport import Plain, dealer
from tests.cluster.test_cluster_file import free_ports
from tests.security import insider

KEY = bytes(range(40, 72))


def ask(address: str, session: Session, wait_s: float) -> bool:
    """Whether a signed ``ping`` to ``address`` is answered within ``wait_s``."""
    sock = dealer(zmq.Context.instance(), address, Plain.of_job(KEY))
    try:
        sock.send_multipart(session.encode(Message("ping", {"req": 1}), address))
        return bool(sock.poll(int(wait_s * 1000)))
    finally:
        sock.close(0)


def epochs(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def test_each_job_draws_its_own_nonce_and_servers_refuse_the_last_jobs_messages(small_graph, tmp_path):
    write_npz(small_graph, tmp_path / "g.npz")
    assert main(["prepare", str(tmp_path / "g.npz"), "-k", "2", "--out", str(tmp_path / "parts")]) == 0
    d, g0, g1, w0 = free_ports(4)
    weights = f"tcp://127.0.0.1:{w0}"
    cluster = {"driver": f"tcp://127.0.0.1:{d}", "graph_servers": [f"tcp://127.0.0.1:{g0}", f"tcp://127.0.0.1:{g1}"],
               "weight_servers": [weights]}
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    env = dict(os.environ, DORYLUS_KEY=KEY.hex(), PYTHONUNBUFFERED="1")
    cli = [sys.executable, "-m", "dorylus_py"]
    names = [("graph-server", 0), ("graph-server", 1), ("weight-server", 0)]
    logs = [open(tmp_path / f"{role}{rank}.log", "w") for role, rank in names]
    servers = [subprocess.Popen(insider.command(tmp_path / "cluster.json", rank, 2), env=insider.environment(
                                    env, tmp_path / "nonces"), stdout=log, stderr=subprocess.STDOUT)
               if role == "graph-server" and rank == 0 else  # it tells us each job's nonce, as task events would
               subprocess.Popen([*cli, role, "--cluster", str(tmp_path / "cluster.json"), "--rank", str(rank),
                                 "--jobs", "2"], env=env, stdout=log, stderr=subprocess.STDOUT)
               for (role, rank), log in zip(names, logs)]
    train = [*cli, "train", "--backend", "cpu", "--cluster", str(tmp_path / "cluster.json"), "--data",
             str(tmp_path / "parts"), "--quiet"]
    second = None
    try:
        first = subprocess.run([*train, "--epochs", "2", "--out", str(tmp_path / "run1")], env=env, timeout=300,
                               capture_output=True, text=True)
        assert first.returncode == 0, first.stderr
        second = subprocess.Popen([*train, "--epochs", "100000", "--out", str(tmp_path / "run2")], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while epochs(tmp_path / "run2") < 1:
            assert second.poll() is None and time.monotonic() < deadline, "the second job did not train"
            time.sleep(0.2)
        nonces = insider.nonces(tmp_path / "nonces", 2)
        assert nonces[0] != nonces[1], "two jobs ran under the same nonce"
        assert not re.search("|".join(n.hex() for n in nonces), "".join(p.read_text() for p in tmp_path.glob("*.log")))
        then, now = (Session(KEY, job=n) for n in nonces)
        assert ask(weights, now, wait_s=30), "the weight server did not answer its own job"
        assert not ask(weights, then, wait_s=3), "the weight server answered a message of the last job"
        second.send_signal(signal.SIGINT)
        assert second.wait(timeout=60) == 130
        for p, (role, rank) in zip(servers, names):
            assert p.wait(timeout=60) == 0, (tmp_path / f"{role}{rank}.log").read_text()[-3000:]
    finally:
        for p in [*servers, *([second] if second else [])]:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
