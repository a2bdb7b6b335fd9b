"""A checkpoint folder is input like any other: whoever can write it (a shared --checkpoint-dir, an S3
prefix) must not make a resume exhaust memory, crash, read outside it or take another job's weights."""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from dorylus_py.checkpoint import load_checkpoint, save_checkpoint
from dorylus_py.errors import DataError
from tests.security.cli import dorylus, refused

JOB = {"store": "0" * 32, "model": "gcn", "widths": [4, 3], "partitions": 1}
SHAPES = {"W0": (4, 3)}  # the model's tensors, as the driver passes them


def state(epoch: int) -> dict:
    w = np.full((4, 3), epoch, np.float32)
    return {"W0:W": w, "W0:adam_m": w, "W0:adam_v": w, "W0:adam_step": np.array(float(epoch)),
            "W0:version": np.array(epoch, np.int64)}


@pytest.fixture()
def root(tmp_path):
    """Checkpoints of epochs 1 and 2; the tests forge the newest."""
    for epoch in (1, 2):
        save_checkpoint(str(tmp_path / "ck"), epoch, state(epoch), JOB)
    return tmp_path / "ck"


def forge(root, data: bytes, **index) -> None:
    """Replace the newest checkpoint by ``data`` and make latest.json vouch for it (size, SHA-256)."""
    latest = json.loads((root / "latest.json").read_text())
    (root / latest["file"]).write_bytes(data)
    latest |= {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} | index
    (root / "latest.json").write_text(json.dumps(latest))


def npy_header(shape, dtype="<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def npz(members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as z:
        for name, data in members.items():
            z.writestr(name + ".npy", data)
    return buf.getvalue()


def epoch_member(epoch: int) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.array(epoch, np.int64))
    return buf.getvalue()


