"""benchmarks/bench_host_share.py, the box's own CPU cost at a smaller share (docs/lab.md), runs and prints a
row per kernel with D = 1's ratio 1.00x and the others' measured (a few iterations: the shape, not the figure)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cgroups, pytest.mark.long]
BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_host_share.py"


def test_the_benchmark_prints_each_kernels_cpu_cost_by_dilation():
    out = subprocess.run([sys.executable, str(BENCH), "--dilations", "1,4", "--repeats", "1", "--iterations", "5"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: re.findall(r"([\d.]+) \(([\d.]+)x\)", line) for line in out.stdout.splitlines()[2:]}
    assert set(rows) == {"dense", "sparse"}, out.stdout
    for cells in rows.values():
        assert len(cells) == 2 and cells[0][1] == "1.00" and float(cells[1][0]) > 0, out.stdout
