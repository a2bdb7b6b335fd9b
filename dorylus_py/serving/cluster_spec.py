"""The cluster file: where the driver, graph servers and weight servers of a multi-machine job listen.

``{"driver": "tcp://HOST:PORT", "graph_servers": ["tcp://HOST:PORT", ...], "weight_servers": [...]}``,
optionally with ``"lambda_function"`` and ``"region"`` for ``--backend lambda``, ``"key_secret"`` (the
Secrets Manager secret holding the job key; ``dorylus aws cluster-file`` writes all of these from
Terraform's outputs), and ``"curve_public_key"`` with ``"curve_secret_key_file"`` to encrypt every
connection with CurveZMQ (``dorylus keys gen DIR``). Each process binds the address the file gives it.
Each server is started by hand (or by an instance's boot script) with ``dorylus graph-server
--cluster FILE --rank K`` / ``dorylus weight-server ...``. No secret is in the file: the job key comes
from ``DORYLUS_KEY`` or the named secret (``jobkey.py``), the CURVE secret key from its own file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dorylus_py.errors import ConfigError
from dorylus_py.jsonfile import read_json

_ADDRESS = re.compile(r"^tcp://([A-Za-z0-9.\-]+):(\d{1,5})$")
_Z85_KEY = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")
OPTIONAL = ("lambda_function", "region", "key_secret", "curve_public_key", "curve_secret_key_file")


@dataclass(frozen=True)
class ClusterSpec:
    driver: str
    graph_servers: list[str]
    weight_servers: list[str]
    lambda_function: str = ""
    region: str = ""
    key_secret: str = ""  # Secrets Manager secret (ARN or name) with the job key, read at start
    curve_public_key: str = ""  # Z85: every connection is encrypted when set
    curve_secret_key_file: str = ""  # where each server machine keeps server.key_secret

    @classmethod
    def load(cls, path: str | Path) -> "ClusterSpec":
        path = Path(path)
        raw = read_json(path, ConfigError, "cluster file not found")
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: must be a JSON object")
        driver = raw.get("driver")
        gs, ws = raw.get("graph_servers"), raw.get("weight_servers")
        if not isinstance(gs, list) or not gs or not isinstance(ws, list) or not ws:
            raise ConfigError(f"{path}: needs non-empty lists graph_servers and weight_servers")
        for addr in [driver, *gs, *ws]:
            m = _ADDRESS.match(addr) if isinstance(addr, str) else None
            if m is None or not 0 < int(m.group(2)) < 65536:
                raise ConfigError(f"{path}: {addr!r} is not an address like tcp://10.0.1.5:7000")
        if len(set([driver, *gs, *ws])) != 1 + len(gs) + len(ws):
            raise ConfigError(f"{path}: two processes share an address")
        extra = {k: raw.get(k, "") for k in OPTIONAL}
        if not all(isinstance(v, str) for v in extra.values()):
            raise ConfigError(f"{path}: {', '.join(OPTIONAL)} must be strings")
        if extra["curve_public_key"] and not _Z85_KEY.match(extra["curve_public_key"]):
            raise ConfigError(f"{path}: curve_public_key is not a CurveZMQ public key (40 Z85 characters from "
                              "`dorylus keys gen`)")
        if bool(extra["curve_public_key"]) != bool(extra["curve_secret_key_file"]):
            raise ConfigError(f"{path}: curve_public_key and curve_secret_key_file go together (both or neither)")
        return cls(driver, list(gs), list(ws), **extra)

    def address(self, role: str, rank: int) -> str:
        addrs = self.graph_servers if role == "graph-server" else self.weight_servers
        if not 0 <= rank < len(addrs):
            raise ConfigError(f"--rank {rank} out of range: the cluster file lists {len(addrs)} {role}s")
        return addrs[rank]

    @staticmethod
    def host_port(address: str) -> tuple[str, int]:
        m = _ADDRESS.match(address)
        return m.group(1), int(m.group(2))


def cluster_curve(cluster: ClusterSpec | None, job_key: bytes, server: bool = True):
    """The CurveZMQ keys of a ``--cluster`` job whose file names them: the servers' and, derived from
    ``job_key``, the job's client pair (None: the file names none, and the job key's PLAIN gate admits
    instead, ``transport.gate_of``). ``server``: this process binds, so it needs the servers' secret key too."""
    from dorylus_py.keygen import load_curve_secret
    from dorylus_py.protocol.transport import Curve

    if cluster is None or not cluster.curve_public_key:
        return None
    secret = load_curve_secret(cluster.curve_secret_key_file, cluster.curve_public_key) if server else None
    return Curve.of_job(job_key, cluster.curve_public_key.encode(), secret)
