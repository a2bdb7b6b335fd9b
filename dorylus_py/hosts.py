"""A scale model's hosts, worked out in pure code: how many of this box's cores each one gets, whether
they fit, and which cores a host is pinned to.

A host that models C cores at dilation D gets C/D of this box's cores (a CFS quota, ``cgroups.py``);
the model fits when the sum of C/D over the hosts is at most ``FIT`` of the box's cores, leaving the rest
for the kernel, the driver and the tools. A host is also pinned to whole cores (a cpuset) where its share
fits on the cores least used so far, so that its threads do not spread over cores it has no share of.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from dorylus_py.errors import ConfigError

FIT = 0.9  # of the box's cores, the most a model may use
MB_PER_VCPU = 1769  # AWS Lambda: a full vCPU at 1,769 MB of memory, proportionally below and above
MAX_LAMBDA_VCPUS = 6.0  # AWS Lambda's most, at 10,240 MB


@dataclass(frozen=True)
class Host:
    name: str  # graph-server-0, weight-server-0, lambda (each emulated Lambda), b (a lab host) ...
    cores: float  # the cores it models (C)
    memory_mb: int = 0  # its memory limit (0: none)


def lambda_vcpus(memory_mb: int, asked: float = 0.0) -> float:
    """The cores of one Lambda: ``asked``, else what AWS gives ``memory_mb`` (1,769 MB a vCPU, at most 6)."""
    return asked if asked > 0 else min(MAX_LAMBDA_VCPUS, memory_mb / MB_PER_VCPU)


def box_cores() -> int:
    """The cores this process may run on (its cpuset), at most ``os.cpu_count()``."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return min(n, os.cpu_count() or n)


def job_hosts(cfg, graph_servers: int, weight_servers: int, lambdas: int) -> list[Host]:
    """The hosts of a job with ``cfg``'s scale settings: a graph server each, a weight server each, and
    (``lambdas``: emulated Lambdas at once) a Lambda each. None without ``--host-cpus``."""
    s = cfg.scale
    if not s.host_cpus:
        return []
    weight = s.weight_host_cpus or s.host_cpus
    v = lambda_vcpus(cfg.lambda_memory_mb, s.lambda_vcpus)
    return ([Host(f"graph-server-{k}", s.host_cpus, s.host_memory_mb) for k in range(graph_servers)]
            + [Host(f"weight-server-{w}", weight, s.host_memory_mb) for w in range(weight_servers)]
            + [Host(f"lambda-{i}", v) for i in range(lambdas)])


def check_fit(hosts: list[Host], dilation: float, box: int) -> float:
    """The box's cores the model uses (sum of C/D); a model above ``FIT`` of ``box`` is refused."""
    need = sum(h.cores for h in hosts) / dilation
    if need > FIT * box + 1e-9:
        raise ConfigError(f"the scale model does not fit: sum of C/D over {len(hosts)} hosts is {need:.2f} cores, above "
                          f"{FIT:.0%} of this box's {box} (raise --dilation, or model fewer or smaller hosts)")
    return need


def period_quota_us(cores: float, dilation: float, period_us: int) -> tuple[int, int]:
    """A host's CFS period and quota: C/D of a core each ``period_us``, the period made longer where the
    quota would fall below the kernel's least (1 ms)."""
    share = cores / dilation
    period = max(period_us, math.ceil(1000 / share)) if share > 0 else period_us
    return period, max(1000, int(round(share * period)))


def place(shares: list[float], cpus: list[int]) -> list[list[int] | None]:
    """Whole cores for each share (cores of the box it may use), biggest first, on the cores least used
    so far, where they fit (no core above one core's worth); None where they do not (the host then
    runs on every core, within its quota)."""
    load = {c: 0.0 for c in cpus}
    out: list[list[int] | None] = [None] * len(shares)
    for i in sorted(range(len(shares)), key=lambda i: -shares[i]):
        k = max(1, math.ceil(shares[i] - 1e-9))
        if k > len(cpus):
            continue
        chosen = sorted(cpus, key=lambda c: (load[c], c))[:k]
        if all(load[c] + shares[i] / k <= 1.0 + 1e-9 for c in chosen):
            for c in chosen:
                load[c] += shares[i] / k
            out[i] = sorted(chosen)
    return out
