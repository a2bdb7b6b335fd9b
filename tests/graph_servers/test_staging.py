"""Result blocks of streamed tasks, held until their commit (``graph_servers/staging.py``)."""

import numpy as np
import pytest

from dorylus_py.pipeline.events import TaskKey
from dorylus_py.protocol import ProtocolError
from graph_servers.staging import BlockStaging


def test_staging_refuses_bad_blocks_and_new_results_past_its_cap():
    key, other = TaskKey("fwd", True, 1, 0, 0), TaskKey("fwd", True, 1, 0, 1)
    one = 10 * (1 + 4 * 4)  # a 10-row partial result, 4 wide
    s = BlockStaging(cap_bytes=2 * one)
    with pytest.raises(ProtocolError, match="expected tensors"):
        s.add((key, 1, "a"), 10, 0, 5, {"Y": np.zeros((5, 4), np.float32)}, {"Z": 4})
    with pytest.raises(ProtocolError, match="float32"):
        s.add((key, 1, "a"), 10, 0, 5, {"Z": np.zeros((5, 4), np.float64)}, {"Z": 4})
    with pytest.raises(ProtocolError, match="no per-row"):
        s.add((key, 1, "a"), 10, 0, 5, {}, {})
    s.add((key, 1, "a"), 10, 0, 5, {"Z": np.ones((5, 4), np.float32)}, {"Z": 4})
    s.add((key, 2, "a"), 10, 0, 10, {"Z": np.zeros((10, 4), np.float32)}, {"Z": 4})
    with pytest.raises(ProtocolError, match="staging is full"):  # the newcomer, not the oldest
        s.add((other, 1, "a"), 10, 5, 10, {"Z": np.zeros((5, 4), np.float32)}, {"Z": 4})
    assert len(s) == 2 and s.nbytes == 2 * one
    assert s.take((key, 3, "a"), {}) == {}  # a kind with no per-row outputs (evaluation) stages nothing
    with pytest.raises(ProtocolError, match="5 rows"):
        s.take((key, 1, "a"), {"Z": 4})
    assert len(s) == 1  # a failed commit's blocks go too
    assert s.take((key, 2, "a"), {"Z": 4})["Z"].shape == (10, 4) and len(s) == 0 and s.nbytes == 0
    s.add((key, 1, "a"), 10, 0, 5, {"Z": np.ones((5, 4), np.float32)}, {"Z": 4})
    s.add((key, 2, "b"), 10, 0, 5, {"Z": np.ones((5, 4), np.float32)}, {"Z": 4})
    s.forget(key, 2)
    assert len(s) == 1
    s.forget(key)
    assert len(s) == 0 and s.nbytes == 0


def test_a_taken_array_is_staged_into_again_only_once_nothing_else_holds_it():
    """A new staging array costs the loop thread a page fault per 4 KiB, so taken ones are reused, but
    never while the result (or a view of it) is still held: a held one keeps its rows."""
    key, s = TaskKey("fwd", True, 1, 0, 0), BlockStaging()
    s.add((key, 1, "a"), 10, 0, 10, {"Z": np.full((10, 4), 1.0, np.float32)}, {"Z": 4})
    held = s.take((key, 1, "a"), {"Z": 4})["Z"]
    view = held[2:4]
    s.add((key, 2, "a"), 10, 0, 10, {"Z": np.full((10, 4), 2.0, np.float32)}, {"Z": 4})
    assert (held == 1.0).all() and (view == 1.0).all()  # still held: a new array was staged into
    second = s.take((key, 2, "a"), {"Z": 4})["Z"]
    assert second is not held and (second == 2.0).all()
    address = second.__array_interface__["data"][0]
    del second
    s.add((key, 3, "a"), 10, 0, 10, {"Z": np.full((10, 4), 3.0, np.float32)}, {"Z": 4})
    third = s.take((key, 3, "a"), {"Z": 4})["Z"]
    assert third.__array_interface__["data"][0] == address and (third == 3.0).all() and (held == 1.0).all()
