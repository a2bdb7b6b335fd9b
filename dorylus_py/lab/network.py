"""Hosts as network namespaces on one private bridge: a few machines' network on one box.

Each host is a namespace with one interface (``eth0``) and an address in 198.51.100.0/24 (TEST-NET-2,
RFC 5737: used by no real network); the other end of its cable is a port of a bridge that lives in a
namespace of its own, which has no address and no link to the machine's network. Nothing is created in
the machine's own namespace, so nothing there changes, and the hosts reach only each other and their
own loopback. Links are shaped on the hosts' interfaces (``shaping.py``); a cable can be pulled
(:meth:`Network.set_cable`); a host can be killed whole (:meth:`Network.kill_host`: every process in its
namespace).

Namespaces are named ``dlab-<pid>-<n>-<host>`` (``-br`` for the bridge's), the pid being the process
that made them: :func:`clean_leftovers` removes those whose maker is gone, so a killed test run leaves
nothing for long, and two runs at once never touch each other's. Needs root (``ip netns``).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import time

from dorylus_py.errors import DorylusError
from dorylus_py.lab.shaping import Link, check_host_name, tc_commands

PREFIX = "dlab"
SUBNET = "198.51.100"
BRIDGE = "br0"
DEV = "eth0"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-\d+-[a-z0-9]+$")
_serial = itertools.count()


class LabError(DorylusError):
    """The lab network could not be made or changed (not root, no iproute2, a command failed)."""


def _run(*argv: str, check: bool = True, timeout: float = 30) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise LabError(f"{argv[0]} not found (the lab needs iproute2)") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{' '.join(argv)}: no answer within {timeout:.0f} s") from None
    if check and done.returncode:
        raise LabError(f"{' '.join(argv)}: {done.stderr.strip() or f'exit code {done.returncode}'}")
    return done.stdout


def unavailable() -> str:
    """Why this machine cannot make a lab network ("" when it can)."""
    if os.geteuid() != 0:
        return "the lab makes network namespaces, which needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the lab needs iproute2 (ip, tc)"
    return ""


def namespaces() -> list[str]:
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def pids_in(ns: str) -> list[int]:
    return [int(p) for p in _run("ip", "netns", "pids", ns, check=False).split()]


def kill_namespace(ns: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process in ``ns`` until none is left (a process may fork while it is killed)."""
    deadline = time.monotonic() + timeout_s
    while pids := pids_in(ns):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise LabError(f"{ns}: processes {pids} survive SIGKILL")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _has_netem(ns: str) -> bool:
    """Whether the kernel can delay packets (``sch_netem``): tried on ``ns``'s loopback, then removed."""
    probe = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
    if subprocess.run(probe, capture_output=True).returncode:
        return False
    _run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "lo", "root", check=False)
    return True


def clean_leftovers() -> list[str]:
    """Remove the namespaces (and their processes) of labs whose maker is gone; return their names."""
    gone = [ns for ns in namespaces() if (m := _NAME.match(ns)) and not _alive(int(m.group(1)))]
    for ns in gone:
        kill_namespace(ns)
    for ns in sorted(gone, key=lambda n: n.endswith("-br")):  # the bridge last: its ports go with it
        _run("ip", "netns", "del", ns, check=False)
    return gone


