"""Shared fixtures: a small generated graph, and the reference datasets when ../shared is present."""

from __future__ import annotations

from pathlib import Path

import pytest

from dorylus_py.data import Graph, SynthConfig, generate, load_graph

DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"


@pytest.fixture(scope="session")
def small_graph() -> Graph:
    return generate(SynthConfig(nodes=600, edges=6_000, features=16, classes=4, seed=3))


@pytest.fixture()
def graph_npz(small_graph, tmp_path) -> Path:
    """The small graph as a dataset file, in this test's folder."""
    from dorylus_py.data import write_npz

    write_npz(small_graph, tmp_path / "g.npz")
    return tmp_path / "g.npz"


def _dataset(name: str) -> Graph:
    path = DATASETS / f"{name}.npz"
    if not path.exists():
        pytest.skip(f"{path} absent (reference datasets live in ../shared/datasets)")
    return load_graph(path)


@pytest.fixture(scope="session")
def cora() -> Graph:
    return _dataset("cora")


@pytest.fixture(scope="session")
def citeseer() -> Graph:
    return _dataset("citeseer")
