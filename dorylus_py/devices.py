"""Which torch device each graph server's tensor threads use (``--backend cpu|gpu``), worked out on the
host that runs them.

``--device`` is ``cpu``, ``cuda`` (each graph server on a host takes the next GPU: ``cuda:{local rank %
GPUs}``, its local rank being its place among the graph servers of that host), ``cuda:N``, or a comma list
of these, one per graph server by rank. The driver checks the spelling and the list's length; whether the
device exists is checked where it is used, since a ``--cluster`` job's driver may have no GPU at all
(``graph_servers/workers.py``; a job whose servers the driver starts on its own host is checked there too,
before any starts: ``TrainConfig.check_devices_here``).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from dorylus_py.errors import ConfigError

_ONE = re.compile(r"cpu|cuda(:\d{1,3})?")


def device_list(value: str) -> tuple[str, ...]:
    """``--device`` as its entries (none: the backend's default), each checked for spelling."""
    if not value:
        return ()
    entries = tuple(v.strip() for v in value.split(","))
    if bad := [e for e in entries if not _ONE.fullmatch(e)]:
        raise ConfigError(f"--device: {bad[0]!r} is not cpu, cuda or cuda:N (a comma list gives each graph server "
                          "its own)")
    return entries


def device_for(value: str, backend: str, rank: int, local_rank: int, gpus: int) -> str:
    """The device of graph server ``rank`` (``local_rank``: its place among its host's graph servers;
    ``gpus``: the CUDA devices torch sees there)."""
    entries = device_list(value) or (("cuda",) if backend == "gpu" else ("cpu",))
    chosen = entries[rank] if len(entries) > 1 else entries[0]
    if chosen == "cpu":
        return chosen
    if gpus == 0:
        raise ConfigError(f"--backend {backend} wants device {chosen} for graph server {rank}, but torch sees no CUDA "
                          "device on its host (use --device cpu, or --backend cpu)")
    if chosen == "cuda":
        return f"cuda:{local_rank % gpus}"
    if int(chosen.split(":")[1]) >= gpus:
        raise ConfigError(f"graph server {rank} wants {chosen}, but its host has {gpus} CUDA device(s)")
    return chosen


def local_rank(addresses: list[str], rank: int) -> int:
    """The place of ``addresses[rank]`` among the addresses before it on the same host (``rank`` itself
    when the addresses are not known: every server on one host)."""
    if rank >= len(addresses):
        return rank
    host = urlsplit(addresses[rank]).hostname
    return sum(urlsplit(a).hostname == host for a in addresses[:rank])


def cuda_devices() -> int:
    """The CUDA devices torch sees on this host."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
