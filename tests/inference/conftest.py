"""Run records to use: a GCN, GAT and GraphSAGE run on a small generated graph."""

import json

import pytest

from dorylus_py.cli import main
from dorylus_py.data import SynthConfig, generate, write_npz


def train(data, run_dir, *flags):
    """`dorylus train` into ``run_dir``; its summary."""
    assert main(["train", "--data", str(data), "--quiet", "--out", str(run_dir), *flags]) == 0
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="package")
def small_runs(tmp_path_factory):
    """A GCN, GAT (2 heads, 2 averaged in the last layer) and GraphSAGE run on a small generated graph."""
    root = tmp_path_factory.mktemp("small")
    data = root / "g.npz"
    write_npz(generate(SynthConfig(nodes=300, edges=3_000, features=12, classes=3, seed=5)), data)
    runs = {}
    for model, flags in (("gcn", []), ("gat", ["--heads", "2", "--out-heads", "2"]), ("sage", [])):
        runs[model] = root / model
        train(data, runs[model], "--model", model, "--epochs", "6", "--hidden", "8", *flags)
    return data, runs
