"""Claim (a) of the scale model: a host of C cores at dilation D computes D times slower than at D = 1,
so that its model time (raw / D) is the same. One process (torch threads = 1) runs a fixed matmul loop,
moved between groups of C = 0.5 core at D = 1 (5 ms a 10 ms period) and D = 4 (1.25 ms); each is timed
five times, interleaved, and the medians compared. C = 0.5 and not 1 because this box's two cores are
shared with other jobs: half a core is what a group can count on getting at D = 1 (at C = 1 the D = 1
time grows with whatever else runs, and the ratio falls below 4)."""

from __future__ import annotations

import statistics
import subprocess
import sys

import pytest

from dorylus_py.hosts import Host
from dorylus_py import cgroups
from dorylus_py.cgroups import JobGroups

pytestmark = pytest.mark.cgroups

LOOP = """
import sys, time, torch
torch.set_num_threads(1)
a0 = torch.randn(256, 256)
for line in sys.stdin:
    a, t, c = a0, time.perf_counter(), time.process_time()
    for _ in range(int(line)):
        a = torch.tanh(a @ a)
    print(time.perf_counter() - t, time.process_time() - c, flush=True)
"""
CORES, ITERATIONS, REPEATS = 0.5, 2400, 5


def loop_times(dilations: tuple[float, ...]) -> tuple[dict[float, float], dict[float, float]]:
    """The median wall time and CPU time of the loop in a group of CORES at each dilation (one process,
    moved between them)."""
    proc = subprocess.Popen([sys.executable, "-c", LOOP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        proc.stdin.write("50\n")
        proc.stdin.flush()
        proc.stdout.readline()  # warmed up, outside any group
        times: dict[float, list[float]] = {d: [] for d in dilations}
        cpu: dict[float, list[float]] = {d: [] for d in dilations}
        with JobGroups() as jobs:
            groups = {d: g for d in dilations for g in [_group(jobs, d)]}
            for _ in range(REPEATS):
                for d in dilations:
                    groups[d].join(proc.pid)
                    proc.stdin.write(f"{ITERATIONS}\n")
                    proc.stdin.flush()
                    wall, used = map(float, proc.stdout.readline().split())
                    times[d].append(wall)
                    cpu[d].append(used)
        return ({d: statistics.median(t) for d, t in times.items()}, {d: statistics.median(c) for d, c in cpu.items()})
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _group(jobs: JobGroups, d: float) -> cgroups.Group:
    jobs.dilation = d
    return jobs.add([Host(f"mm-d{d:g}", CORES)])[f"mm-d{d:g}"]


@pytest.mark.slow  # 45 s, and timing
def test_a_host_at_dilation_4_computes_4_times_slower():
    """The model gives a host its time per CPU second exactly: the wall ratio over the CPU ratio is D. This
    VM also charges more CPU seconds for the same work at a small share (docs/lab.md, "Where the error
    comes from": +26-31 % at 0.15-0.3 of a core), which the wall ratio alone counted against the model
    (4.16-4.71x measured here); that is bounded separately, as the box's."""
    t, cpu = loop_times((1.0, 4.0))
    ratio, inflation = t[4.0] / t[1.0], cpu[4.0] / cpu[1.0]
    print(f"matmul loop, C={CORES}: D=1 {t[1.0]:.2f} s, D=4 {t[4.0]:.2f} s, ratio {ratio:.2f}; "
          f"CPU s D=1 {cpu[1.0]:.2f}, D=4 {cpu[4.0]:.2f} ({inflation:.2f}x)")
    assert 3.6 <= ratio / inflation <= 4.4, (t, cpu, ratio, inflation)
    assert inflation <= 1.4, f"this box charges {inflation:.2f}x the CPU for the same loop at D=4: too noisy to model"


def test_without_quotas_the_check_fails(monkeypatch):
    """The capability off: groups made but no quota written; the loop then runs at one speed in both."""
    monkeypatch.setattr(cgroups.Group, "limit", lambda self, *a: None)
    t, cpu = loop_times((1.0, 4.0))
    assert not 3.6 <= (t[4.0] / t[1.0]) / (cpu[4.0] / cpu[1.0]) <= 4.4, (t, cpu)


def test_groups_are_removed_and_limits_written(tmp_path):
    with JobGroups(dilation=2.0) as jobs:
        g = jobs.add([Host("h", 1.0, memory_mb=64)])["h"]
        assert g.quota_us() == 5000  # 1 core / D 2 of a 10 ms period
        assert (g.dirs["cpu"] / "cpu.cfs_period_us").read_text().strip() == "10000"
        assert int((g.dirs["memory"] / "memory.limit_in_bytes").read_text()) == 64 * 2**20
        made = [jobs.job_dir(c) for c in cgroups.CONTROLLERS]
        assert all(p.is_dir() for p in made)
    assert not any(p.exists() for p in made)


def test_sweep_removes_groups_of_dead_makers():
    maker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = [cgroups.ROOT / c / cgroups.PARENT / f"{maker.pid}-0" for c in cgroups.CONTROLLERS]
        with JobGroups():  # makes the parent folders
            for p in stale:
                cgroups._make_dir(p, p.parent.parent.name)
            assert cgroups.sweep() == []  # its maker lives
    finally:
        maker.kill()
        maker.wait(timeout=10)
    assert f"{maker.pid}-0" in cgroups.sweep()
    assert not any(p.exists() for p in stale)


def test_a_host_out_of_memory_is_killed():
    """--host-memory-mb: the kernel kills a host's process that outgrows it, as on a real machine."""
    with JobGroups() as jobs:
        group = jobs.add([Host("small", 0.5, memory_mb=64)])["small"]
        grow = subprocess.run([sys.executable, "-c", "b = bytearray(256 * 2**20); b[::4096] = b'x' * len(b[::4096])"],
                              preexec_fn=group.preexec(), capture_output=True, timeout=120)
        fits = subprocess.run([sys.executable, "-c", "b = bytearray(8 * 2**20)"], preexec_fn=group.preexec(),
                              capture_output=True, timeout=120)
    assert grow.returncode == -9 and fits.returncode == 0, (grow.returncode, fits.returncode)
