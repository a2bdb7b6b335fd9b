"""Shared fixtures: a small generated graph, and the reference datasets (shipped in dorylus_py/datasets)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from dorylus_py import datasets
from dorylus_py.data import Graph, SynthConfig, generate, load_graph

# The reference datasets the package ships (dorylus_py/datasets); DORYLUS_DATASETS names another folder of them
DATASETS = Path(os.environ.get("DORYLUS_DATASETS") or datasets.FOLDER)


# A bug met while handling a peer's message is logged and the message dropped in production; in the tests
# (and every process they start) it is fatal, so that it fails a test instead of passing as a rejection.
os.environ["DORYLUS_STRICT"] = "1"

# A non-interactive shell starts `cmd &` with SIGINT ignored, and the ignoring passes to every child:
# the Ctrl-C tests' jobs would then train on forever. Take Ctrl-C back, so their children get it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", help="also run tests marked long (whole jobs under faults, "
                     "fuzzing, the lab, the AWS rehearsal, accuracy: what CI runs beyond the README's 10 minutes)")
    parser.addoption("--slow", action="store_true", help="also run tests marked slow (multi-seed accuracy, scale; "
                     "implies --long)")


def pytest_collection_modifyitems(config, items):
    slow = config.getoption("--slow")
    wanted = {"slow": slow, "long": slow or config.getoption("--long")}
    for marker, run in wanted.items():
        if not run:
            skip = pytest.mark.skip(reason=f"{marker}: run with --{marker}")
            for item in items:
                if marker in item.keywords:
                    item.add_marker(skip)


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
    return load_graph(DATASETS / f"{name}.npz")  # shipped with the package: never skipped


@pytest.fixture(scope="session")
def cora() -> Graph:
    return _dataset("cora")


@pytest.fixture(scope="session")
def citeseer() -> Graph:
    return _dataset("citeseer")
