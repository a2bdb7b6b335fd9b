"""Checkpoints in the run record: every layer at the same epoch, Adam state, exact continuation."""

import json
import re

import numpy as np
import pytest

from dorylus_py.checkpoint import load_checkpoint, save_checkpoint
from dorylus_py.cli import main
from dorylus_py.cluster.launcher import train_distributed
from dorylus_py.config import TrainConfig
from dorylus_py.errors import DataError
from dorylus_py.partition import prepare
from dorylus_py.training import RunRecord
from tests.cluster import assert_gradients_once

JOB = {"store": "0" * 32, "model": "gcn", "widths": [2, 2], "partitions": 1}  # a fingerprint for checkpoints alone


def test_checkpoints_land_in_the_run_record(small_graph, tmp_path):
    store = tmp_path / "parts"
    prepare(small_graph, store, 1)
    out = tmp_path / "run"
    assert main(["train", "--backend", "cpu", "--data", str(store), "--graph-servers", "1", "--epochs", "2", "--quiet",
                 "--checkpoint-every", "1", "--out", str(out)]) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch-000001.npz", "epoch-000002.npz", "latest.json"]
    assert not (store / "checkpoints").exists()  # the prepared store stays as it was
    ckpt = load_checkpoint(str(out / "checkpoints"))
    assert int(ckpt["epoch"]) == 2 and np.array_equal(ckpt["W0:W"], np.load(out / "weights.npz")["W0"])
    assert float(ckpt["W1:adam_step"]) == 2


def test_a_damaged_checkpoint_is_refused(tmp_path):
    root = str(tmp_path / "ck")
    save_checkpoint(root, 5, {"W0": np.ones((2, 2), np.float32)}, JOB)
    assert int(load_checkpoint(root)["epoch"]) == 5
    latest = json.loads((tmp_path / "ck" / "latest.json").read_text())
    (tmp_path / "ck" / latest["file"]).write_bytes(b"garbage")
    with pytest.raises(DataError, match="does not match latest.json"):
        load_checkpoint(root)


def run(graph, tmp_path, name, parts, **kw):
    cfg = TrainConfig(**{"epochs": 4, "dropout": 0.5, "chunks": 3, "lambdas": 2, "feature_norm": "none",
                         "backend": "cpu", "graph_servers": 2} | kw)
    if not parts.exists():
        prepare(graph, parts, cfg.graph_servers)
    return train_distributed(cfg, parts, RunRecord(tmp_path / name, cfg.to_dict()), "none", show_progress=False)