class Network:
    """``hosts`` (short names) on one bridge, with ``links`` shaped. Use as a context manager, or call
    :meth:`up` and then :meth:`down`, which runs whatever happened in between."""

    def __init__(self, hosts, links=()):
        for h in hosts:
            check_host_name(h)
        if len(set(hosts)) != len(hosts) or not 1 <= len(hosts) <= 200:
            raise LabError("hosts: 1 to 200 distinct names")
        self.hosts = list(hosts)
        self.tag = f"{PREFIX}-{os.getpid()}-{next(_serial)}"
        self.ips = {h: f"{SUBNET}.{10 + i}" for i, h in enumerate(self.hosts)}
        self.links = self._checked(links)
        self.netem = False  # whether delays can be applied (the kernel has sch_netem)
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []

    def _checked(self, links) -> list[Link]:
        links = list(links)
        for link in links:
            link.check(self.hosts)
        return links

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}" if host != BRIDGE else f"{self.tag}-br"

    @property
    def bridge_ns(self) -> str:
        return self.ns(BRIDGE)

    # --- lifetime ----------------------------------------------------------------------------------

    def __enter__(self) -> "Network":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        why = unavailable()
        if why:
            raise LabError(why)
        try:
            self._make()
        except BaseException:
            self.down()
            raise

    def _make(self) -> None:
        br = self.bridge_ns
        self._add_ns(br)
        _run("ip", "-n", br, "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "-n", br, "link", "set", BRIDGE, "up")
        for host in self.hosts:
            ns = self.ns(host)
            self._add_ns(ns)
            port = self._port(host)  # made inside the namespaces: nothing appears in the machine's own
            _run("ip", "link", "add", DEV, "netns", ns, "type", "veth", "peer", "name", port, "netns", br)
            _run("ip", "-n", br, "link", "set", port, "master", BRIDGE)
            _run("ip", "-n", br, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.ips[host]}/24", "dev", DEV)
            _run("ip", "-n", ns, "link", "set", DEV, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        self.netem = _has_netem(br)
        self.shape(self.links)

    def _add_ns(self, ns: str) -> None:
        _run("ip", "netns", "add", ns)
        self._made.append(ns)

    def _port(self, host: str) -> str:
        return f"p{self.hosts.index(host)}-{host}"[:15]

    def down(self) -> None:
        """Kill every process of every host, then remove the namespaces (the cables go with them)."""
        errors = []
        for ns in self._made:
            try:
                kill_namespace(ns)
            except LabError as e:
                errors.append(str(e))
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                errors.append(f"process {p.pid} did not exit")
        for ns in sorted(self._made, key=lambda n: n == self.bridge_ns):
            _run("ip", "netns", "del", ns, check=False)
        self._made, self._procs = [], []
        if errors:
            raise LabError("; ".join(errors))

    # --- what runs on the hosts ----------------------------------------------------------------------

    def argv(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` as run on ``host`` (``ip netns exec``: the process and its children live there)."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def popen(self, host: str, argv: list[str], **kw) -> subprocess.Popen:
        """Start ``argv`` on ``host``; it is killed with the host at :meth:`down` at the latest."""
        proc = subprocess.Popen(self.argv(host, argv), **kw)
        self._procs.append(proc)
        return proc

    def pids(self, host: str) -> list[int]:
        return pids_in(self.ns(host))

    def listening(self, host: str, ip: str, port: int) -> bool:
        """Whether a process on ``host`` listens on ``ip:port`` (TCP)."""
        return bool(_run("ip", "netns", "exec", self.ns(host), "ss", "-Hltn", f"src {ip}:{port}", check=False).strip())

    def kill_host(self, host: str) -> None:
        """Every process on ``host`` killed at once, as a machine that loses power."""
        kill_namespace(self.ns(host))

    # --- the wires -----------------------------------------------------------------------------------

    def shape(self, links) -> None:
        """Shape every host's interface for ``links`` (replacing what was there)."""
        self.links = self._checked(links)
        for host in self.hosts:
            ns = self.ns(host)
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", DEV, "root", check=False)
            for cmd in tc_commands(host, DEV, self.ips, self.links, self.netem):
                _run("ip", "netns", "exec", ns, "tc", *cmd)

    def dropped(self, host: str) -> int:
        """Packets ``host``'s interface has dropped on the way out (the loss filters' work, and any queue's)."""
        stats = _run("ip", "netns", "exec", self.ns(host), "tc", "-s", "qdisc", "show", "dev", DEV, check=False)
        return sum(int(n) for n in re.findall(r"dropped (\d+)", stats.split("\nqdisc")[0]))  # the root's: all of them

    def set_cable(self, host: str, plugged: bool) -> None:
        """Pull ``host``'s cable out of the bridge (or plug it back): its packets go nowhere, its
        connections stay open, as when a switch port or a cable fails."""
        _run("ip", "-n", self.bridge_ns, "link", "set", self._port(host), "up" if plugged else "down")
