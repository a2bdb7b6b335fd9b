"""Fuzzing a live Cora job as an insider would (a process with the job key and the job's nonce, as every
Lambda container has): 10,000 hostile messages for each receiving role (a graph server, the weight
server, the driver), sent to all three at once while the job trains, and 2,000 more each on a
connection that never reads its replies. Every process survives, no bug is met (the tests run with
``DORYLUS_STRICT=1``: a handler failing in a way no check names kills its process), every per-epoch loss
equals an undisturbed run's, and no reply or log carries the key. Once on ``cpu``, once on ``local``
with streamed tasks (results in parts). The fuzzed job trains until the fuzzing is over and a few epochs
more, then is stopped (Ctrl-C); the undisturbed run trains as many epochs.

The job runs from a cluster file (fixed ports, every process started here through the CLI), so the
fuzzer knows each address. The corpus is made once the job runs (a server accepts nothing stamped
before its job began) and is a function of its seed: ``DORYLUS_FUZZ_SEED=N`` replays a failure."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from dorylus_py.cli import main
from dorylus_py.partition import PartitionStore
from dorylus_py.protocol.transport import Plain, dealer
from tests.cluster.fuzz_corpus import Job as Insight
from tests.cluster.fuzz_corpus import corpus
from tests.cluster.test_cluster_file import free_ports
from tests.conftest import DATASETS
from tests.security import insider

KEY = bytes(range(100, 132))
MESSAGES = 10_000
UNREAD = 2_000
AFTER = 5  # epochs the fuzzed job trains once the fuzzing is over
ROLES = {"graph-server": "gs0", "weight-server": "ws0", "driver": "driver"}
BACKENDS = {"cpu": ["--backend", "cpu"], "local": ["--backend", "local", "--lambdas", "2", "--stream-rows", "128"]}


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cora") / "parts"
    assert main(["prepare", str(DATASETS / "cora.npz"), "-k", "2", "--out", str(out)]) == 0
    return out


class Job:
    """Two graph servers, a weight server and the driver, as separate processes from one cluster file."""

    def __init__(self, parts: Path, where: Path, backend: str, epochs: int = 100_000):
        where.mkdir()
        d, g0, g1, w0 = free_ports(4)
        self.addresses = {"driver": f"tcp://127.0.0.1:{d}", "graph-server": f"tcp://127.0.0.1:{g0}",
                          "weight-server": f"tcp://127.0.0.1:{w0}"}
        cluster = {"driver": self.addresses["driver"], "graph_servers": [self.addresses["graph-server"], f"tcp://127.0.0.1:{g1}"],
                   "weight_servers": [self.addresses["weight-server"]]}
        (where / "cluster.json").write_text(json.dumps(cluster))
        self.where, self.run, self.parts = where, where / "run", parts
        env = dict(os.environ, DORYLUS_KEY=KEY.hex(), PYTHONUNBUFFERED="1")
        self.logs = {name: open(where / f"{name}.log", "w") for name in ("gs0", "gs1", "ws0", "driver")}
        cli = [sys.executable, "-m", "dorylus_py"]
        self.servers = [subprocess.Popen(insider.command(where / "cluster.json", 0, 1),  # tells us the nonce
                                         env=insider.environment(env, where / "nonce"), stdout=self.logs["gs0"],
                                         stderr=subprocess.STDOUT)]
        self.servers += [subprocess.Popen([*cli, role, "--cluster", str(where / "cluster.json"), "--rank", str(rank),
                                           "--jobs", "1"],
                                          env=env, stdout=self.logs[name], stderr=subprocess.STDOUT)
                         for name, role, rank in [("gs1", "graph-server", 1), ("ws0", "weight-server", 0)]]
        self.driver = subprocess.Popen([*cli, "train", *BACKENDS[backend], "--cluster", str(where / "cluster.json"),
                                        "--data", str(parts), "--epochs", str(epochs), "--chunks", "2", "--quiet",
                                        "--out", str(self.run)], env=env, stdout=self.logs["driver"], stderr=subprocess.STDOUT)

    def epochs(self) -> int:
        metrics = self.run / "metrics.jsonl"
        return len(metrics.read_text().splitlines()) if metrics.exists() else 0

    def wait_for_epochs(self, count: int, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while self.epochs() < count:
            assert self.driver.poll() is None, self.log("driver")
            assert time.monotonic() < deadline, f"the job did not reach epoch {count}"
            try:
                self.driver.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass

    def insight(self) -> Insight:
        """What an insider knows: the job's nonce (in every task event) and its shapes."""
        nonce = insider.nonces(self.where / "nonce")[0]
        m = PartitionStore.open(self.parts).manifest
        parts = m["parts"]
        return Insight(widths=(m["features"], 16, m["classes"]), rows=tuple(p["nodes"] // 2 for p in parts),
                       ghosts=parts[0]["ghosts"], nonce=nonce)

    def finish(self, timeout_s: float = 600, interrupted: bool = False) -> list[dict]:
        try:
            assert self.driver.wait(timeout=timeout_s) == (130 if interrupted else 0), self.log("driver")
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


def send_all(address: str, messages: list[list[bytes]], unread: list[list[bytes]]) -> list[list[bytes]]:
    """Send ``messages`` on one connection that reads its replies as they come, and ``unread`` (another
    session's) on one that never reads them: a server must not wait on such a peer. Returns the
    replies read."""
    ctx = zmq.Context.instance()
    reader, deaf = dealer(ctx, address, Plain.of_job(KEY)), dealer(ctx, address, Plain.of_job(KEY))  # past the gate
    replies = []
    try:
        for sock in (reader, deaf):
            sock.setsockopt(zmq.SNDTIMEO, 120_000)  # a server that stops reading fails the test, not hangs it
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


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.long
def test_a_live_job_survives_an_insider_at_every_role(parts, backend, tmp_path):
    seed = int(os.environ.get("DORYLUS_FUZZ_SEED", "0")) + len(backend)
    print(f"fuzz seed {seed} (DORYLUS_FUZZ_SEED={seed - len(backend)} replays this corpus)")
    job = Job(parts, tmp_path / "fuzzed", backend)
    job.wait_for_epochs(1)
    insight = job.insight()
    replies: dict[str, list] = {}

    def fuzz(role: str, n: int) -> None:
        to = job.addresses[role]
        messages = corpus(role, KEY, to, MESSAGES, seed + n, insight)
        unread = corpus(role, KEY, to, UNREAD, seed + n + 100, insight)
        replies[role] = send_all(to, messages, unread)

    threads = [threading.Thread(target=fuzz, args=(role, n)) for n, role in enumerate(ROLES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert set(replies) == set(ROLES), "a fuzzer did not finish"
    job.wait_for_epochs(job.epochs() + AFTER)
    job.driver.send_signal(signal.SIGINT)  # Ctrl-C: the driver stops every server
    history = job.finish(interrupted=True)
    undisturbed = Job(parts, tmp_path / "undisturbed", backend, epochs=len(history)).finish()
    np.testing.assert_allclose([r["loss"] for r in history], [r["loss"] for r in undisturbed], rtol=1e-6)
    for role, log_name in ROLES.items():
        log = job.log(log_name)
        counts = re.search(r"refused messages: (\d+) unauthenticated, (\d+) invalid, (\d+) bugs", log)
        assert counts, log[-2000:]
        unauthenticated, invalid, bugs = (int(c) for c in counts.groups())
        assert bugs == 0 and "bug while handling" not in log, log[-3000:]
        assert unauthenticated >= 0.6 * MESSAGES and invalid >= 0.1 * MESSAGES, (role, counts.groups())
        assert unauthenticated + invalid >= 0.9 * (MESSAGES + UNREAD), (role, counts.groups())
        if role != "driver":  # the driver answers nothing but its servers' heartbeats
            assert len(replies[role]) > 100 and all(frames[1][:1] == b"\x93" for frames in replies[role])  # a header
    blobs = [b"".join(frames) for rs in replies.values() for frames in rs]
    blobs += [job.log(name).encode() for name in ("gs0", "gs1", "ws0", "driver")]
    assert not [b for b in blobs if KEY in b or KEY.hex().encode() in b], "the job key leaked"
