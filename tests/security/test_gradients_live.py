"""Issue 52 item 4 against a real job: a key holder (the job key, and the nonce every task event carries)
froze training by pushing gradients of 1e30 for the 4 task keys of epoch 25 while the job was at epoch 7:
each was answered ``ok``, Adam's second moment overflowed, the loss stayed put, and the run said
``completed`` (its one trace ``duplicate_gradients: 4``, when the real ones came).

Here the same key holder pushes, at epoch 5 or later, gradients for the keys of epoch 25 (1e30, and
zeros) and zeros for the keys of the epoch running (pre-empting the real ones): every push is refused,
being from no graph server's gradient link; the job trains exactly as an undisturbed one (sync: the same
loss every epoch); and the run says what it refused in summary.json and in one line at the end. Two
graph servers of 2 chunks, one weight server, as separate processes from a cluster file
(``test_wire_live.Job``). The unit-level version of each rule: ``tests/cluster/test_servers.py`` and
``tests/weights/test_guard.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from dorylus_py.protocol import Message, Session
from tests.security.test_wire_live import KEY, Job, dealer, parts  # noqa: F401  (a fixture)

EPOCHS = 30  # epoch 25 is one of the job's: its keys pass the check that names a task of this job


def pushes(epoch_running: int) -> list[tuple[list[int], str, dict]]:
    """(key, what, tensors) of the attack, for both layers of the small graph's GCN (16 -> 16 -> 4)."""
    shapes = {0: (16, 16), 1: (16, 4)}
    keys = [[e, s, c] for e in (25, epoch_running) for s in (0, 1) for c in (0, 1)]
    out = []
    for layer, shape in shapes.items():
        for key in keys:
            for value in ((1e30, 0.0) if key[0] == 25 else (0.0,)):
                out.append(({"layer": layer, "version": 0, "key": key}, f"{value:g}",
                            {f"W{layer}.0": np.full(shape, value, np.float32)}))
    return out


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.long
def test_a_key_holder_can_neither_freeze_nor_steer_a_job_and_the_run_says_it_tried(parts, tmp_path):
    job = Job(parts, tmp_path / "attacked", epochs=EPOCHS)
    try:
        job.trains_on(5)
        nonce, to = job.nonce(), job.addresses["ws0"]
        session, sock = Session(KEY, job=nonce), dealer(to)
        attack = pushes(job.epochs() + 1)
        try:
            for i, (fields, _, tensors) in enumerate(attack):
                sock.send_multipart(session.encode(Message("push_grad", fields | {"req": str(i)}, tensors), to))
            replies = {}
            while len(replies) < len(attack) and sock.poll(30_000):
                reply = session.decode(sock.recv_multipart(), session.id)
                replies[reply["req"]] = reply
        finally:
            sock.close()
        assert job.epochs() < EPOCHS, "the job ended before the attack was over: give it more epochs"
        assert len(replies) == len(attack) and all(
            r.op == "error" and "not its gradient link" in r["reason"] for r in replies.values()), replies
    except BaseException:
        job.finish(interrupted=True)
        raise
    job.finish(interrupted=False)
    undisturbed = Job(parts, tmp_path / "undisturbed", epochs=EPOCHS)
    undisturbed.finish(interrupted=False)
    assert losses(job.run) == losses(undisturbed.run)  # sync: bit for bit, every epoch
    summary = json.loads((job.run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == EPOCHS
    assert summary["refused_gradients"] == len(attack) and summary["duplicate_gradients"] == 0
    assert summary["refused_messages"] >= len(attack)
    said = job.log("driver")
    assert re.search(rf"warning: this run refused {len(attack)} gradient\(s\) and \d+ message\(s\) in all", said), said
    clean = json.loads((undisturbed.run / "summary.json").read_text())
    assert (clean["refused_gradients"], clean["refused_messages"], clean["duplicate_gradients"]) == (0, 0, 0)
    assert "warning: this run refused" not in undisturbed.log("driver")  # (a stale hello refused is no sign)
    assert not any(nonce.hex() in job.log(name) for name in ("gs1", "ws0", "driver"))
