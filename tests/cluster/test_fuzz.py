"""Fuzzing a live Cora job, one receiving role at a time: 12,000 hostile messages (fuzz_corpus.py) go to
a graph server's, the weight server's or the driver's port while the job trains; every process
survives, the job's final loss equals an undisturbed run's, and no reply or log carries the key.

The job runs from a cluster file (fixed ports, every process started here through the CLI), so the
fuzzer knows each address and the job key, as an insider who has the key would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from dorylus_py.cli import main
from tests.cluster.fuzz_corpus import corpus
from tests.cluster.test_cluster_file import free_ports
from tests.conftest import DATASETS

KEY = bytes(range(100, 132))
MESSAGES = 10_000
EPOCHS = 60
pytestmark = pytest.mark.skipif(not (DATASETS / "cora.npz").exists(), reason=f"{DATASETS / 'cora.npz'} absent")


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cora") / "parts"
    assert main(["prepare", str(DATASETS / "cora.npz"), "-k", "2", "--out", str(out)]) == 0
    return out


class Job:
    """Two graph servers, a weight server and the driver, as separate processes from one cluster file."""

    def __init__(self, parts: Path, where: Path):
        d, g0, g1, w0 = free_ports(4)
        self.addresses = {"driver": f"tcp://127.0.0.1:{d}", "graph-server": f"tcp://127.0.0.1:{g0}",
                          "weight-server": f"tcp://127.0.0.1:{w0}"}
        cluster = {"driver": self.addresses["driver"], "graph_servers": [self.addresses["graph-server"], f"tcp://127.0.0.1:{g1}"],
                   "weight_servers": [self.addresses["weight-server"]]}
        (where / "cluster.json").write_text(json.dumps(cluster))
        self.where, self.run = where, where / "run"
        env = dict(os.environ, DORYLUS_KEY=KEY.hex(), PYTHONUNBUFFERED="1")
        self.logs = {name: open(where / f"{name}.log", "w") for name in ("gs0", "gs1", "ws0", "driver")}
        cli = [sys.executable, "-m", "dorylus_py"]
        self.servers = [subprocess.Popen([*cli, role, "--cluster", str(where / "cluster.json"), "--rank", str(rank)],
                                         env=env, stdout=self.logs[name], stderr=subprocess.STDOUT)
                        for name, role, rank in [("gs0", "graph-server", 0), ("gs1", "graph-server", 1),
                                                 ("ws0", "weight-server", 0)]]
        self.driver = subprocess.Popen([*cli, "train", "--backend", "cpu", "--cluster", str(where / "cluster.json"),
                                        "--data", str(parts), "--epochs", str(EPOCHS), "--chunks", "2", "--quiet",
                                        "--out", str(self.run)], env=env, stdout=self.logs["driver"], stderr=subprocess.STDOUT)

    def wait_for_first_epoch(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        metrics = self.run / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().strip()):
            assert self.driver.poll() is None, self.log("driver")
            assert time.monotonic() < deadline, "the job did not start"
            try:
                self.driver.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass

    def finish(self, timeout_s: float = 600) -> list[dict]:
        try:
            assert self.driver.wait(timeout=timeout_s) == 0, self.log("driver")
            for p, name in zip(self.servers, ("gs0", "gs1", "ws0")):
                assert p.wait(timeout=60) == 0, self.log(name)
        finally:
            for p in [*self.servers, self.driver]:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for f in self.logs.values():
                f.close()
        return [json.loads(line) for line in (self.run / "metrics.jsonl").read_text().splitlines()]

    def log(self, name: str) -> str:
        return (self.where / f"{name}.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def undisturbed(parts, tmp_path_factory) -> list[dict]:
    return Job(parts, tmp_path_factory.mktemp("undisturbed")).finish()


def send_all(address: str, messages: list[list[bytes]], unread: list[list[bytes]]) -> list[list[bytes]]:
    """Send ``messages`` on one connection that reads its replies as they come, and ``unread`` (another
    session's) on one that never reads them: a server must not wait on such a peer. Returns the
    replies read."""
    ctx = zmq.Context.instance()
    reader, deaf = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    replies = []
    try:
        for sock in (reader, deaf):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDTIMEO, 120_000)  # a server that stops reading fails the test, not hangs it
            sock.connect(address)
        for i, frames in enumerate(messages):
            reader.send_multipart(frames)
            if i < len(unread):
                deaf.send_multipart(unread[i])
            while reader.poll(0):
                replies.append(reader.recv_multipart())
        while reader.poll(2000):
            replies.append(reader.recv_multipart())
    finally:
        reader.close(0)
        deaf.close(0)
    return replies


@pytest.mark.parametrize("role, log_name", [("graph-server", "gs0"), ("weight-server", "ws0"), ("driver", "driver")])
def test_a_live_job_survives_hostile_messages(parts, undisturbed, tmp_path, role, log_name):
    job = Job(parts, tmp_path)
    seed = len(log_name) + len(role)
    messages = corpus(role, KEY, job.addresses[role], MESSAGES, seed)
    unread = corpus(role, KEY, job.addresses[role], MESSAGES // 5, seed + 1)
    job.wait_for_first_epoch()
    replies = send_all(job.addresses[role], messages, unread)
    assert job.driver.poll() is None, "the job ended before the fuzzing did: raise EPOCHS"
    history = job.finish()

    assert len(history) == EPOCHS
    np.testing.assert_allclose(history[-1]["loss"], undisturbed[-1]["loss"], rtol=1e-6)
    counts = re.search(r"refused messages: (\d+) unauthenticated, (\d+) invalid", job.log(log_name))
    assert counts, job.log(log_name)[-2000:]
    unauthenticated, invalid = int(counts[1]), int(counts[2])
    assert unauthenticated >= 0.6 * MESSAGES and invalid >= 0.1 * MESSAGES  # every check had its share
    assert unauthenticated + invalid >= 0.9 * (MESSAGES + len(unread))  # the rest: well-formed reads (a ping)
    if role != "driver":  # the driver answers nothing but its servers' heartbeats
        assert len(replies) > 100 and all(frames[1].startswith(b"{") for frames in replies)
    blobs = [b"".join(frames) for frames in replies] + [job.log(name).encode() for name in ("gs0", "gs1", "ws0", "driver")]
    assert not [b for b in blobs if KEY in b or KEY.hex().encode() in b], "the job key leaked"
