"""The servers as their boot script makes them: the files it writes, the systemd unit it starts, and
that unit run here under a supervisor that restarts it as systemd would.

A server's user data (``infra/templates/server.sh.tftpl``, rendered by Terraform) writes files with
``cat > PATH <<'TAG'`` and a unit whose ``ExecStart`` runs ``/opt/dorylus/bin/dorylus``. Here the
paths it names live under a folder of this machine (``Host.root``), the cluster file's 10.x.y.z
addresses become 127.N.y.z (loopback serves all of 127/8; N differs per rehearsal), and the process
gets the unit's environment plus the instance role's credentials, as the metadata service would
hand them out. ``User=`` and the sandboxing directives are checked, not applied (that needs systemd).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from dorylus_py.errors import DorylusError


def heredoc(script: str, path: str) -> str:
    """What ``script`` writes to ``path`` with ``cat > path <<'TAG'`` (quoted: written verbatim)."""
    found = re.search(rf"^cat > {re.escape(path)} <<'(\w+)'\n(.*?)\n\1$", script, re.M | re.S)
    if found is None:
        raise ValueError(f"the boot script writes no {path}")
    return found.group(2)


@dataclass
class Unit:
    """A systemd service unit's ``[Service]`` settings that matter here."""

    directives: dict[str, list[str]]

    @classmethod
    def parse(cls, text: str) -> "Unit":
        directives: dict[str, list[str]] = {}
        for line in text.splitlines():
            if "=" in line and not line.startswith(("#", "[")):
                key, _, value = line.partition("=")
                directives.setdefault(key.strip(), []).append(value.strip())
        return cls(directives)

    def one(self, key: str, default: str = "") -> str:
        return self.directives.get(key, [default])[-1]

    @property
    def exec_start(self) -> list[str]:
        return shlex.split(self.one("ExecStart"))

    @property
    def environment(self) -> dict[str, str]:
        return dict(pair.split("=", 1) for line in self.directives.get("Environment", []) for pair in shlex.split(line))

    @property
    def writable(self) -> list[str]:
        return [p for line in self.directives.get("ReadWritePaths", []) for p in line.split()]

    def restarts_after(self, code: int) -> bool:
        """Whether systemd starts the service again after it exits with ``code`` (Restart=)."""
        policy = self.one("Restart", "no")
        return policy == "always" or (policy in ("on-failure", "on-abnormal") and code != 0)


def loopback(address: str, net: int) -> str:
    """``tcp://10.a.b.c:P`` -> ``tcp://127.net.b.c:P``: the same layout, on this machine's loopback."""
    return re.sub(r"//10\.\d+\.(\d+)\.(\d+):", rf"//127.{net}.\1.\2:", address)


def loopback_cluster(cluster: dict, net: int) -> dict:
    out = dict(cluster)
    out["driver"] = loopback(cluster["driver"], net)
    for key in ("graph_servers", "weight_servers"):
        out[key] = [loopback(a, net) for a in cluster[key]]
    return out


@dataclass
class Host:
    """One server instance: its root folder (``/`` of the instance) and its rendered user data."""

    name: str
    root: Path
    user_data: str
    net: int
    exits: list[int] = field(default_factory=list)  # every exit code of its server, in order

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def boot(self) -> "Unit":
        """Write what the boot script writes (the cluster file on loopback, the environment file, the
        unit) under ``root``; the unit to start."""
        for target in ("/etc/dorylus/cluster.json", "/etc/dorylus/env", "/etc/profile.d/dorylus.sh",
                       "/etc/systemd/system/dorylus.service"):
            text = heredoc(self.user_data, target)
            if target.endswith("cluster.json"):
                text = json.dumps(loopback_cluster(json.loads(text), self.net), indent=2)
            self.path(target).parent.mkdir(parents=True, exist_ok=True)
            self.path(target).write_text(text + "\n")
        home = self.path("/var/lib/dorylus")
        home.mkdir(parents=True, exist_ok=True)  # useradd --create-home
        return Unit.parse(self.path("/etc/systemd/system/dorylus.service").read_text())

    def command(self, unit: Unit) -> list[str]:
        """ExecStart, with every absolute path it names moved under ``root``."""
        return [str(self.path(a)) if a.startswith("/") else a for a in unit.exec_start]

    def environment(self, unit: Unit, base: dict[str, str], credentials: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if not k.startswith(("AWS_", "DORYLUS_"))}
        for line in self.path(unit.one("EnvironmentFile")).read_text().splitlines():
            if "=" in line:
                key, _, value = line.partition("=")
                env[key] = value
        env.update({k: str(self.path(v)) if v.startswith("/") else v for k, v in unit.environment.items()})
        return env | credentials


class Supervisor:
    """Runs ``command`` and starts it again after each exit the unit's ``Restart=`` covers, after
    ``RestartSec``, until ``stop()``: what systemd does for the service."""

    def __init__(self, host: Host, unit: Unit, command: list[str], env: dict[str, str], log: Path):
        self.host, self.unit, self.command, self.env, self.log = host, unit, command, env, log
        self.delay_s = float(unit.one("RestartSec", "0").rstrip("s") or 0)
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._run, name=f"supervise-{host.name}", daemon=True)

    def start(self) -> "Supervisor":
        self._thread.start()
        return self

    def _run(self) -> None:
        cwd = self.host.path(self.unit.one("WorkingDirectory", "/"))
        with open(self.log, "ab") as log:
            while not self._stop.is_set():
                self._proc = subprocess.Popen(self.command, env=self.env, cwd=cwd, stdout=log, stderr=log)
                code = self._proc.wait()
                self.host.exits.append(code)
                if self._stop.is_set() or not self.unit.restarts_after(code):
                    return
                self._stop.wait(self.delay_s)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 20.0) -> None:
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()  # systemctl stop: SIGTERM, then SIGKILL
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self._thread.join(timeout_s)


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise DorylusError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.2)
