"""What the driver accepts from a graph server: every field of an epoch's statistics checked, task rows
bounded in bytes and depth (the driver parsed a jsonl blob of up to 2 GiB with plain json.loads and
converted fields unguarded: a bad field raised past its loop)."""

import numpy as np
import pytest

from dorylus_py.cluster import reports
from dorylus_py.protocol import Message, ProtocolError

GOOD = {"rank": 1, "epoch": 3, "loss_sum": 2.5, "correct": [1, 2, 3], "counts": [4, 5, 6], "epoch_s": 0.1,
        "relaunches": 0, "duplicates": 0, "gradients_sent": 4, "gradients_resent": 0, "refused_messages": 0,
        "usage": {"bytes": 10, "cpu_s": 0.5}}


def test_epoch_stats_are_checked_field_by_field():
    assert reports.epoch_stats(Message("epoch_stats", GOOD), 1, 10)["loss_sum"] == 2.5
    for field, bad in [("rank", 0), ("epoch", 11), ("epoch", "3"), ("epoch", 0), ("loss_sum", float("nan")),
                       ("loss_sum", "1"), ("correct", [1, 2]), ("correct", [1, 2, -3]), ("counts", None),
                       ("relaunches", 1.5), ("duplicates", True), ("gradients_sent", None), ("gradients_resent", -1), ("refused_messages", None), ("usage", [1]), ("usage", {"x": "y"}),
                       ("usage", {str(i): 1 for i in range(17)}), ("epoch_s", None)]:
        with pytest.raises(ProtocolError):
            reports.epoch_stats(Message("epoch_stats", GOOD | {field: bad}), 1, 10)


def test_task_rows_are_bounded_before_they_are_parsed(monkeypatch):
    rows = b'{"kind": "fwd", "epoch": 1}\n{"kind": "bwd", "epoch": 1}\n'
    assert [r["kind"] for r in reports.task_rows(Message("tasks", {}, {"jsonl": np.frombuffer(rows, np.uint8)}))] == ["fwd", "bwd"]
    for blob in [b"[" * 100_000, b'{"a": 1e999}', b"[1, 2]", b'{"s": "' + b"x" * 70_000 + b'"}', b"\xff"]:
        with pytest.raises(ProtocolError):
            reports.task_rows(Message("tasks", {}, {"jsonl": np.frombuffer(blob, np.uint8)}))
    monkeypatch.setattr(reports, "MAX_TASKS_BYTES", 100)
    with pytest.raises(ProtocolError, match="exceed 100"):
        reports.task_rows(Message("tasks", {}, {"jsonl": np.frombuffer(rows * 2, np.uint8)}))
    with pytest.raises(ProtocolError, match="jsonl tensor"):
        reports.task_rows(Message("tasks", {}, {"jsonl": np.zeros(3, np.float32)}))
    assert reports.frozen_at(Message("switch", {"frozen_at": 4}), 10) == 4
    with pytest.raises(ProtocolError):
        reports.frozen_at(Message("switch", {"frozen_at": "4"}), 10)


def test_a_weight_servers_counts_are_counts():
    good = {"updates": 4, "duplicates": 0, "refused": 2, "refused_messages": 3}
    assert reports.weight_server_counts(Message("ok", good)) == good
    for field, bad in [("updates", None), ("refused", -1), ("refused_messages", 1.5), ("duplicates", "0")]:
        with pytest.raises(ProtocolError, match=field):
            reports.weight_server_counts(Message("ok", good | {field: bad}))