def bounded_load(root, shapes):
    """load_checkpoint, with Python's (and numpy's) peak allocation and the time it took."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        got = load_checkpoint(str(root), JOB, shapes)
        return got, tracemalloc.get_traced_memory()[1], time.perf_counter() - t0
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("shapes", [SHAPES, None], ids=["model shapes", "file size"])
def test_a_zip_bomb_is_refused_before_it_is_inflated(root, caplog, shapes):
    """256 MiB of zeros deflated to a fraction of a MB, vouched for by latest.json: refused from the
    member's declared size, without inflating it; the checkpoint before is used."""
    n = 64 * 2**20  # float32s
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("epoch.npy", epoch_member(2))
        with z.open("W0:W.npy", "w", force_zip64=True) as m:
            m.write(npy_header((n,)))
            zeros = bytes(2**20)
            for _ in range(n * 4 // len(zeros)):
                m.write(zeros)
    assert len(buf.getvalue()) < 2**20
    forge(root, buf.getvalue())
    got, peak, seconds = bounded_load(root, shapes)
    assert int(got["epoch"]) == 1 and peak < 16 * 2**20, peak
    assert "epoch-000002.npz" in caplog.text and "resuming from epoch-000001.npz" in caplog.text


@pytest.mark.parametrize("shapes", [SHAPES, None], ids=["model shapes", "file size"])
def test_a_header_claiming_2_to_the_42_floats_is_refused_at_once(root, caplog, shapes):
    forge(root, npz({"epoch": epoch_member(2), "W0:W": npy_header((2**42,)) + bytes(48)}))
    got, peak, _ = bounded_load(root, shapes)
    assert int(got["epoch"]) == 1 and peak < 16 * 2**20
    assert "its header claims shape (4398046511104,)" in caplog.text


def test_an_array_larger_than_the_model_is_refused(root, caplog):
    """Consistent sizes, but 10,000 floats where the model has 12: the model's shapes bound it."""
    arr = io.BytesIO()
    np.lib.format.write_array(arr, np.zeros(10_000, np.float32))
    forge(root, npz({"epoch": epoch_member(2), "W0:W": arr.getvalue()}))
    assert int(load_checkpoint(str(root), JOB, SHAPES)["epoch"]) == 1
    assert "more than the model's 12" in caplog.text


def test_any_failure_reading_the_newest_falls_back(root, caplog):
    """A stored member whose bytes fail their CRC makes zipfile raise its own error, not a DataError:
    the checkpoint is damaged all the same, and the one before is used."""
    good = io.BytesIO()
    np.savez(good, epoch=np.array(2, np.int64), **state(2))
    data = bytearray(good.getvalue())
    at = data.index(np.full((4, 3), 2, np.float32).tobytes())
    data[at] ^= 0xFF  # inside W0:W's data, after its header
    forge(root, bytes(data))
    assert int(load_checkpoint(str(root), JOB, SHAPES)["epoch"]) == 1
    assert "BadZipFile" in caplog.text


@pytest.mark.parametrize("bad", [{"previous": [1]}, {"previous": "x"}, {"fingerprint": None}, {"epoch": "2"},
                                 {"fingerprint": JOB | {"widths": ["4", 3]}}, {"bytes": 2.5}, {"extra": 1}])
def test_latest_json_is_checked_against_its_schema(root, bad):
    """A malformed index is refused when read, at --resume, and a later save does not crash on it."""
    latest = json.loads((root / "latest.json").read_text())
    (root / "latest.json").write_text(json.dumps(latest | bad))
    with pytest.raises(DataError, match="latest.json"):
        load_checkpoint(str(root), JOB)
    with pytest.raises(DataError, match="latest.json"):
        save_checkpoint(str(root), 3, state(3), JOB)


def test_a_missing_fingerprint_is_an_error_not_a_skipped_check(root):
    latest = json.loads((root / "latest.json").read_text())
    del latest["fingerprint"]
    (root / "latest.json").write_text(json.dumps(latest))
    with pytest.raises(DataError, match="no fingerprint"):
        load_checkpoint(str(root), JOB)
    with pytest.raises(DataError, match="no fingerprint"):
        load_checkpoint(str(root))  # nor without a job to compare with


def test_symlinks_are_refused(root, tmp_path, caplog):
    """The newest file pointing outside the folder is passed over (the one before is used); a linked
    latest.json is refused."""
    outside = tmp_path / "outside.npz"
    os.replace(root / "epoch-000002.npz", outside)
    os.symlink(outside, root / "epoch-000002.npz")  # same bytes: only the link is wrong
    assert int(load_checkpoint(str(root), JOB)["epoch"]) == 1
    assert "symlink" in caplog.text
    os.replace(root / "latest.json", tmp_path / "latest.json")
    os.symlink(tmp_path / "latest.json", root / "latest.json")
    with pytest.raises(DataError, match="symlink"):
        load_checkpoint(str(root), JOB)


def test_only_an_absent_index_is_no_checkpoint_yet(root, tmp_path):
    """A save reads the index it extends: a damaged or unreadable one is an error (issue 42), never taken
    for a first checkpoint that would drop the listed ones."""
    (root / "latest.json").write_text("{ cut short")
    with pytest.raises(DataError, match="not valid JSON"):
        save_checkpoint(str(root), 3, state(3), JOB)
    (root / "latest.json").unlink()
    (root / "latest.json").mkdir()
    with pytest.raises(DataError, match="latest.json"):
        save_checkpoint(str(root), 3, state(3), JOB)
    fresh = tmp_path / "fresh"
    save_checkpoint(str(fresh), 1, state(1), JOB)  # truly absent: the first checkpoint
    assert int(load_checkpoint(str(fresh), JOB)["epoch"]) == 1


@pytest.mark.long
def test_resume_through_the_cli_falls_back_or_refuses_in_one_line(tmp_path):
    """The real --resume: a forged newest checkpoint (2^42 floats) falls back to the one before; an
    index with "previous": [1] is one line, exit 2, before anything is written."""
    assert dorylus("synth", "--out", tmp_path / "g.npz", "--nodes", 300, "--edges", 2000, "--features", 8,
                   "--classes", 3).returncode == 0
    out = tmp_path / "run"
    proc = dorylus("train", "--backend", "cpu", "--graph-servers", 1, "--data", tmp_path / "g.npz", "--epochs", 2,
                   "--checkpoint-every", 1, "--quiet", "--out", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    root = out / "checkpoints"
    forge(root, npz({"epoch": epoch_member(2), "W0:W": npy_header((2**42,)) + bytes(48)}))
    proc = dorylus("train", "--resume", out, "--epochs", 3)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resuming from epoch-000001.npz" in proc.stderr and "Traceback" not in proc.stderr
    latest = json.loads((root / "latest.json").read_text())
    (root / "latest.json").write_text(json.dumps(latest | {"previous": [1]}))
    metrics = (out / "metrics.jsonl").read_text()
    refused(dorylus("train", "--resume", out, "--epochs", 4), "latest.json")
    assert (out / "metrics.jsonl").read_text() == metrics


def test_a_fifo_in_place_of_a_checkpoint_file_or_the_index_does_not_hang(root, caplog):
    """Opened without blocking and refused as not a regular file: a newest checkpoint that is a FIFO is
    passed over, an index that is one stops the resume with one line (a plain open waits for a writer)."""
    import threading

    def within(fn, seconds=30):
        got = []
        thread = threading.Thread(target=lambda: got.append(_outcome(fn)), daemon=True)
        thread.start()
        thread.join(seconds)
        assert got, f"still waiting after {seconds} s"
        return got[0]

    (root / "epoch-000002.npz").unlink()
    os.mkfifo(root / "epoch-000002.npz")
    assert int(within(lambda: load_checkpoint(str(root), JOB, SHAPES))["epoch"]) == 1
    assert "epoch-000002.npz: not a regular file (a FIFO)" in caplog.text
    (root / "latest.json").unlink()
    os.mkfifo(root / "latest.json")
    error = within(lambda: load_checkpoint(str(root), JOB))
    assert isinstance(error, DataError) and "latest.json: not a regular file (a FIFO)" in str(error)


def _outcome(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001  (the caller looks at what it was)
        return e
