"""The lab's pieces without a job: hosts on a private bridge (reachable from each other only), links
shaped as declared, a cable pulled, a host killed whole, and nothing left behind; the supervisor."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from dorylus_py.errors import ConfigError
from dorylus_py.lab.network import Network, clean_leftovers, namespaces
from dorylus_py.lab.shaping import Link, loss_filter, tc_commands

PY = sys.executable


def udp_delivered(net: Network, src: str, dst: str, count: int = 2000) -> int:
    """How many of ``count`` datagrams sent from ``src`` arrive at ``dst``. After the burst the sender
    repeats an ``end`` datagram until the receiver, having got one, has answered."""
    ip = net.ips[dst]
    receiver = net.popen(dst, [PY, "-c", f"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("{ip}", 9999)); s.settimeout(60)
print("ready", flush=True); n = 0
while (data := s.recv(100)) != b"end":
    n += data == b"x"
print(n)"""], stdout=subprocess.PIPE, text=True)
    assert receiver.stdout.readline().strip() == "ready"
    sender = net.popen(src, [PY, "-c", f"""
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range({count}):
    s.sendto(b"x", ("{ip}", 9999)); time.sleep(0.0002)  # (not so fast that a socket buffer overflows)
while True:
    s.sendto(b"end", ("{ip}", 9999)); time.sleep(0.02)"""])
    try:
        return int(receiver.communicate(timeout=60)[0].strip())
    finally:
        sender.kill()
        sender.wait(timeout=10)


@pytest.mark.lab
def test_hosts_reach_each_other_only_and_leave_nothing_behind():
    before = set(namespaces())
    root_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.count("\n")
    with Network(["a", "b"]) as net:
        assert set(namespaces()) - before == {net.ns("a"), net.ns("b"), net.bridge_ns}
        ping = [PY, "-c", f"import socket; socket.create_connection(('{net.ips['b']}', 22), timeout=5)"]
        assert b"ConnectionRefused" in subprocess.run(net.argv("a", ping), capture_output=True).stderr  # b answered
        routes = subprocess.run(net.argv("a", ["ip", "route"]), capture_output=True, text=True).stdout
        assert routes.strip() == f"198.51.100.0/24 dev eth0 proto kernel scope link src {net.ips['a']}"  # no way out
        sleeper = net.popen("b", ["sleep", "600"])
        deadline = time.monotonic() + 10  # `ip netns exec` enters the namespace after it is started
        while not net.pids("b") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert net.pids("b") == [sleeper.pid]
        net.kill_host("b")
        assert sleeper.wait(timeout=10) == -9 and net.pids("b") == []
        # the machine's own namespace gained no interface
        assert subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.count("\n") == root_links
    assert set(namespaces()) == before


@pytest.mark.lab
def test_declared_loss_and_a_pulled_cable_are_what_the_packets_see():
    with Network(["a", "b", "c"], [Link("a", "b", loss_pct=50)]) as net:
        assert 600 < udp_delivered(net, "a", "b") < 1400  # half of 2000, give or take 9 standard deviations
        assert udp_delivered(net, "a", "c") > 1900  # another peer of a: not shaped
        assert udp_delivered(net, "b", "a") < 1400  # both directions
        net.shape([Link("a", "b", rate_mbit=200)])
        classes = subprocess.run(net.argv("a", ["tc", "class", "show", "dev", "eth0"]), capture_output=True, text=True).stdout
        assert "rate 200Mbit" in classes and udp_delivered(net, "a", "b") > 1900  # no loss declared any more
        net.set_cable("b", False)
        probe = [PY, "-c", f"import socket; socket.create_connection(('{net.ips['b']}', 22), timeout=2)"]
        assert b"timed out" in subprocess.run(net.argv("a", probe), capture_output=True, timeout=60).stderr
        net.set_cable("b", True)
        assert b"ConnectionRefused" in subprocess.run(net.argv("a", probe), capture_output=True, timeout=60).stderr


