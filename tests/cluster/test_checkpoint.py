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


def test_resume_continues_exactly(small_graph, tmp_path, capsys):
    """2 epochs + resume to 4 == 4 epochs straight: weights, Adam state, dropout (keyed by epoch)."""
    common = ["--backend", "cpu", "--graph-servers", "2", "--quiet", "--checkpoint-every", "2"]
    for name in ("straight", "resumed"):
        prepare(small_graph, tmp_path / name, 2)
    assert main(["train", "--data", str(tmp_path / "straight"), "--epochs", "4", "--out", str(tmp_path / "a"), *common]) == 0
    assert main(["train", "--data", str(tmp_path / "resumed"), "--epochs", "2", "--out", str(tmp_path / "b1"), *common]) == 0
    assert main(["train", "--data", str(tmp_path / "resumed"), "--epochs", "4", "--out", str(tmp_path / "b2"), "--resume",
                 *common]) == 0
    a = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "b2" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in b] == [3, 4]
    np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a[2:]], rtol=1e-5)
    wa, wb = np.load(tmp_path / "a" / "weights.npz"), np.load(tmp_path / "b2" / "weights.npz")
    for k in wa.files:
        np.testing.assert_allclose(wa[k], wb[k], rtol=1e-5, atol=1e-7)
    capsys.readouterr()
    assert main(["train", "--data", str(tmp_path / "resumed"), "--epochs", "4", "--out", str(tmp_path / "b3"), "--resume",
                 *common]) == 2
    assert "leaves nothing to do" in capsys.readouterr().err and not (tmp_path / "b3").exists()
