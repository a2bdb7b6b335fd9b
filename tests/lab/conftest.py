"""Lab tests: hosts as network namespaces (root and iproute2 needed, as in CI), a small graph in two
partitions, and the per-epoch losses of the same job on one machine to compare every lab job with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dorylus_py.lab.network import unavailable

EPOCHS = 4
JOB = ["--epochs", str(EPOCHS), "--dropout", "0", "--lambdas", "4", "--feature-norm", "none"]  # sync mode
# Each server's resident memory (MiB) and open fds stay below these (undisturbed peaks on the test graph:
# graph servers 285 MiB and 50 fds, the weight server 235 and 21, the Lambda service 46 and 24).
MAX_MB, MAX_FDS = 400, 100


def pytest_collection_modifyitems(config, items):
    why = unavailable()
    for item in items:
        if why and "lab" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"{why}: lab tests need it"))


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def lab_data(small_graph, tmp_path_factory) -> Path:
    from dorylus_py.cli import main
    from dorylus_py.data import write_npz

    root = tmp_path_factory.mktemp("lab-data")
    write_npz(small_graph, root / "g.npz")
    assert main(["prepare", str(root / "g.npz"), "-k", "2", "--out", str(root / "parts")]) == 0
    return root / "parts"


@pytest.fixture(scope="session")
def one_machine(lab_data, tmp_path_factory) -> list[float]:
    """The job's per-epoch losses on one machine (`--backend local`), the lab jobs' yardstick."""
    from dorylus_py.cli import main

    out = tmp_path_factory.mktemp("one-machine") / "run"
    assert main(["train", "--data", str(lab_data), "--backend", "local", "--out", str(out), "--quiet", *JOB]) == 0
    return losses(out)