@pytest.mark.lab
def test_leftovers_of_a_dead_maker_are_cleaned_up_and_a_live_ones_are_not():
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"dlab-{dead.pid}-0-a"  # as if made by a process that is gone
    subprocess.run(["ip", "netns", "add", name], check=True)
    with Network(["a"]) as net:
        assert name in clean_leftovers() and net.ns("a") in namespaces()
    assert name not in namespaces()


def test_links_become_tc_commands():
    ips = {"a": "198.51.100.10", "b": "198.51.100.11", "c": "198.51.100.12"}
    cmds = [" ".join(c) for c in tc_commands("a", "eth0", ips, [Link("a", "b", 200, 1, 2), Link("b", "c", 10)], netem=True)]
    assert cmds[0] == "qdisc add dev eth0 root handle 1: htb default 1"
    assert "class add dev eth0 parent 1: classid 1:a htb rate 200000kbit quantum 200000" in cmds
    assert "qdisc add dev eth0 parent 1:a handle a: netem delay 1ms limit 100000" in cmds
    assert "filter add dev eth0 parent 1: protocol ip prio 2 u32 match ip dst 198.51.100.11/32 flowid 1:a" in cmds
    assert not any("198.51.100.12" in c for c in cmds)  # b-c is not a's business
    assert not any("netem" in " ".join(c) for c in tc_commands("a", "eth0", ips, [Link("a", "b", delay_ms=1)], netem=False))
    assert tc_commands("c", "eth0", ips, [Link("a", "b")], netem=True) == []
    assert loss_filter("198.51.100.11", 100).endswith("53 1 0 4294967295,6 0 0 2,6 0 0 4294967295")
    assert Link.parse("a:d:200:1") == Link("a", "d", 200.0, 1.0)
    for bad, message in [("a", "expected A:B"), ("a:b:fast", "must be numbers")]:
        with pytest.raises(ConfigError, match=message):
            Link.parse(bad)
    with pytest.raises(ConfigError, match="no host 'z'"):
        Network(["a", "b"], [Link("a", "z")])
    with pytest.raises(ConfigError, match="host name"):
        Network(["A"])


def test_the_supervisor_restarts_a_failing_service_and_gives_up_after_its_burst(tmp_path):
    count = tmp_path / "starts"
    fails_twice = [PY, "-c", f"import pathlib, sys; p = pathlib.Path('{count}'); n = int(p.read_text() or 0) + 1 "
                             f"if p.exists() else 1; p.write_text(str(n)); sys.exit(0 if n == 3 else 1)"]
    done = subprocess.run([PY, "-m", "dorylus_py.lab.supervisor", "--name", "svc", "--restart-s", "0", "--", *fails_twice],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and count.read_text() == "3"
    assert done.stderr.count("exited with code 1") == 2 and "exited with code 0" in done.stderr
    always = [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    done = subprocess.run([PY, "-m", "dorylus_py.lab.supervisor", "--restart-s", "0", "--burst", "2", "--", *always],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.count("killed by signal 9") == 3 and "giving up" in done.stderr


def test_the_supervisor_stops_its_service_on_sigterm(tmp_path):
    sup = subprocess.Popen([PY, "-m", "dorylus_py.lab.supervisor", "--", "sleep", "600"], stderr=subprocess.PIPE, text=True)
    assert "started (pid" in sup.stderr.readline()
    sup.terminate()
    assert sup.wait(timeout=30) == 0 and "killed by signal 15" in sup.stderr.read()


def test_the_lab_command_refuses_bad_input_in_one_line(lab_data, tmp_path, capsys):
    from dorylus_py.lab.__main__ import main

    assert main(["run", "--data", str(lab_data), "--out", str(tmp_path / "run"), "--link", "a:z:100",
                 "--workdir", str(tmp_path / "lab")]) == 2
    assert capsys.readouterr().err == "error: link a-z: no host 'z' (hosts: a, b, c, d)\n"
    assert main(["run", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not (tmp_path / "run").exists() and not (tmp_path / "lab").exists()
