"""Scale (slow, skipped unless asked: ``pytest --slow tests/test_scale.py``): a graph of millions of edges goes through
synth, prepare and training within memory bounds that grow per vertex, not per edge.

``DORYLUS_SCALE_SIZE`` (default ``1M/20M``) sets the size; ``benchmarks/bench_scale.py`` measures the
larger ones and the cost model's error.
"""

import importlib.util
import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
GB = 2**30


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "benchmarks" / "bench_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(1800)  # 2.2 min at load 10, minutes more on a slow machine
def test_millions_of_edges_train_in_bounded_memory(bench, tmp_path):
    nodes, edges = bench.parse_size(os.environ.get("DORYLUS_SCALE_SIZE", "1M/20M"))
    graph, parts, run_dir = tmp_path / "g.npz", tmp_path / "parts", tmp_path / "run"
    synth = bench.run(bench.dorylus("synth", "--out", str(graph), "--nodes", str(nodes), "--edges", str(edges),
                                    "--features", "64"), tmp_path / "synth.log")
    assert synth["peak_rss"] < 0.5 * GB + 500 * nodes  # per vertex: labels, degree propensities, blocks
    prepare = bench.run(bench.dorylus("prepare", str(graph), "-k", "2", "--partitioner", "fennel", "--out", str(parts)),
                        tmp_path / "prepare.log")
    assert prepare["peak_rss"] < 0.5 * GB + 400 * nodes  # streamed: no per-edge term
    manifest = json.loads((parts / "manifest.json").read_text())
    assert manifest["edges"] == edges and manifest["edge_cut_fraction"] < 0.85 * manifest["hash_edge_cut_fraction"]
    train = bench.run(bench.dorylus("train", "--data", str(parts), "--backend", "cpu", "-k", "2", "--epochs", "2",
                                    "--chunks", "8", "--out", str(run_dir), "--quiet"), tmp_path / "train.log")
    store = sum(f.stat().st_size for f in parts.rglob("*") if f.is_file())
    assert train["peak_by_role"]["driver"] < 0.5 * GB  # the driver reads the manifest, never the graph
    assert all(b <= 16 for b in bench.structure_per_edge(run_dir))
    # measured: 2 M vertices / 40 M edges took 3.44 GB beyond the store (interpreters ~1 GB, then per vertex
    # the Gather buffers and the peers' contributions); a regression guard, not the issue's 3 GB target
    assert train["job_pss_peak"] - store < 1.0 * GB + 1500 * nodes
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(m["loss"] == m["loss"] for m in metrics)  # finite, trained
