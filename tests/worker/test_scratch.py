"""A tensor thread's reused copy of a task's rows (worker/scratch.py): each task's rows land in the same
memory, same shapes and dtypes; a larger task gets a new buffer without touching copies still held; a
result that shares the copies is copied out, so the next task cannot change it (a real TaskRunner)."""

import numpy as np
import torch

from dorylus_py.protocol import Message, Session
from dorylus_py.protocol.transport import Plain
from dorylus_py.worker import task_runner
from dorylus_py.worker.scratch import ALIGN, RowScratch
from dorylus_py.worker.task_runner import TaskRunner
from tests.clients import KEY
from tests.graph_servers import TASK
from tests.worker import event_for


def test_rows_are_copied_aligned_with_their_dtypes_into_one_reused_buffer():
    scratch = RowScratch()
    source = {"P": np.arange(12, dtype=np.float32).reshape(3, 4), "ids": np.arange(5, dtype=np.int64),
              "mask": np.array([True, False, True]), "T": np.arange(8, dtype=np.float64).reshape(4, 2)[::2]}
    first = scratch.copy(source)
    for k, a in source.items():
        np.testing.assert_array_equal(first[k], a)
        assert first[k].dtype == a.dtype and first[k].ctypes.data % ALIGN == 0 and not np.shares_memory(first[k], a)
    again = scratch.copy({"P": source["P"] + 1})
    assert again["P"].ctypes.data == first["P"].ctypes.data  # the same pages: no new ones to fault in
    np.testing.assert_array_equal(again["P"], source["P"] + 1)
    bigger = scratch.copy({"P": np.ones((100, 100), np.float32)})
    assert not np.shares_memory(bigger["P"], again["P"])
    np.testing.assert_array_equal(again["P"], source["P"] + 1)  # a copy still held is left as it was
    assert scratch.copy({"E": np.zeros((0, 7), np.float32)})["E"].shape == (0, 7)


def test_rows_that_fill_the_buffer_to_its_last_byte_fit_whatever_its_alignment():
    for offset in range(0, ALIGN, 16):  # malloc aligns to 16: the first copy may start up to 48 bytes in
        scratch = RowScratch()
        scratch._buf = np.empty(ALIGN * 3 + offset, np.uint8)[offset:]
        for rows in (1, 2, 3, 4, 5):  # 64-byte rows: each pads to exactly the buffer the one before left
            source = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
            np.testing.assert_array_equal(scratch.copy({"P": source})["P"], source)


def test_only_tensors_that_share_the_buffer_are_copied_out():
    scratch = RowScratch()
    rows = scratch.copy({"P": np.ones((4, 4), np.float32)})
    view, own = torch.from_numpy(rows["P"])[1:, ::2], torch.zeros(3)
    out = scratch.owned({"view": view, "own": own, "empty": torch.zeros(0)})
    assert out["own"] is own and out["view"] is not view and torch.equal(out["view"], view)
    rows["P"][:] = 7  # the next task's rows
    assert torch.equal(out["view"], torch.ones(3, 2))


def test_a_result_that_passes_rows_through_is_not_changed_by_the_next_task(monkeypatch):
    runner = TaskRunner(event_for("tcp://gs", 0), Session(KEY), Plain.of_job(KEY))
    monkeypatch.setattr(runner, "_weights", lambda ref, task: ({}, {}))
    monkeypatch.setattr(task_runner, "run_task", lambda ctx, rows, weights: ({"Z": rows["P"][1:]}, {}))

    def task(value: float) -> Message:
        return Message("task", {"task": TASK, "ws": [], "id_start": 0, "edge_start": 0, "ghost_edge_start": 0},
                       {"P": np.full((3, 4), value, np.float32)})

    first = runner.run(task(1.0), copy_rows=True)
    runner.run(task(2.0), copy_rows=True)
    np.testing.assert_array_equal(first.tensors["Z"], np.full((2, 4), 1.0, np.float32))
