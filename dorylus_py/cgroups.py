"""Hosts with cores and memory of their own: cgroup v1 groups (``cpu``, ``cpuset``, ``memory``).

A job's groups live under ``/sys/fs/cgroup/CONTROLLER/dorylus/<pid>-<n>/`` (``<pid>``: the process that
made them, so that runs at once never touch each other's, and :func:`sweep` removes those whose maker is
gone). Each host is a group there: a CFS quota of C/D cores per 10 ms period (short, so that a pipeline
is not bursty), a cpuset of whole cores where they fit (``hosts.place``), and a memory limit (a host out
of memory is killed by the kernel, as a real one is). A process joins at its start (:meth:`Group.preexec`,
so its children are in it too), and an emulated Lambda joins a group of its own from its first line
(:func:`join_own`, told where by the environment). :meth:`JobGroups.remove` removes them all, also after
a failure. Needs root and the three controllers mounted (v1); :func:`unavailable` says why not.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from dorylus_py.errors import ConfigError
from dorylus_py.hosts import Host, period_quota_us, place

ROOT = Path("/sys/fs/cgroup")
PARENT = "dorylus"
REQUIRED = ("cpu", "cpuset", "memory")
# cpuacct (each host's CPU seconds) where it is a hierarchy of its own; mounted with cpu, it is cpu's
CONTROLLERS = REQUIRED + (("cpuacct",) if (ROOT / "cpuacct").is_dir()
                          and (ROOT / "cpuacct").resolve() != (ROOT / "cpu").resolve() else ())
PERIOD_US = 10_000
SHARES = 16_384  # 16x a plain process's weight: a host gets its quota even while the box is busy with others
JOB_ENV = "DORYLUS_CGROUP_JOB"  # a job's folder name under PARENT, for processes that make their own group
LAMBDA_ENV = "DORYLUS_LAMBDA_CORES"  # the box's cores an emulated Lambda gets (V/D)
_serial = itertools.count()


class CgroupError(ConfigError):
    """A host's group could not be made or joined (not root, no controller, the kernel refused)."""


def unavailable() -> str:
    """Why this machine cannot give hosts cores of their own ("" when it can)."""
    if os.geteuid() != 0:
        return "CPU groups (--host-cpus) need root: the cgroup files are root's"
    for ctl in REQUIRED:
        if not (ROOT / ctl / "cgroup.procs").exists():
            return f"CPU groups (--host-cpus) need the cgroup v1 {ctl} controller at {ROOT / ctl}"
        if not os.access(ROOT / ctl, os.W_OK):
            return f"CPU groups (--host-cpus): {ROOT / ctl} is not writable"
    return ""


def _write(path: Path, value) -> None:
    try:
        path.write_text(f"{value}\n")
    except OSError as e:
        raise CgroupError(f"cgroup: writing {value} to {path}: {e.strerror or e}") from None


