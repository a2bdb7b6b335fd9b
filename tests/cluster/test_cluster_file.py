"""A multi-machine job on one machine: servers started by hand from a cluster file, the driver with
--cluster, all through the CLI."""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from dorylus_py.cli import main
from dorylus_py.data import write_npz
from dorylus_py.errors import ConfigError, DorylusError
from dorylus_py.protocol.transport import Curve
from dorylus_py.serving.cluster_spec import ClusterSpec
from dorylus_py.serving.heartbeat import SILENCE_S


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def handshake(address: str, curve: Curve | None = None, within_s: float = 20.0) -> str:
    """How a ZMTP handshake with ``address`` ends, seen by a DEALER's own monitor: "ok", "refused", or
    "none" (no answer within the deadline). Plaintext against a CURVE socket is refused."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        sock.curve_publickey, sock.curve_secretkey = curve.client()
        sock.curve_serverkey = curve.server_public
    monitor = sock.get_monitor_socket()
    sock.connect(address)
    deadline = time.monotonic() + within_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not monitor.poll(int(left * 1000)):
                break
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return "ok"
            if event in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                         zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_DISCONNECTED):
                return "refused"
        return "none"
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)


def test_servers_from_a_cluster_file_with_curve_serve_job_after_job(small_graph, tmp_path, capsys):
    """The whole CLI path of a multi-machine job: keys from `dorylus keys gen`, CurveZMQ on every socket,
    each process bound to its own address from the file; the servers serve a second job (the same
    losses: nothing of the first is left in them) and stop cleanly on SIGTERM, as under systemd."""
    write_npz(small_graph, tmp_path / "g.npz")
    assert main(["prepare", str(tmp_path / "g.npz"), "-k", "2", "--out", str(tmp_path / "parts")]) == 0
    assert main(["keys", "gen", str(tmp_path / "keys")]) == 0
    public = capsys.readouterr().out.split('"curve_public_key": "')[1].split('"')[0]
    d, g0, g1, w0 = free_ports(4)
    cluster = {"driver": f"tcp://127.0.0.1:{d}", "graph_servers": [f"tcp://127.0.0.1:{g0}", f"tcp://127.0.0.1:{g1}"],
               "weight_servers": [f"tcp://127.0.0.1:{w0}"], "curve_public_key": public,
               "curve_secret_key_file": str(tmp_path / "keys" / "server.key_secret")}
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    key = (tmp_path / "keys" / "job.key").read_text().strip()
    env = dict(os.environ, DORYLUS_KEY=key)
    servers = [subprocess.Popen([sys.executable, "-m", "dorylus_py", role, "--cluster", str(tmp_path / "cluster.json"),
                                 "--rank", str(rank)], env=env, stderr=subprocess.PIPE, text=True)
               for role, rank in [("graph-server", 0), ("graph-server", 1), ("weight-server", 0)]]
    runs = []
    try:
        os.environ["DORYLUS_KEY"] = key
        for job in ("run1", "run2"):
            code = main(["train", "--data", str(tmp_path / "parts"), "--backend", "cpu", "--cluster",
                         str(tmp_path / "cluster.json"), "--epochs", "3", "--out", str(tmp_path / job), "--quiet",
                         "--dropout", "0"])
            assert code == 0, capsys.readouterr().err
            runs.append([json.loads(line) for line in (tmp_path / job / "metrics.jsonl").read_text().splitlines()])
            assert all(p.poll() is None for p in servers)  # still serving
        # CurveZMQ really is on every server's socket: a plaintext peer is refused in the handshake, a
        # CURVE client with the job's keys is admitted (so the refusal is the mechanism, not a dead server).
        job_curve = Curve.of_job(bytes.fromhex(key), public.encode())
        for address in cluster["graph_servers"] + cluster["weight_servers"]:
            assert handshake(address) == "refused", f"{address} accepted a plaintext peer"
            assert handshake(address, job_curve) == "ok", address
        for p in servers:
            p.terminate()
        for p in servers:
            assert p.wait(timeout=30) == 0, p.stderr.read()
    finally:
        os.environ.pop("DORYLUS_KEY", None)
        for p in servers:
            p.kill()
    assert len(runs[0]) == 3 and np.isfinite(runs[0][-1]["loss"])
    assert [r["loss"] for r in runs[1]] == [r["loss"] for r in runs[0]]


def test_the_driver_binds_its_own_address_only(tmp_path, monkeypatch):
    from dorylus_py.cluster.driver_link import DriverLink

    port = free_ports(1)[0]
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"driver": f"tcp://127.0.0.1:{port}", "graph_servers": ["tcp://127.0.0.1:1"],
                                "weight_servers": ["tcp://127.0.0.1:2"]}))
    monkeypatch.setenv("DORYLUS_KEY", "cd" * 32)
    link = DriverLink(tmp_path, ClusterSpec.load(path))
    try:
        assert link.router.getsockopt(zmq.LAST_ENDPOINT).decode() == f"tcp://127.0.0.1:{port}"  # not 0.0.0.0
    finally:
        link.stop()
    monkeypatch.delenv("DORYLUS_KEY")
    with pytest.raises(DorylusError, match="no job key"):
        DriverLink(tmp_path, ClusterSpec.load(path))


@pytest.mark.parametrize("content, message", [
    ("{", "not valid JSON"),
    ('{"driver": "tcp://a:1", "graph_servers": [], "weight_servers": ["tcp://b:2"]}', "non-empty lists"),
    ('{"driver": "http://a:1", "graph_servers": ["tcp://c:3"], "weight_servers": ["tcp://b:2"]}', "not an address"),
    ('{"driver": "tcp://a:1", "graph_servers": ["tcp://a:1"], "weight_servers": ["tcp://b:2"]}', "share an address"),
])
def test_bad_cluster_files(tmp_path, content, message):
    (tmp_path / "c.json").write_text(content)
    with pytest.raises(ConfigError, match=message):
        ClusterSpec.load(tmp_path / "c.json")


def test_cluster_job_needs_a_prepared_store(small_graph, tmp_path, capsys):
    """Servers elsewhere read the partitions themselves: a raw dataset file is refused before any work."""
    from dorylus_py.data import write_npz

    write_npz(small_graph, tmp_path / "g.npz")
    (tmp_path / "c.json").write_text(
        '{"driver": "tcp://10.0.0.1:7000", "graph_servers": ["tcp://10.0.0.2:7100"], "weight_servers": ["tcp://10.0.0.3:7200"]}')
    code = main(["train", "--backend", "cpu", "--cluster", str(tmp_path / "c.json"), "--data", str(tmp_path / "g.npz"),
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "--cluster needs --data to be a folder made by `dorylus prepare`" in err
    assert not (tmp_path / "run").exists()


def test_keys_gen_and_curve_settings_in_the_cluster_file(tmp_path, capsys):
    from dorylus_py.keygen import load_curve_secret

    keys = tmp_path / "keys"
    assert main(["keys", "gen", str(keys)]) == 0
    out = capsys.readouterr().out
    public = out.split('"curve_public_key": "')[1].split('"')[0]
    assert (keys / "job.key").read_text().strip() not in out  # secrets are written, never printed
    assert oct(keys.stat().st_mode & 0o777) == "0o700"
    assert all(oct((keys / f).stat().st_mode & 0o777) == "0o600" for f in ("server.key_secret", "job.key"))
    assert len(bytes.fromhex((keys / "job.key").read_text())) == 32
    assert len(load_curve_secret(str(keys / "server.key_secret"), public)) == 40
    with pytest.raises(ConfigError, match="another key pair"):
        load_curve_secret(str(keys / "server.key_secret"), "x" * 40)
    with pytest.raises(ConfigError, match="no secret key"):
        load_curve_secret(str(keys / "server.key"), public)
    assert main(["keys", "gen", str(keys)]) == 2  # never overwritten by accident
    old = (keys / "job.key").read_text()
    assert main(["keys", "gen", str(keys), "--overwrite"]) == 0 and (keys / "job.key").read_text() != old
    (keys / "notes.txt").write_text("mine")  # --overwrite of a folder holding anything else (a home folder)
    capsys.readouterr()
    assert main(["keys", "gen", str(keys), "--overwrite"]) == 2
    assert "holds 1 file(s) that are not its keys (notes.txt)" in capsys.readouterr().err
    assert (keys / "notes.txt").read_text() == "mine" and (keys / "job.key").exists()
    (keys / "notes.txt").unlink()
    base = {"driver": "tcp://10.0.0.1:7000", "graph_servers": ["tcp://10.0.0.2:7100"], "weight_servers": ["tcp://10.0.0.3:7200"]}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(base | {"curve_public_key": public, "curve_secret_key_file": str(keys / "server.key_secret"),
                                       "key_secret": "arn:aws:secretsmanager:us-east-1:1:secret:k"}))
    spec = ClusterSpec.load(path)
    assert spec.curve_public_key == public and spec.key_secret.endswith(":k")
    for bad, message in [({"curve_public_key": public}, "go together"), ({"curve_public_key": "short", "curve_secret_key_file": "f"},
                                                                       "not a CurveZMQ public key"), ({"key_secret": 7}, "must be strings")]:
        path.write_text(json.dumps(base | bad))
        with pytest.raises(ConfigError, match=message):
            ClusterSpec.load(path)


def start_cluster_job(small_graph, tmp_path, flags=("--epochs", "100000", "--max-restarts", "0"), jobs: int = 1):
    """Servers from a cluster file and a driver, each its own process; returns them once an epoch is done."""
    write_npz(small_graph, tmp_path / "g.npz")
    assert main(["prepare", str(tmp_path / "g.npz"), "-k", "2", "--out", str(tmp_path / "parts")]) == 0
    d, g0, g1, w0 = free_ports(4)
    cluster = {"driver": f"tcp://127.0.0.1:{d}", "graph_servers": [f"tcp://127.0.0.1:{g0}", f"tcp://127.0.0.1:{g1}"],
               "weight_servers": [f"tcp://127.0.0.1:{w0}"]}
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    env = dict(os.environ, DORYLUS_KEY="ab" * 32)
    servers = {f"{role}-{rank}": subprocess.Popen(
        [sys.executable, "-m", "dorylus_py", role, "--cluster", str(tmp_path / "cluster.json"), "--rank", str(rank),
         "--bind", "127.0.0.1", "--jobs", str(jobs)], env=env, stderr=subprocess.PIPE, text=True)
        for role, rank in [("graph-server", 0), ("graph-server", 1), ("weight-server", 0)]}
    driver = subprocess.Popen([sys.executable, "-m", "dorylus_py", "train", "--data", str(tmp_path / "parts"), "--backend",
                               "cpu", "--cluster", str(tmp_path / "cluster.json"), *flags, "--out",
                               str(tmp_path / "run"), "--quiet"],  # by default a loss ends the job at once
                              env=env, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (metrics.exists() and metrics.stat().st_size):
        assert driver.poll() is None, driver.stderr.read()
        time.sleep(0.1)
    assert metrics.stat().st_size, "no epoch finished"
    return driver, servers


@pytest.mark.long
def test_servers_exit_soon_after_losing_the_driver(small_graph, tmp_path):
    """Each server notices by its heartbeat: the one line it exits with (code 3) names the driver's silence
    of SILENCE_S (6 s, well within 10), measured by the server's own clock; the waits are hang guards."""
    driver, servers = start_cluster_job(small_graph, tmp_path)
    try:
        driver.kill()
        for name, p in servers.items():
            err = p.communicate(timeout=60)[1]
            assert p.returncode == 3 and f"the driver has not answered for {SILENCE_S:.0f} s; exiting" in err, name
    finally:
        for p in [driver, *servers.values()]:
            p.kill()


