"""However a run ends, its record ends with summary.json and a status, and `dorylus report` reads it:
completed, stopped early at --target-acc, interrupted with Ctrl-C (on a terminal, with a progress bar),
failed; --overwrite replaces a record and nothing else."""

import json
import os
import select
import signal
import sys
import time

import numpy as np
import pytest

from dorylus_py.cli import main
from dorylus_py.errors import DataError
from dorylus_py.models.gcn import GCN


def read(run_dir, name):
    """A run record's JSON file, or the rows of a .jsonl one."""
    text = (run_dir / name).read_text()
    return json.loads(text) if name.endswith(".json") else [json.loads(line) for line in text.splitlines()]


def test_target_acc_stops_the_reference_trainer_and_the_record_is_complete(graph_npz, tmp_path, capsys):
    assert main(["train", "--data", str(graph_npz), "--epochs", "200", "--target-acc", "0.45", "--quiet",
                 "--out", str(tmp_path / "run")]) == 0
    metrics, summary = read(tmp_path / "run", "metrics.jsonl"), read(tmp_path / "run", "summary.json")
    assert metrics[-1]["val_acc"] >= 0.45 and all(m["val_acc"] < 0.45 for m in metrics[:-1]) and len(metrics) < 200
    assert summary["status"] == "completed" and summary["epochs"] == len(metrics)
    assert summary["wall_s"] == metrics[-1]["wall_s"]  # one clock: what `report` and the CLI's last line show
    assert f"in {summary['wall_s']:.1f} s" in capsys.readouterr().out
    assert summary["best_epoch"] == len(metrics)  # the first epoch at the target is the best so far
    best, final = np.load(tmp_path / "run" / "best_weights.npz"), np.load(tmp_path / "run" / "weights.npz")
    assert sorted(best.files) == ["W0", "W1"] and all(np.array_equal(best[k], final[k]) for k in best.files)


def test_a_failing_run_leaves_a_failed_summary_and_stays_reportable(graph_npz, tmp_path, capsys, monkeypatch):
    forward, calls = GCN.forward, []

    def failing_forward(self, *args, **kwargs):  # the fourth forward (epoch 2's evaluation) meets bad data
        calls.append(1)
        if len(calls) == 4:
            raise DataError("features.npy: row 17 is not finite")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(GCN, "forward", failing_forward)
    assert main(["train", "--data", str(graph_npz), "--epochs", "5", "--quiet", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == "error: features.npy: row 17 is not finite\n"
    summary = read(tmp_path / "run", "summary.json")
    assert summary["status"] == "failed: features.npy: row 17 is not finite" and summary["epochs"] == 1
    assert (tmp_path / "run" / "best_weights.npz").exists()  # epoch 1 was evaluated
    monkeypatch.undo()
    assert main(["report", str(tmp_path / "run")]) == 0
    assert "failed" in capsys.readouterr().out


def test_overwrite_replaces_only_a_run_record(graph_npz, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--data", str(graph_npz), "--epochs", "3", "--quiet", "--out", str(run)]) == 0
    (run / "stale.txt").write_text("from the old run")
    assert main(["train", "--data", str(graph_npz), "--epochs", "2", "--quiet", "--out", str(run)]) == 2
    assert "--overwrite" in capsys.readouterr().err and len(read(run, "metrics.jsonl")) == 3
    assert main(["train", "--data", str(graph_npz), "--epochs", "2", "--quiet", "--out", str(run), "--overwrite"]) == 2
    assert "(stale.txt)" in capsys.readouterr().err and (run / "stale.txt").exists()  # not the run's: kept
    (run / "stale.txt").unlink()
    (run / "hosts.json").write_text("{}")  # what a scale-model run leaves: the run's too
    assert main(["train", "--data", str(graph_npz), "--epochs", "2", "--quiet", "--out", str(run), "--overwrite"]) == 0
    assert len(read(run, "metrics.jsonl")) == 2 and not (run / "hosts.json").exists()
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("not a run record")
    assert main(["train", "--data", str(graph_npz), "--epochs", "2", "--quiet", "--out", str(other), "--overwrite"]) == 2
    assert "not a run record" in capsys.readouterr().err and (other / "mine.txt").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pseudo-terminal test")
def test_ctrl_c_on_a_terminal_ends_the_bar_then_one_error_line(graph_npz, tmp_path):
    """Under a terminal the bar is drawn; Ctrl-C closes it, then the error stands on its own line, and
    nothing is drawn after it. The record says `interrupted` and `dorylus report` reads it."""
    import fcntl
    import pty
    import struct
    import termios

    run = tmp_path / "run"
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on a terminal of 100 columns
        os.execvp(sys.executable, [sys.executable, "-m", "dorylus_py", "train", "--data", str(graph_npz),
                                   "--epochs", "1000000", "--out", str(run)])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    out, deadline = b"", time.monotonic() + 120
    try:
        while time.monotonic() < deadline and not (b"epoch/s" in out and len(read_lines(run)) >= 2):
            chunk = read_some(fd, 0.2)
            assert chunk != b"", f"the CLI ended before it was interrupted: {out[-400:]!r}"
            out += chunk or b""
        os.kill(pid, signal.SIGINT)
        while chunk := read_some(fd, 30):
            out += chunk
        code = wait_or_kill(pid, 30)
    finally:
        os.close(fd)
    assert code == 130
    text = out.decode(errors="replace")
    assert text.endswith(f"\r\nerror: interrupted; run record so far in {run}\r\n"), text[-400:]
    assert "train:" in text.split("error: interrupted")[0]  # the bar was there, above the line
    summary = read(run, "summary.json")
    assert summary["status"] == "interrupted" and summary["epochs"] == len(read(run, "metrics.jsonl")) >= 2
    assert (run / "best_weights.npz").exists()
    assert main(["report", str(run)]) == 0


def read_lines(run):
    path = run / "metrics.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def read_some(fd: int, timeout_s: float) -> bytes | None:
    """What the terminal gives within ``timeout_s``: bytes; b"" once the child has closed it; None if quiet."""
    if not select.select([fd], [], [], timeout_s)[0]:
        return None
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the child is gone
        return b""


def wait_or_kill(pid: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the CLI did not exit after Ctrl-C")


def test_a_run_that_refused_or_dropped_anything_says_so_in_one_line():
    """Issue 52: a frozen run said ``completed``, its one trace a counter. The summary's three counts
    (``cli_train`` prints the line at the end; tests/security/test_gradients_live.py sees it there)."""
    from dorylus_py.training.record import refusals

    clean = {"refused_gradients": 0, "duplicate_gradients": 0, "refused_messages": 0}
    assert refusals(clean) is None and refusals({"epochs": 3}) is None  # a reference run counts none
    for field in clean:
        line = refusals(clean | {field: 4})
        assert line and "\n" not in line and " 4 " in line and "key" in line, field
