"""The gossip launcher's rendezvous store holds nothing for a local user without the job key, and caps what a
key holder can make it hold: a flood of 4 MB values (the attack that took torch's TCPStore from 253 to 862 MB)
leaves the launcher within 100 MB of its idle size, and the job finishes."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import psutil
import pytest
import torch.distributed as dist

from dorylus_py.decentral.store import BYTES_CAP, VALUE_CAP, StoreClient, StoreServer
from dorylus_py.errors import DorylusError
from dorylus_py.jobkey import KEY_ENV

KEY = b"k" * 32
MB = 1 << 20


def flood(port: int, n: int = 150, size: int = 4 * MB) -> int:
    """What any local user can do: set ``n`` values of ``size`` bytes through torch's own client, and where
    that client cannot talk to the store, send them raw over ``n`` connections at once. The values set."""
    value = b"x" * size
    try:
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=3))
        for i in range(n):
            client.set(f"flood/{i}", value)
        return n
    except Exception:  # noqa: BLE001  (whatever torch's client raises at a store that refuses it)
        pass

    def raw() -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(value)
        except OSError:
            pass

    threads = [threading.Thread(target=raw) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 0


def test_a_key_holder_is_capped_in_value_size_count_and_bytes_and_a_stranger_gets_nothing_held():
    server = StoreServer(KEY, 2)
    try:
        client = StoreClient("127.0.0.1", server.port, KEY, 10)
        client.set("address/0", "tcp://127.0.0.1:5")
        assert client.get("address/0") == b"tcp://127.0.0.1:5" and client.add("n", 2) == 2 and client.add("n", 3) == 5
        with pytest.raises((DorylusError, OSError)):
            client.set("big", b"x" * (VALUE_CAP + 1))  # refused by its header: never read
        accepted = 0
        for i in range(3 * BYTES_CAP // VALUE_CAP):
            try:
                StoreClient("127.0.0.1", server.port, KEY, 10).set(f"v/{i}", b"x" * VALUE_CAP)
                accepted += 1
            except (DorylusError, OSError):  # refused from its header (the answer, or the reset, comes first)
                pass
        assert accepted < BYTES_CAP // VALUE_CAP and server.held()[1] <= BYTES_CAP
        small = StoreClient("127.0.0.1", server.port, KEY, 10)
        with pytest.raises(DorylusError, match="keys, its cap"):
            for i in range(server.keys_cap + 1):
                small.set(f"s/{i}", "1")
        assert server.held()[0] == server.keys_cap
        with pytest.raises(DorylusError, match="not the job key"):
            StoreClient("127.0.0.1", server.port, b"x" * 32, 10)
        before, refused = server.held(), server.refused
        assert flood(server.port, n=20) == 0 and server.held() == before
        assert server.refused >= refused + 20  # each raw connection: not the key, or over the connection cap
    finally:
        server.close()


def _job_and_store(tmp_path) -> tuple[subprocess.Popen, int, bytes]:
    """A gossip job through the real launcher, its store's port and the job key (once the workers run)."""
    assert subprocess.run([sys.executable, "-m", "dorylus_py", "synth", "--out", str(tmp_path / "g.npz"), "--nodes",
                           "400", "--edges", "3000", "--features", "8", "--classes", "3"], capture_output=True).returncode == 0
    job = subprocess.Popen([sys.executable, "-m", "dorylus_py", "train", "--data", str(tmp_path / "g.npz"), "--out",
                            str(tmp_path / "run"), "--mode", "gossip", "--workers", "2", "--clusters", "8",
                            "--clusters-per-batch", "2", "--epochs", "1000", "--quiet"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and job.poll() is None:
        for p in psutil.Process(job.pid).children():
            try:
                cmd, env = p.cmdline(), p.environ()
            except psutil.NoSuchProcess:
                continue
            if "--store" in cmd and KEY_ENV in env:
                return job, int(cmd[cmd.index("--store") + 1].rsplit(":", 1)[1]), bytes.fromhex(env[KEY_ENV])
        time.sleep(0.01)
    job.kill()
    raise AssertionError(f"no worker started: {job.stderr.read() if job.poll() is not None else 'timeout'}")


@pytest.mark.timeout(600)
@pytest.mark.long
def test_a_flood_of_the_launchers_store_leaves_it_within_100_mb_and_the_job_finishes(tmp_path):
    job, port, key = _job_and_store(tmp_path)
    try:
        launcher = psutil.Process(job.pid)
        idle = launcher.memory_info().rss
        assert flood(port) == 0  # at start-up, while the workers meet: torch's client cannot even talk to it
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text()) and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        for i in range(150):  # then a key holder (the key read from a worker's environment, as its user can)
            try:
                StoreClient("127.0.0.1", port, key, 10).set(f"flood/{i}", b"x" * (4 * MB if i % 2 else VALUE_CAP))
            except (DorylusError, OSError):
                pass
        grown = launcher.memory_info().rss - idle
        assert job.poll() is None, "the job ended before the flood was over: nothing was measured"
        assert grown < 100 * MB, f"the launcher grew by {grown / MB:.0f} MB"
        assert job.wait(timeout=500) == 0, job.stderr.read()
        assert "the rendezvous store refused" in job.stderr.read()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_the_launchers_own_store_listens_on_loopback_only(tmp_path):
    """The launcher of a real gossip job, not a helper: every socket it listens on for its store is bound to
    127.0.0.1 (torch's TCPStore would listen on every interface)."""
    job, port, _ = _job_and_store(tmp_path)
    try:
        bound = [c.laddr for c in psutil.Process(job.pid).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert bound, f"the launcher does not listen on the store's port {port}"
        assert all(addr.ip == "127.0.0.1" for addr in bound), bound
    finally:
        job.kill()
        job.wait()
