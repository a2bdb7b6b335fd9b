"""Checkpoints into a local partition store: weights, Adam state and epoch, the newest named by latest.json."""

import json

import numpy as np
import pytest

from dorylus_py.checkpoint import load_checkpoint, save_checkpoint
from dorylus_py.cli import main
from dorylus_py.errors import DataError
from dorylus_py.partition import prepare


def test_checkpoints_land_in_the_store(small_graph, tmp_path):
    store = tmp_path / "parts"
    prepare(small_graph, store, 1)
    out = tmp_path / "run"
    assert main(["train", "--backend", "cpu", "--data", str(store), "--graph-servers", "1", "--epochs", "2", "--quiet",
                 "--checkpoint-every", "1", "--out", str(out)]) == 0
    assert sorted(p.name for p in (store / "checkpoints").iterdir()) == ["epoch-000001.npz", "epoch-000002.npz", "latest.json"]
    ckpt = load_checkpoint(str(store / "checkpoints"))
    assert int(ckpt["epoch"]) == 2 and np.array_equal(ckpt["W0"], np.load(out / "weights.npz")["W0"])
    assert float(ckpt["adam_step1"]) == 2


def test_a_damaged_checkpoint_is_refused(tmp_path):
    root = str(tmp_path / "ck")
    save_checkpoint(root, 5, {"W0": np.ones((2, 2), np.float32)})
    assert int(load_checkpoint(root)["epoch"]) == 5
    latest = json.loads((tmp_path / "ck" / "latest.json").read_text())
    (tmp_path / "ck" / latest["file"]).write_bytes(b"garbage")
    with pytest.raises(DataError, match="does not match latest.json"):
        load_checkpoint(root)
