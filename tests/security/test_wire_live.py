"""The wire under attack (issue 40, items 1, 3 and 4), against a real job: two graph servers, a weight
server and the driver, each its own process started through the CLI from a cluster file (fixed ports,
no CURVE: the job's PLAIN gate is what keeps a keyless peer out), training a small generated graph until
the tests are done.

Each attack is sent with real sockets: a raw ZMTP peer with no key at all (the NULL mechanism, or PLAIN
with a made-up password), or a zmq DEALER past the gate signing with the job key and the job's nonce (as
every Lambda can). After each, every process still runs, the job
still trains, and a fresh honest request is still answered. The per-message cap is set to 16 MiB here
(``DORYLUS_MAX_MESSAGE_MB``) so that attacks of a few frames of 12-64 MiB stand for the 4 x 954 MiB one
of the issue (measured at full size in docs/architecture.md)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from dorylus_py.cli import main
from dorylus_py.data import write_npz
from dorylus_py.protocol import Message, Session
from dorylus_py.protocol.session import _FIXED, MAGIC
from dorylus_py.protocol.transport import Plain, dealer as gated_dealer
from tests.cluster.test_cluster_file import free_ports
from tests.protocol import forge
from tests.security import insider

KEY = bytes(range(60, 92))
CAP_MB = 16
MiB = 2**20
HUGE = [0, 2**31 - 1, 2**31 - 1, 2**31 - 1]  # no elements, yet numpy's reshape raised "array is too big"


@pytest.fixture(scope="module")
def parts(tmp_path_factory, small_graph) -> Path:
    where = tmp_path_factory.mktemp("wire")
    write_npz(small_graph, where / "g.npz")
    assert main(["prepare", str(where / "g.npz"), "-k", "2", "--out", str(where / "parts")]) == 0
    return where / "parts"


class Job:
    """Two graph servers, a weight server and the driver, as separate processes from one cluster file;
    ``driver_first``: the driver starts alone, and the servers only when :meth:`start_servers` is called."""

    NAMES = ("gs0", "gs1", "ws0")

    def __init__(self, parts: Path, where: Path, epochs: int = 100_000, driver_first: bool = False):
        where.mkdir()
        d, g0, g1, w0 = free_ports(4)
        self.addresses = {"driver": f"tcp://127.0.0.1:{d}", "gs0": f"tcp://127.0.0.1:{g0}",
                          "gs1": f"tcp://127.0.0.1:{g1}", "ws0": f"tcp://127.0.0.1:{w0}"}
        cluster = {"driver": self.addresses["driver"], "graph_servers": [self.addresses["gs0"], self.addresses["gs1"]],
                   "weight_servers": [self.addresses["ws0"]]}
        (where / "cluster.json").write_text(json.dumps(cluster))
        self.where, self.run = where, where / "run"
        self.env = dict(os.environ, DORYLUS_KEY=KEY.hex(), PYTHONUNBUFFERED="1", DORYLUS_MAX_MESSAGE_MB=str(CAP_MB))
        self.logs = {name: open(where / f"{name}.log", "w") for name in (*self.NAMES, "driver")}
        self.cli = [sys.executable, "-m", "dorylus_py"]
        self.servers: dict[str, subprocess.Popen] = {}
        self.driver = subprocess.Popen([*self.cli, "train", "--backend", "cpu", "--cluster", str(where / "cluster.json"),
                                        "--data", str(parts), "--epochs", str(epochs), "--chunks", "2", "--quiet",
                                        "--out", str(self.run)], env=self.env, stdout=self.logs["driver"],
                                       stderr=subprocess.STDOUT)
        if not driver_first:
            self.start_servers()

    def start_servers(self) -> None:
        cluster = self.where / "cluster.json"
        for name, role, rank in [("gs1", "graph-server", 1), ("ws0", "weight-server", 0)]:
            self.servers[name] = subprocess.Popen([*self.cli, role, "--cluster", str(cluster), "--rank", str(rank), "--jobs", "1"],
                                                  env=self.env, stdout=self.logs[name], stderr=subprocess.STDOUT)
        self.servers["gs0"] = subprocess.Popen(insider.command(cluster, 0, 1),  # it tells us the nonce, as a task event would
                                               env=insider.environment(self.env, self.where / "nonce"),
                                               stdout=self.logs["gs0"], stderr=subprocess.STDOUT)

    def epochs(self) -> int:
        metrics = self.run / "metrics.jsonl"
        return len(metrics.read_text().splitlines()) if metrics.exists() else 0

    def trains_on(self, epochs: int = 2, timeout_s: float = 300) -> None:
        """Every process runs, and the job trains ``epochs`` more."""
        target, deadline = self.epochs() + epochs, time.monotonic() + timeout_s
        while self.epochs() < target:
            for name, p in [*self.servers.items(), ("driver", self.driver)]:
                assert p.poll() is None, f"{name} exited {p.returncode}: {self.log(name)[-3000:]}"
            assert time.monotonic() < deadline, f"the job did not reach epoch {target}"
            time.sleep(0.2)

    def nonce(self) -> bytes:
        return insider.nonces(self.where / "nonce")[0]

    def rss_mb(self, name: str) -> float:
        status = Path(f"/proc/{self.servers[name].pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status)[1]) / 1024

    def finish(self, interrupted: bool, timeout_s: float = 300) -> None:
        try:
            if interrupted:
                self.driver.send_signal(signal.SIGINT)  # Ctrl-C: the driver stops every server
            assert self.driver.wait(timeout=timeout_s) == (130 if interrupted else 0), self.log("driver")[-3000:]
            for name, p in self.servers.items():
                assert p.wait(timeout=60) == 0, self.log(name)[-3000:]
        finally:
            for p in [*self.servers.values(), self.driver]:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for f in self.logs.values():
                f.close()

    def log(self, name: str) -> str:
        return (self.where / f"{name}.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def job(parts, tmp_path_factory):
    live = Job(parts, tmp_path_factory.mktemp("live") / "job")
    try:
        live.trains_on(1)
        yield live
    except BaseException:
        live.finish(interrupted=True)
        raise
    live.finish(interrupted=True)


def forged(header: dict, *data: bytes, to: str, job: bytes, sender: bytes | None = None, ahead_s: float = 0.0) -> list:
    """Frames a key holder could make: ``header`` and ``data`` as they are, signed for ``to`` and ``job``
    (b"": for no job), from ``sender`` (a fresh id if None), stamped ``ahead_s`` ahead of the clock."""
    session = Session(KEY, job=job)
    if sender is not None:
        session.id = sender
    fixed = _FIXED.pack(MAGIC, session.id, 1, int((time.time() + ahead_s) * 1e6))
    fields = dict(header)
    op, specs = fields.pop("op"), [[t["name"], t["dtype"], t["shape"]] for t in fields.pop("tensors", [])]
    raw = forge.header(op, specs, **fields)  # as Session.encode writes it
    return [fixed + session._mac(fixed, to, raw, list(data)), raw, *data]


def dealer(address: str) -> zmq.Socket:
    """A key holder's connection: past the job's PLAIN gate."""
    sock = gated_dealer(zmq.Context.instance(), address, Plain.of_job(KEY), linger_ms=10_000)  # sent before close
    sock.setsockopt(zmq.SNDTIMEO, 60_000)
    return sock


def ping(address: str, nonce: bytes, sock: zmq.Socket | None = None, timeout_s: float = 30) -> Message | None:
    """An honest ping from a fresh session (on ``sock``, or a fresh connection): the reply, or None."""
    session = Session(KEY, job=nonce)
    own = sock is None
    sock = dealer(address) if own else sock
    try:
        sock.send_multipart(session.encode(Message("ping", {"req": "honest"}), address))
        deadline = time.monotonic() + timeout_s
        while sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            reply = session.decode(sock.recv_multipart(), session.id)
            if reply.get("req") == "honest":
                return reply
        return None
    finally:
        if own:
            sock.close()


class KeylessPeer:
    """A raw ZMTP 3.0 peer without the job key: the NULL mechanism (no credentials), or PLAIN with a
    made-up ``password``; it goes on as if let in. It streams each frame from one small buffer, so the
    attacker holds nothing itself."""

    CHUNK = bytes(MiB)

    def __init__(self, address: str, password: bytes | None = None):
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        mechanism = b"NULL" if password is None else b"PLAIN"
        greeting = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + b"\0" + bytes(31)
        metadata = b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
        if password is None:
            commands = [b"\x05READY" + metadata]
        else:
            commands = [b"\x05HELLO" + bytes([7]) + b"dorylus" + bytes([len(password)]) + password,
                        b"\x08INITIATE" + metadata]
        self.sock.sendall(greeting + b"".join(bytes([0x04, len(c)]) + c for c in commands))

    def frame(self, size: int, more: bool, withhold: int = 0) -> bool:
        """Send a frame of ``size`` bytes but the last ``withhold``; False once the server has cut us off."""
        try:
            self.sock.sendall(bytes([0x02 | more]) + struct.pack(">Q", size))
            left = size - withhold
            while left:
                n = self.sock.send(memoryview(self.CHUNK)[: min(left, MiB)])
                left -= n
            return True
        except OSError:  # reset, or the send timed out with the server no longer reading
            return False

    def close(self) -> None:
        self.sock.close()


def attack_rss(job: Job, name: str, frames: list[int], withhold: int = 0,
               password: bytes | None = None) -> tuple[float, float, bool]:
    """The server's RSS (MB) before and at most during one message of ``frames`` from a keyless peer
    (its last ``withhold`` bytes never sent), and whether the server cut the peer off."""
    idle = job.rss_mb(name)
    peer, worst, cut = KeylessPeer(job.addresses[name], password), idle, False
    try:
        for i, size in enumerate(frames):
            last = i == len(frames) - 1
            if not peer.frame(size, more=not last, withhold=withhold if last else 0):
                cut = True
                break
            worst = max(worst, job.rss_mb(name))
        for _ in range(10):  # what libzmq holds shows within a moment
            time.sleep(0.1)
            worst = max(worst, job.rss_mb(name))
    finally:
        peer.close()
    return idle, worst, cut


def test_a_tensor_too_big_for_numpy_is_refused_by_every_role(job):
    """Item 1: the empty tensor of shape [0, 2**31-1, 2**31-1, 2**31-1] killed a graph server, the weight
    server and the driver. Signed with the job key and nonce (to every role), and for no job (to the
    driver, as a hello and as another op): refused, and the job trains on."""
    nonce = job.nonce()
    spec = {"tensors": [{"name": "P", "dtype": "float32", "shape": HUGE}], "req": "r"}
    attacks = [("gs0", {"op": "result", **spec}, nonce), ("ws0", {"op": "push_grad", **spec}, nonce),
               ("driver", {"op": "epoch_stats", **spec}, nonce), ("driver", {"op": "push_grad", **spec}, b""),
               ("driver", {"op": "hello", **spec}, b"")]
    for name, header, bound in attacks:
        sock = dealer(job.addresses[name])
        try:
            sock.send_multipart(forged(header, b"", to=job.addresses[name], job=bound))
            if name != "driver":  # authentic but malformed: an error comes back, naming the shape
                assert sock.poll(30_000), f"{name} did not answer"
                assert b"larger than a frame" in sock.recv_multipart()[1]
        finally:
            sock.close()
    job.trains_on(2)
    assert "signed for no job" in job.log("driver")  # refused before a replay slot or any parsing


def test_a_keyless_peer_is_cut_off_before_its_first_frame(job):
    """Item 3: 4 frames over the cap (64 MiB each, the issue's 4 x 954 MiB scaled down), whole or with
    the last byte withheld, and 12 frames each under the cap with the last byte withheld (144 MiB, which
    libzmq would hold unseen until the message ends: the attack left open in round 3 without CURVE),
    from a peer without the job key (NULL, or PLAIN with a made-up password): each is cut off in the
    handshake, and the server's RSS stays within 100 MB of idle."""
    attacks = [([4 * CAP_MB * MiB] * 4, 0), ([4 * CAP_MB * MiB] * 4, 1), ([CAP_MB * MiB * 3 // 4] * 12, 1)]
    for name in ("gs0", "ws0"):
        for password in (None, b"a" * 40):
            for frames, withhold in attacks:
                idle, worst, cut = attack_rss(job, name, frames, withhold, password)
                assert cut and worst - idle < 100, (name, password, withhold, idle, worst)
    job.trains_on(2)
    assert ping(job.addresses["ws0"], job.nonce()) is not None
    assert "wrong password" in job.log("gs0") and "wrong password" in job.log("ws0")


def test_a_key_holder_over_the_cap_is_dropped(job):
    """Item 3: past the gate, a signed message of frames each under the cap but over it together is read
    and let go frame by frame, and its peer dropped: the same connection's honest ping is not answered, a
    fresh connection's is; the server's RSS stays within 100 MB of idle."""
    nonce = job.nonce()
    for name in ("gs0", "ws0"):
        to, idle = job.addresses[name], job.rss_mb(name)
        sock = dealer(to)
        try:
            part = bytes(CAP_MB * MiB * 3 // 4)
            sock.send_multipart(forged({"op": "ping", "req": "big"}, *[part] * 4, to=to, job=nonce))
            deadline = time.monotonic() + 30
            while "dropped as it came" not in job.log(name):
                assert time.monotonic() < deadline, job.log(name)[-2000:]
                time.sleep(0.1)
            assert job.rss_mb(name) - idle < 100, name
            if name == "ws0":  # the one that answers pings
                assert ping(to, nonce, sock, timeout_s=3) is None
        finally:
            sock.close()
    assert ping(job.addresses["ws0"], nonce) is not None
    job.trains_on(1)


def test_a_flood_of_senders_stamped_ahead_locks_no_one_out(job):
    """Item 4: 70,000 sender ids stamped 110 s ahead (more than the guard's 65,536 slots) lifted its floor
    into the future, and no new sender was answered. Now a fresh honest sender is, and the refusals are
    warned about (at most once a second)."""
    nonce, to = job.nonce(), job.addresses["ws0"]
    sock = dealer(to)
    try:
        for i in range(70_000):
            sock.send_multipart(forged({"op": "ping", "req": "flood"}, to=to, job=nonce, sender=i.to_bytes(16, "big"),
                                       ahead_s=110))
            while sock.poll(0):
                sock.recv_multipart()
        assert ping(to, nonce, timeout_s=120) is not None  # the flood is read first: a while on two cores
    finally:
        sock.close()
    assert re.search(r"replay guard refused \d+ messages .*ahead", job.log("ws0"))
    job.trains_on(1)


@pytest.mark.long
def test_a_driver_flooded_before_its_servers_come_still_starts_them(parts, tmp_path):
    """Item 4, at the driver, which takes a hello signed for no job from any key holder: 70,000 hellos
    stamped 110 s ahead came before the servers; their own hellos were then refused until the clock
    passed the flood's stamps (about 100 s after it ended). Now the servers start as soon as the driver
    has read the flood, and the job finishes."""
    job = Job(parts, tmp_path / "job", epochs=2, driver_first=True)
    try:
        to = job.addresses["driver"]
        sock = dealer(to)
        try:  # a name no server of the job has: claiming a real one first is another matter (docs/architecture.md)
            hello = {"op": "hello", "tensors": [], "role": "graph-server", "rank": 99, "address": "tcp://127.0.0.1:9"}
            for i in range(70_000):  # as fast as the driver reads them (the socket's queue is short)
                sock.send_multipart(forged(hello, to=to, job=b"", sender=i.to_bytes(16, "big"), ahead_s=110))
        finally:
            sock.close()
        flood_over = time.monotonic()
        job.start_servers()
        while "graph server 0 start" not in job.log("gs0"):  # its hello was answered: it got its start
            assert time.monotonic() - flood_over < 60, job.log("driver")[-3000:]
            time.sleep(0.5)
    except BaseException:
        job.finish(interrupted=True)
        raise
    job.finish(interrupted=False)
    assert re.search(r"replay guard refused \d+ messages .*ahead", job.log("driver"))