@pytest.mark.long
def test_the_driver_reports_a_dead_server_soon(small_graph, tmp_path):
    """The driver notices by the heartbeats (a server of a cluster file is not its child): its one line
    names the server and the silence of SILENCE_S; then it stops the others, which exit at its word (code
    0), not by their own heartbeat's silence (code 3). The waits are hang guards."""
    driver, servers = start_cluster_job(small_graph, tmp_path)
    try:
        servers["graph-server-1"].kill()
        err = driver.communicate(timeout=120)[1]
        assert driver.returncode == 2, err[-2000:]
        last = [line.strip() for line in err.splitlines() if line.strip()][-1]
        assert last.startswith("error: graph-server-1 at tcp://127.0.0.1:"), last
        assert f"has not been heard from for {SILENCE_S:.0f} s (presumed dead); the job stops after 0 restarts" in last, last
        for name in ("graph-server-0", "weight-server-0"):
            err = servers[name].communicate(timeout=60)[1]
            assert servers[name].returncode == 0 and "has not answered" not in err, (name, err[-2000:])
    finally:
        for p in [driver, *servers.values()]:
            p.kill()

@pytest.mark.long
def test_a_lost_cluster_server_is_waited_for_and_the_job_resumes(small_graph, tmp_path, capsys):
    """A --cluster job cannot start a remote server, but the server's supervisor (systemd) does: the
    driver tells the others to drop the job, waits for every rank to say hello again, and resumes from
    the newest checkpoint; the losses are those of an undisturbed run."""
    driver, servers = start_cluster_job(small_graph, tmp_path, ["--epochs", "40", "--checkpoint-every", "1",
                                                                "--replace-timeout-s", "60", "--dropout", "0"], jobs=2)
    cluster = tmp_path / "cluster.json"
    env = dict(os.environ, DORYLUS_KEY="ab" * 32)
    try:
        servers["graph-server-1"].kill()  # its supervisor starts it again
        servers["graph-server-1"].wait(timeout=30)
        servers["graph-server-1"] = subprocess.Popen(
            [sys.executable, "-m", "dorylus_py", "graph-server", "--cluster", str(cluster), "--rank", "1",
             "--bind", "127.0.0.1", "--jobs", "1"], env=env, stderr=subprocess.PIPE, text=True)
        err = driver.communicate(timeout=300)[1]
        assert driver.returncode == 0, err[-3000:]
        assert "graph-server-1" in err and "waiting up to 60 s for every server to say hello, to resume" in err
    finally:
        for p in [driver, *servers.values()]:
            p.kill()
    resumed = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert main(["train", "--data", str(tmp_path / "parts"), "--backend", "cpu", "--epochs", "40", "--dropout", "0",
                 "--out", str(tmp_path / "straight"), "--quiet"]) == 0
    straight = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in resumed] == list(range(1, 41))
    np.testing.assert_allclose([r["loss"] for r in resumed], [r["loss"] for r in straight], rtol=1e-5)
