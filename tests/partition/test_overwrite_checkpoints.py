"""`prepare --overwrite` deletes a store's checkpoints only when told to."""

import numpy as np

from dorylus_py.checkpoint import save_checkpoint
from dorylus_py.cli import main
from dorylus_py.data import write_npz
from dorylus_py.partition.store import checkpoint_root


def test_overwrite_keeps_checkpoints_unless_told(small_graph, tmp_path, capsys):
    write_npz(small_graph, tmp_path / "g.npz")
    store = tmp_path / "parts"
    prepare = ["prepare", str(tmp_path / "g.npz"), "-k", "2", "--out", str(store)]
    assert main(prepare) == 0
    assert main([*prepare, "--overwrite"]) == 0  # no checkpoints: replaced as before
    save_checkpoint(checkpoint_root(str(store)), 5, {"W0": np.ones((2, 2), np.float32)},
                    {"store": "0" * 32, "model": "gcn", "widths": [2, 2], "partitions": 2})
    capsys.readouterr()
    assert main([*prepare, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "holds 2 checkpoint files" in err and "--delete-checkpoints" in err and err.count("\n") == 1
    assert (store / "checkpoints" / "epoch-000005.npz").exists()  # untouched
    assert main([*prepare, "--overwrite", "--delete-checkpoints"]) == 0
    assert not (store / "checkpoints").exists() and (store / "manifest.json").exists()

