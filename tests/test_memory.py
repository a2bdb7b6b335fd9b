"""The scale claims at CI size, each in a fresh process whose peak memory the kernel measured
(``tests/memory_probe.py``): streamed synth and prepare (Fennel) hold a block of edges, not the graph; the
driver of a 200 k-vertex job holds no more than that of a 2 k-vertex one. The same claims at millions of
vertices: ``pytest --slow tests/test_scale.py``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

BLOCK = 1 << 16  # edges every streaming step holds at once here (4 M in the product): 2 M edges are 31 blocks
# Bounds are levels and growths within 1.5x of what was measured (2026-12-03, this machine's kind), so that a
# regression of half again fails. Measured: synth 51.4 / 51.1 MB at 250 k / 2 M edges; prepare 54.7 -> 62.9 MB
# (4.7 B per edge added: the memory-mapped CSR's pages it has read count as resident; 3.7 B on 2026-11-28).
# Holding the edges would cost more: 16 B for their (src, dst) pairs alone, 63 B for prepare in one block.
PER_EDGE_B = 7  # growth of a streamed step's peak per edge added
SYNTH_MB, PREPARE_MB = 77, 94  # a streamed step's peak at 2 M edges
# One epoch of a 200 k-vertex `cpu` job (store 66 MB, features alone 51 MB), measured 2026-12-03: the driver
# 232.9 MB (233.0 at 2 k vertices: torch's import is most of it), the largest graph server 387 MB (263 at 2 k).
DRIVER_MB = 350  # the driver's peak at 200 k vertices
DRIVER_GROWTH_MB = 16  # from 2 k to 200 k vertices: the driver reads the manifest, never the graph
GRAPH_SERVER_MB = 580  # the largest graph server's peak at 200 k vertices


def probe(tmp_path, block: int, *argv, code: int = 0, timeout: float = 600) -> dict:
    """Run ``dorylus ARGV`` through the probe, which must exit with ``code``; its exit code, peaks (MB) and
    ``stderr``. The probe is a module of the tests, which are not installed: the repository goes on the
    child's path (the cwd is the test's folder)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))))
    proc = subprocess.run([sys.executable, "-m", "tests.memory_probe", str(block), *map(str, argv)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == code, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]) | {"stderr": proc.stderr}


def test_streamed_synth_and_prepare_hold_a_block_of_edges_not_the_graph(tmp_path):
    """50 k vertices with 250 k and with 2 M edges: synth, then prepare with Fennel (the streaming
    partitioner, which `auto` picks when METIS would not fit), in blocks of 64 k edges."""
    peaks = {}
    for edges in (250_000, 2_000_000):
        synth = probe(tmp_path, BLOCK, "synth", "--out", f"g{edges}.npz", "--nodes", 50_000, "--edges", edges,
                      "--features", 16, "--classes", 4)
        prepare = probe(tmp_path, BLOCK, "prepare", f"g{edges}.npz", "-k", 2, "--partitioner", "fennel",
                        "--out", f"p{edges}")
        peaks[edges] = synth["self_mb"], prepare["self_mb"]
        manifest = json.loads((tmp_path / f"p{edges}" / "manifest.json").read_text())
        assert manifest["edges"] == edges and manifest["edge_cut_fraction"] < manifest["hash_edge_cut_fraction"]
    allowed_mb = PER_EDGE_B * (2_000_000 - 250_000) / 2**20
    for step, small, large, level in zip(("synth", "prepare"), peaks[250_000], peaks[2_000_000], (SYNTH_MB, PREPARE_MB)):
        assert large - small < allowed_mb, f"{step}: {small:.1f} -> {large:.1f} MB for 1.75 M more edges"
        assert large < level, f"{step}: {large:.1f} MB at 2 M edges (bound {level} MB)"


@pytest.mark.long
def test_the_driver_holds_no_more_for_a_200k_vertex_job(tmp_path):
    """The driver reads the store's manifest, never the graph: its peak is the same for 2 k and 200 k
    vertices (one epoch of `cpu` training, 2 graph servers, whose peaks are the children's)."""
    drivers = {}
    for nodes in (2_000, 200_000):
        assert probe(tmp_path, 0, "synth", "--out", f"g{nodes}.npz", "--nodes", nodes, "--edges", 5 * nodes,
                     "--features", 64, "--classes", 4)["code"] == 0
        assert probe(tmp_path, 0, "prepare", f"g{nodes}.npz", "-k", 2, "--partitioner", "hash", "--out", f"p{nodes}")["code"] == 0
        drivers[nodes] = probe(tmp_path, 0, "train", "--data", f"p{nodes}", "--backend", "cpu", "--epochs", 1, "--chunks", 2,
                               "--quiet", "--out", f"run{nodes}")
        assert len((tmp_path / f"run{nodes}" / "metrics.jsonl").read_text().splitlines()) == 1
    store_mb = sum(f.stat().st_size for f in (tmp_path / "p200000").rglob("*") if f.is_file()) / 2**20
    assert store_mb > 4 * DRIVER_GROWTH_MB  # the bound is well below what reading the graph would take
    assert drivers[200_000]["self_mb"] - drivers[2_000]["self_mb"] < DRIVER_GROWTH_MB, drivers
    assert drivers[200_000]["self_mb"] < DRIVER_MB, drivers
    assert drivers[200_000]["children_mb"] < GRAPH_SERVER_MB, drivers
    assert drivers[200_000]["children_mb"] > drivers[2_000]["children_mb"]  # the graph servers did hold it