@pytest.mark.long
def test_resume_continues_exactly(small_graph, tmp_path):
    """2 epochs + resume to 4 == 4 epochs straight: weights, Adam state, dropout (keyed by epoch)."""
    parts = tmp_path / "parts"
    a = run(small_graph, tmp_path, "a", parts, checkpoint_every=2)
    run(small_graph, tmp_path, "b1", parts, epochs=2, checkpoint_every=2)
    cfg = TrainConfig(epochs=4, dropout=0.5, chunks=3, feature_norm="none", backend="cpu", graph_servers=2,
                      checkpoint_every=2)
    b = train_distributed(cfg, parts, RunRecord(tmp_path / "b2", cfg.to_dict()), "none", show_progress=False,
                          resume_from=str(tmp_path / "b1" / "checkpoints"))
    assert [r["epoch"] for r in b.history] == [3, 4]
    assert_gradients_once(b.summary, 2 * 2 * 2 * 3)  # epochs 3 and 4 x layers x chunks of 2 servers
    np.testing.assert_allclose([r["loss"] for r in b.history], [r["loss"] for r in a.history[2:]], rtol=1e-5)
    wa, wb = np.load(tmp_path / "a" / "weights.npz"), np.load(tmp_path / "b2" / "weights.npz")
    for k in wa.files:
        np.testing.assert_allclose(wa[k], wb[k], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.long
def test_every_checkpoint_holds_all_layers_at_one_epoch(small_graph, tmp_path, mode):
    """Checkpoints taken while training runs on (async: chunks up to S epochs ahead) are consistent:
    every layer at the version that ended the checkpoint's epoch, whatever the epoch."""
    parts = tmp_path / "parts"
    run(small_graph, tmp_path, "r", parts, epochs=7, layers=3, hidden=8, checkpoint_every=1, mode=mode, staleness=2,
        chunks=4)
    folder = tmp_path / "r" / "checkpoints"
    for f in sorted(folder.glob("epoch-*.npz")):
        with np.load(f) as z:
            epoch = int(z["epoch"])
            assert [int(z[f"W{l}:version"]) for l in range(3)] == [epoch] * 3, f.name
            assert [float(z[f"W{l}:adam_step"]) for l in range(3)] == [epoch] * 3
    assert len(list(folder.glob("epoch-*.npz"))) == 7
    for log in (tmp_path / "r" / "logs").glob("*.log"):  # the driver's releases of recorded epochs were taken
        assert not re.search(r"message #\d+ refused|refused messages", log.read_text()), log.name


def test_latest_json_cannot_point_outside_its_folder(tmp_path):
    """A checkpoint folder someone else can write must not make a resume read or write elsewhere."""
    root = tmp_path / "ck"
    save_checkpoint(str(root), 2, {"W0": np.ones((2, 2), np.float32)}, JOB)
    latest = json.loads((root / "latest.json").read_text())
    secret = tmp_path / "elsewhere.npz"
    np.savez(secret, epoch=np.array(2), W0=np.zeros((2, 2), np.float32))
    for name in ["../elsewhere.npz", str(secret), "epoch-000002.npz/../../elsewhere.npz", "epoch-2.npz", "latest.json"]:
        (root / "latest.json").write_text(json.dumps(latest | {"file": name}))
        with pytest.raises(DataError, match="is not a checkpoint file name"):
            load_checkpoint(str(root))
    (root / "latest.json").write_text(json.dumps(latest | {"previous": [latest | {"file": "../elsewhere.npz"}]}))
    with pytest.raises(DataError, match="is not a checkpoint file name"):  # an index with a bad entry: refused whole
        load_checkpoint(str(root))


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
    """After a crash the newest file can be cut short or corrupt: the one before it is used, and said."""
    root = str(tmp_path / "ck")
    for epoch in (1, 2, 3):
        save_checkpoint(root, epoch, {"W0": np.full((2, 2), epoch, np.float32)}, JOB)
    (tmp_path / "ck" / "epoch-000003.npz").write_bytes(b"cut short")
    got = load_checkpoint(root)
    assert int(got["epoch"]) == 2 and got["W0"][0, 0] == 2
    assert "epoch-000003.npz: missing or does not match latest.json; resuming from epoch-000002.npz" in caplog.text
    (tmp_path / "ck" / "epoch-000002.npz").unlink()
    assert int(load_checkpoint(root)["epoch"]) == 1
    (tmp_path / "ck" / "epoch-000001.npz").write_bytes(b"")
    with pytest.raises(DataError, match="no intact checkpoint"):
        load_checkpoint(root)


def test_checkpoints_are_flushed_to_disk_before_they_are_named(tmp_path, monkeypatch):
    """A rename without fsync can survive a power loss while the file's blocks do not: latest.json would
    then name a truncated file. The file is fsynced before its rename, and the folder after it."""
    import os

    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", str(b))) or replace(a, b))
    root = tmp_path / "ck"
    save_checkpoint(str(root), 4, {"W0": np.ones(3, np.float32)}, JOB)
    for name in ("epoch-000004.npz", "latest.json"):
        at = events.index(("replace", str(root / name)))
        assert events[at - 1][0] == "fsync" and events[at - 1][1].startswith(str(root / f".{name}."))  # its temp file
        assert events[at + 1] == ("fsync", str(root))  # then the folder's entry


def test_resume_refuses_checkpoints_of_other_data(small_graph, tmp_path, capsys):
    """A dataset re-prepared with the same dimensions (or a shared --checkpoint-dir) must not resume
    silently from someone else's weights: one line, exit 2, the record untouched."""
    from dorylus_py.data import SynthConfig, generate

    store = tmp_path / "parts"
    prepare(small_graph, store, 2)
    out = tmp_path / "run"
    train = ["train", "--backend", "cpu", "--data", str(store), "--checkpoint-every", "1", "--quiet", "--out", str(out)]
    assert main([*train, "--epochs", "2"]) == 0
    metrics = (out / "metrics.jsonl").read_text()
    other = generate(SynthConfig(nodes=600, edges=6_000, features=16, classes=4, seed=4))  # same shape, other data
    prepare(other, store, 2, overwrite=True)
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--epochs", "4"]) == 2  # not the data config.json notes
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "parts: not the dataset the run in" in err and "\n" not in err
    assert main(["train", "--resume", str(out), "--epochs", "4", "--data", str(store)]) == 2  # named: the checkpoints
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "belong to another job (the prepared data differs" in err and "\n" not in err
    assert (out / "metrics.jsonl").read_text() == metrics
    prepare(small_graph, store, 2, overwrite=True)  # the data it was made with: resumed
    assert main(["train", "--resume", str(out), "--epochs", "3"]) == 0
