"""`dorylus train --dilation D --host-cpus C`: a job as a scale model of a bigger cluster (docs/lab.md).

:func:`scale_model` is the thin shell around one run: it exports D (``timescale.py``) so that every
process the driver starts reads it, checks that the hosts fit this box (``hosts.py``), and, where the
servers start here (no ``--cluster``: the lab makes the groups of its own hosts), gives each graph and
weight server a CPU group of its own (``cgroups.py``) and tells the graph servers' emulated Lambdas
to make one each; it removes them all when the run ends, however it ends. The driver stays outside the
groups: it is the operator's process, and its loops poll at a fixed rate (their ticks are not dilated),
which in a small dilated quota costs a growing share (measured: in the weight server's group at D = 4
it made model epochs 30 % longer).
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

from dorylus_py.atomic import atomic_file
from dorylus_py.errors import ConfigError
from dorylus_py.hosts import box_cores, check_fit, job_hosts, lambda_vcpus
from dorylus_py.plan import lambdas_at_once
from dorylus_py.timescale import ENV, export

_groups: dict = {}  # server name -> its Group, while a scale model runs here


def preexec_for(name: str):
    """A server's ``preexec_fn``: joins its group (None outside a scale model with CPU groups)."""
    group = _groups.get(name)
    return group.preexec() if group is not None else None


def check(cfg, servers_here: bool) -> list:
    """The hosts ``cfg``'s scale model gives groups here (checked before anything is written): a clear
    error where the model cannot run (no cgroups, not root, too big for this box, D without groups)."""
    if not cfg.host_cpus or not servers_here:  # --cluster: the hosts' groups are the lab's
        if cfg.dilation != 1.0 and servers_here:
            raise ConfigError("--dilation needs --host-cpus: without CPU groups nothing runs D times slower")
        return []
    if cfg.backend not in ("local", "cpu", "gpu") or cfg.mode in ("gossip", "allreduce"):
        raise ConfigError(f"--host-cpus gives the graph and weight servers cores of their own; --backend {cfg.backend} "
                          f"--mode {cfg.mode} starts none here")
    from dorylus_py.cgroups import unavailable

    why = unavailable()
    if why:
        raise ConfigError(why)
    k = cfg.graph_servers
    hosts = job_hosts(cfg, k, cfg.weight_servers, lambdas_at_once(cfg, k))
    check_fit(hosts, cfg.dilation, box_cores())
    return hosts


@contextmanager
def scale_model(cfg, servers_here: bool, run_dir: Path | None = None):
    """Run the block as ``cfg``'s scale model (nothing at D = 1 without --host-cpus); with CPU groups,
    write each host's cores and CPU use to ``run_dir/hosts.json`` at the end."""
    hosts = check(cfg, servers_here)
    if not hosts:
        with _dilation(cfg.dilation):
            yield
        return
    from dorylus_py.cgroups import JobGroups

    servers = [h for h in hosts if not h.name.startswith("lambda-")]
    with _dilation(cfg.dilation), JobGroups(cfg.dilation) as jobs:
        _groups.update(jobs.add(servers))
        saved = {k: os.environ.get(k) for k in jobs.env(0.0)}
        os.environ.update(jobs.env(lambda_vcpus(cfg.lambda_memory_mb, cfg.lambda_vcpus)) if cfg.backend == "local" else {})
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if run_dir is not None and run_dir.is_dir():
                use = host_use(hosts, jobs.usage(), time.perf_counter() - t0, cfg.dilation)
                with atomic_file(run_dir / "hosts.json") as tmp:
                    Path(tmp).write_text(json.dumps(use, indent=1) + "\n")
            _groups.clear()
            for name, value in saved.items():
                os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)


def host_use(hosts: list, used: dict[str, float], wall_s: float, d: float) -> dict:
    """Each host's modelled cores, CPU seconds, and busy share (CPU seconds / its quota over the run);
    the Lambdas together as one row."""
    out = {}
    for h in hosts:
        key = "lambdas" if h.name.startswith("lambda-") else h.name
        row = out.setdefault(key, {"cores": 0.0, "hosts": 0})
        row["cores"] += h.cores
        row["hosts"] += 1
    for key, row in out.items():
        if key in used:
            row["cpu_s"] = round(used[key], 3)
            row["busy"] = round(used[key] / max(wall_s * row["cores"] / d, 1e-9), 4)
    return {"dilation": d, "wall_s": round(wall_s, 3), "hosts": out}


@contextmanager
def _dilation(d: float):
    saved = os.environ.get(ENV)
    export(d)
    try:
        yield
    finally:
        os.environ.pop(ENV, None) if saved is None else os.environ.__setitem__(ENV, saved)
