"""A small run record the hostile-input tests forge copies of."""

import pytest

from dorylus_py.cli import main


@pytest.fixture(scope="package")
def small_run(tmp_path_factory):
    """A GCN reference run (2 epochs, hidden 8: W0 8 x 8, W1 8 x 3) on a 300-vertex generated g.npz: the
    record's folder and that file."""
    root = tmp_path_factory.mktemp("small-run")
    assert main(["synth", "--out", str(root / "g.npz"), "--nodes", "300", "--edges", "2000", "--features", "8",
                 "--classes", "3"]) == 0
    assert main(["train", "--data", str(root / "g.npz"), "--epochs", "2", "--hidden", "8", "--quiet",
                 "--out", str(root / "run")]) == 0
    return root / "run", root / "g.npz"