def _parse_cpus(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def allowed_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


class Group:
    """One host's group, in each controller."""

    def __init__(self, dirs: dict[str, Path]):
        self.dirs = dirs

    def limit(self, cores: float, dilation: float, cpus: list[int] | None, memory_mb: int) -> None:
        period, quota = period_quota_us(cores, dilation, PERIOD_US)
        _write(self.dirs["cpu"] / "cpu.cfs_period_us", period)
        _write(self.dirs["cpu"] / "cpu.cfs_quota_us", quota)
        if cpus:
            _write(self.dirs["cpuset"] / "cpuset.cpus", ",".join(map(str, cpus)))
        if memory_mb:
            _write(self.dirs["memory"] / "memory.limit_in_bytes", memory_mb * 2**20)

    def join(self, pid: int = 0) -> None:
        """Move process ``pid`` (0: this one) into the group, in every controller."""
        for d in self.dirs.values():
            _write(d / "cgroup.procs", pid or os.getpid())

    def preexec(self):
        """A ``preexec_fn`` that puts the new process in the group before it runs anything."""
        files = [str(d / "cgroup.procs") for d in self.dirs.values()]

        def enter() -> None:
            for f in files:
                with open(f, "w") as out:
                    out.write(str(os.getpid()))
        return enter

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.dirs["cpu"] / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def cpu_s(self) -> float | None:
        """The CPU seconds the group's processes (and their children's, in subgroups) used so far."""
        d = self.dirs.get("cpuacct", self.dirs["cpu"])
        try:
            return int((d / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None

    def quota_us(self) -> int:
        return int((self.dirs["cpu"] / "cpu.cfs_quota_us").read_text())


def _make_dir(path: Path, ctl: str) -> None:
    path.mkdir()
    if ctl == "cpu":  # at every level: a group's weight counts among its siblings only
        _write(path / "cpu.shares", SHARES)
    if ctl == "cpuset":  # a new cpuset group starts empty: it gets its parent's cores and memory nodes
        for name in ("cpuset.cpus", "cpuset.mems"):
            _write(path / name, (path.parent / name).read_text().strip())


class JobGroups:
    """The groups of one job; a context manager that removes them all, however the block ends."""

    def __init__(self, dilation: float = 1.0):
        why = unavailable()
        if why:
            raise CgroupError(why)
        sweep()
        self.dilation = dilation
        self.tag = f"{os.getpid()}-{next(_serial)}"
        self.groups: dict[str, Group] = {}
        self.made: list[Path] = []
        for ctl in CONTROLLERS:
            parent = ROOT / ctl / PARENT
            if not parent.exists():
                try:
                    _make_dir(parent, ctl)
                except FileExistsError:
                    pass  # another run made it just now
            self._mkdir(parent / self.tag, ctl)

    def _mkdir(self, path: Path, ctl: str) -> None:
        try:
            _make_dir(path, ctl)
        except OSError as e:
            self.remove()
            raise CgroupError(f"cgroup: making {path}: {e.strerror or e}") from None
        self.made.append(path)

    def __enter__(self) -> "JobGroups":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def job_dir(self, ctl: str) -> Path:
        return ROOT / ctl / PARENT / self.tag

    def add(self, hosts: list[Host]) -> dict[str, Group]:
        """A group for each host, limited to C/D cores (pinned where whole cores fit) and its memory."""
        shares = [h.cores / self.dilation for h in hosts]
        for host, cpus in zip(hosts, place(shares, allowed_cpus())):
            dirs = {ctl: self.job_dir(ctl) / host.name for ctl in CONTROLLERS}
            for ctl, d in dirs.items():
                self._mkdir(d, ctl)
            group = Group(dirs)
            try:
                group.limit(host.cores, self.dilation, cpus, host.memory_mb)
            except CgroupError:
                self.remove()
                raise
            self.groups[host.name] = group
        return self.groups

    def usage(self) -> dict[str, float]:
        """CPU seconds used so far by each host, and by all of its emulated Lambdas together ("lambdas")."""
        out = {name: t for name, g in self.groups.items() if (t := g.cpu_s()) is not None}
        job = self.job_dir("cpuacct" if "cpuacct" in CONTROLLERS else "cpu")
        lambdas = [Group({"cpu": d}).cpu_s() for d in job.glob("lambda-*") if d.is_dir()]
        if lambdas and None not in lambdas:
            out["lambdas"] = sum(lambdas)
        return out

    def env(self, lambda_cores: float) -> dict[str, str]:
        """What a process needs to give each emulated Lambda it starts a group of ``lambda_cores`` (V)."""
        return {JOB_ENV: self.tag, LAMBDA_ENV: repr(lambda_cores / self.dilation)}

    def remove(self) -> None:
        """Remove every group of the job (the processes still in one go to the machine's root group)."""
        for ctl in CONTROLLERS:
            _remove_tree(self.job_dir(ctl), ROOT / ctl)
        self.made.clear()


def _remove_tree(path: Path, root: Path) -> None:
    if not path.is_dir():
        return
    for child in [p for p in path.iterdir() if p.is_dir()]:
        _remove_tree(child, root)
    for _ in range(50):
        try:
            for pid in (path / "cgroup.procs").read_text().split():
                try:
                    _write(root / "cgroup.procs", pid)
                except CgroupError:
                    pass  # exited meanwhile
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)  # a process on its way out is still counted for a moment
    try:
        path.rmdir()
    except OSError:
        pass  # left for the next sweep


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep() -> list[str]:
    """Remove the groups of jobs whose maker is gone; return their names."""
    gone = set()
    for ctl in CONTROLLERS:
        parent = ROOT / ctl / PARENT
        if not parent.is_dir():
            continue
        for job in [p for p in parent.iterdir() if p.is_dir()]:
            pid = job.name.split("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                _remove_tree(job, ROOT / ctl)
                gone.add(job.name)
    return sorted(gone)


def join_own(name: str) -> Group | None:
    """Put this process in a group of its own (``name``-<pid>) under its job's, limited to the cores the
    environment gives (an emulated Lambda, a host of its own); None outside a job with CPU groups."""
    tag, cores = os.environ.get(JOB_ENV), os.environ.get(LAMBDA_ENV)
    if not tag or not cores:
        return None
    dirs = {ctl: ROOT / ctl / PARENT / tag / f"{name}-{os.getpid()}" for ctl in CONTROLLERS}
    for ctl, d in dirs.items():
        try:
            _make_dir(d, ctl)
        except FileExistsError:
            pass  # a dead process's of the same pid: empty, and ours now
        except OSError as e:
            raise CgroupError(f"cgroup: making {d}: {e.strerror or e}") from None
    group = Group(dirs)
    group.limit(float(cores), 1.0, None, 0)
    group.join()
    return group
