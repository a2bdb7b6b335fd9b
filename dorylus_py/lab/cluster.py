"""A multi-machine job on one box: hosts on a private bridge, the job's keys and cluster file, every
role started on its host the way a real machine starts it, and one call that takes it all down.

A :class:`Placement` says which host runs what: the driver, each weight and graph server, and the
Lambda service (``lambda_service.py``), if the job uses ``--backend lambda``. :class:`LabCluster` makes
the network (``network.py``), writes ``keys/`` (``dorylus keys gen``) and ``cluster.json`` (each
process at its host's address), and starts each server, and the Lambda service, on its host under
the supervisor (``supervisor.py``, as systemd would: restarted when it exits non-zero), each with the
environment a real machine would give it: the job key in ``DORYLUS_KEY``, and on every host the
lab's own AWS-style access key pair, which the Lambda service accepts and nothing else knows. The driver
(:meth:`LabCluster.train`) is the operator's command, run on its host without a supervisor. Logs go to
``WORKDIR/logs/ROLE.log``. Everything runs in the hosts' namespaces, so :meth:`LabCluster.down` (and
leaving the ``with`` block, failed or not) kills it all with the network.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dorylus_py import children
from dorylus_py.keygen import JOB, SECRET, generate
from dorylus_py.lab.lambda_service import Function
from dorylus_py.lab.network import LabError, Network, clean_leftovers
from dorylus_py.timescale import scaled

PORTS = {"driver": 7000, "graph-server": 7100, "weight-server": 7200, "lambda-service": 9000}
REGION = "us-east-1"
_AWS_CHAIN = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_LAMBDA", "AWS_ROLE_ARN",
              "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI")


@dataclass(frozen=True)
class Placement:
    """Which host runs what (a host may run several roles)."""

    driver: str
    graph_servers: list[str]  # the host of each rank
    weight_servers: list[str]
    lambda_service: str = ""  # "": no Lambda service (a cpu or local job)

    @classmethod
    def standard(cls, graph_servers: int, lambda_service: bool = True) -> "Placement":
        """Host a: the driver and a weight server; b, c, ...: a graph server each; then the Lambda host."""
        hosts = [chr(ord("b") + k) for k in range(graph_servers + 1)]
        return cls("a", hosts[:graph_servers], ["a"], hosts[graph_servers] if lambda_service else "")

    def hosts(self) -> list[str]:
        every = [self.driver, *self.weight_servers, *self.graph_servers, *([self.lambda_service] * bool(self.lambda_service))]
        return list(dict.fromkeys(every))

    def roles(self) -> dict[str, str]:
        """Every supervised role (``graph-server-0``, ``lambda-service``, ...) and its host."""
        out = {f"weight-server-{w}": h for w, h in enumerate(self.weight_servers)}
        out |= {f"graph-server-{k}": h for k, h in enumerate(self.graph_servers)}
        return out | ({"lambda-service": self.lambda_service} if self.lambda_service else {})


@dataclass
class LabCluster:
    workdir: Path
    placement: Placement
    links: list = field(default_factory=list)
    curve: bool = True  # CurveZMQ (and ZAP) on every connection
    function: Function = field(default_factory=Function)  # the Lambda service's function
    restart_s: float = 1.0  # the supervisors' RestartSec
    extra_hosts: list = field(default_factory=list)  # hosts that run no role (a hostile one, say)
    groups: dict = field(default_factory=dict)  # host -> its CPU group (cgroups.py), for a scale model

    def __post_init__(self):
        self.workdir = Path(self.workdir)
        self.net = Network(self.placement.hosts() + list(self.extra_hosts), self.links)
        self.supervisors: dict[str, subprocess.Popen] = {}
        self._aws = {"AWS_ACCESS_KEY_ID": "AKIDLAB" + secrets.token_hex(6).upper(),
                     "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30)}

    # --- lifetime -------------------------------------------------------------------------------------

    def __enter__(self) -> "LabCluster":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        """Make the network, keys and cluster file, and start every server and the Lambda service."""
        clean_leftovers()
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.net.up()
        try:
            self._write_keys()
            self._write_cluster_file()
            self.start_servers()
        except BaseException:
            self.down()
            raise

    def down(self) -> None:
        """Stop the services (their supervisors get SIGTERM, as at a shutdown), then kill whatever is left
        with the hosts and remove the network. Safe to call twice."""
        self.stop_services()
        self.net.down()

    # --- files ----------------------------------------------------------------------------------------

    def _write_keys(self) -> None:
        keys = self.workdir / "keys"
        self.public_key = generate(keys, overwrite=True).decode()
        self.job_key = (keys / JOB).read_text().strip()

    def address(self, role: str, rank: int = 0) -> str:
        host = {"driver": self.placement.driver, "lambda-service": self.placement.lambda_service,
                "graph-server": (self.placement.graph_servers + [""])[rank],
                "weight-server": (self.placement.weight_servers + [""])[rank]}[role]
        return f"{self.net.ips[host]}:{PORTS[role] + rank}"

    @property
    def cluster_file(self) -> Path:
        return self.workdir / "cluster.json"

    def _write_cluster_file(self) -> None:
        p = self.placement
        spec = {"driver": f"tcp://{self.address('driver')}",
                "graph_servers": [f"tcp://{self.address('graph-server', k)}" for k in range(len(p.graph_servers))],
                "weight_servers": [f"tcp://{self.address('weight-server', w)}" for w in range(len(p.weight_servers))]}
        if self.curve:
            spec |= {"curve_public_key": self.public_key, "curve_secret_key_file": str(self.workdir / "keys" / SECRET)}
        if p.lambda_service:
            spec |= {"lambda_function": self.function.name, "region": REGION}
        self.cluster_file.write_text(json.dumps(spec, indent=1) + "\n")

    # --- processes ------------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """What every host's processes get: the job key, the lab's AWS key pair, and nothing of this
        machine's AWS settings."""
        env = children.env({k: v for k, v in os.environ.items() if k not in _AWS_CHAIN})
        return env | self._aws | {"DORYLUS_KEY": self.job_key, "AWS_DEFAULT_REGION": REGION, "AWS_CONFIG_FILE": "/dev/null",
                                  "AWS_SHARED_CREDENTIALS_FILE": "/dev/null", "AWS_EC2_METADATA_DISABLED": "true",
                                  "PYTHONUNBUFFERED": "1"}

    def command(self, role: str) -> list[str]:
        kind, _, rank = role.rpartition("-")
        if role == "lambda-service":
            f = self.function
            return children.module("dorylus_py.lab.lambda_service", "--listen", self.address(role), "--function",
                                   f.name, "--region", REGION, "--concurrency", f.concurrency, "--memory-mb", f.memory_mb,
                                   "--timeout-s", scaled(f.timeout_s), "--latency-ms", scaled(f.latency_ms),
                                   "--cold-start-ms", scaled(f.cold_start_ms), "--fail-rate", f.fail_rate)
        return children.module("dorylus_py", kind, "--cluster", self.cluster_file, "--rank", rank)

    def preexec(self, host: str):
        """What puts a process started on ``host`` into the host's CPU group (None: no groups)."""
        return self.groups[host].preexec() if host in self.groups else None

    def host_of(self, role: str) -> str:
        return self.placement.roles()[role]

    def start(self, role: str) -> None:
        """Start ``role`` on its host under a supervisor (as systemd starts it at boot)."""
        argv = children.module("dorylus_py.lab.supervisor", "--name", role, "--restart-s", scaled(self.restart_s), "--",
                               *self.command(role))
        with open(self.workdir / "logs" / f"{role}.log", "ab") as out:
            self.supervisors[role] = self.net.popen(self.host_of(role), argv, env=self.env(), stdout=out,
                                                    stderr=subprocess.STDOUT, start_new_session=True,
                                                    preexec_fn=self.preexec(self.host_of(role)))

    def start_servers(self) -> None:
        """Start every role whose supervisor is not running (all at :meth:`up`; the servers again for the
        next job, since a server's supervisor ends with it when its job ends well)."""
        for role in self.placement.roles():
            if role not in self.supervisors or self.supervisors[role].poll() is not None:
                self.start(role)

    def boot(self, host: str) -> None:
        """Start every role of ``host`` again (after :meth:`kill_host`: the machine came back)."""
        for role, where in self.placement.roles().items():
            if where == host:
                self.start(role)

    def kill_host(self, host: str) -> None:
        """Every process on ``host`` killed at once, its supervisors included (a power cut)."""
        self.net.kill_host(host)
        for role, where in self.placement.roles().items():
            if where == host and role in self.supervisors:
                self.supervisors.pop(role).wait(timeout=10)

    def stop_services(self, timeout_s: float = 20.0) -> None:
        for proc in self.supervisors.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.supervisors.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.supervisors.clear()

    def wait_listening(self, timeout_s: float = 120.0) -> None:
        """Wait until every supervised role listens on its address (servers bind before the driver starts)."""
        deadline = time.monotonic() + scaled(timeout_s)
        for role in self.placement.roles():
            kind, _, rank = role.rpartition("-")
            ip, port = self.address(*((role, 0) if role == "lambda-service" else (kind, int(rank)))).split(":")
            while not self.net.listening(self.host_of(role), ip, int(port)):
                if time.monotonic() > deadline:
                    raise LabError(f"{role} does not listen on {ip}:{port} after {timeout_s:.0f} s "
                                   f"(log: {self.workdir / 'logs' / (role + '.log')})")
                time.sleep(0.1)

    def pid_of(self, role: str) -> int | None:
        """The pid of the process ``role`` runs now (its supervisor's child), or None."""
        sup = self.supervisors.get(role)
        if sup is None:
            return None
        try:
            children = Path(f"/proc/{sup.pid}/task/{sup.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def usage(self) -> dict[str, tuple[float, int]]:
        """Each running role's resident memory (MiB) and open file descriptors, now (its supervisor's child)."""
        out = {}
        for role in list(self.supervisors):
            pid = self.pid_of(role)
            try:
                rss_kb = int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                                  if line.startswith("VmRSS:")))
                out[role] = (rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd")))
            except (OSError, StopIteration, TypeError):
                continue  # between two lives, or gone
        return out

    @contextmanager
    def peak_usage(self, every_s: float = 0.25):
        """Yield a dict that holds, once the block ends, each role's peak memory (MiB) and open fds seen
        while it ran (sampled every ``every_s`` on a thread)."""
        peaks: dict[str, tuple[float, int]] = {}
        done = threading.Event()

        def sample() -> None:
            while not done.wait(every_s):
                for role, (mb, fds) in self.usage().items():
                    old = peaks.get(role, (0.0, 0))
                    peaks[role] = (max(old[0], mb), max(old[1], fds))

        thread = threading.Thread(target=sample, name="usage", daemon=True)
        thread.start()
        try:
            yield peaks
        finally:
            done.set()
            thread.join(timeout=5)

    # --- the operator's command -------------------------------------------------------------------------

    def lambda_flags(self) -> list[str]:
        if not self.placement.lambda_service:
            raise LabError("this lab has no Lambda service (Placement.lambda_service)")
        return ["--backend", "lambda", "--lambda-endpoint", f"http://{self.address('lambda-service')}"]

    def train_argv(self, data: str | Path, out: str | Path, flags: list[str]) -> list[str]:
        return children.module("dorylus_py", "train", "--cluster", self.cluster_file, "--data", data, "--out", out,
                               "--quiet", *flags)

    def start_train(self, data, out, flags: list[str], **popen) -> subprocess.Popen:
        """``dorylus train --cluster ...`` on the driver's host; output to ``WORKDIR/logs/driver.log``
        unless ``popen`` says otherwise."""
        if "stdout" not in popen:
            popen["stdout"] = open(self.workdir / "logs" / "driver.log", "ab")
            popen["stderr"] = subprocess.STDOUT
        try:
            return self.net.popen(self.placement.driver, self.train_argv(data, out, flags), env=self.env(),
                                  preexec_fn=self.preexec(self.placement.driver), **popen)
        finally:
            if hasattr(popen["stdout"], "close"):
                popen["stdout"].close()

    def train(self, data, out, flags: list[str], timeout_s: float = 600, **popen) -> int:
        """Run a job to its end; its exit code (the driver's log: ``WORKDIR/logs/driver.log``)."""
        proc = self.start_train(data, out, flags, **popen)
        try:
            return proc.wait(timeout=scaled(timeout_s))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise LabError(f"the job did not end within {timeout_s:.0f} s (logs: {self.workdir / 'logs'})") from None

    def log(self, role: str) -> str:
        path = self.workdir / "logs" / f"{role}.log"
        return path.read_text(errors="replace") if path.exists() else ""
