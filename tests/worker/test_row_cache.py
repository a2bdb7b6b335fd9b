"""A warm worker's static-row cache: bounded by bytes, once full it keeps what it holds, one block per
chunk and tensor name (a new token for the same chunk replaces the old rows); against a real graph
server, a lease that holds a chunk's rows is sent none and its runner puts them back, bit for bit."""

import numpy as np
import pytest
import torch

from dorylus_py.protocol import Message, ProtocolError, Session
from dorylus_py.protocol.transport import Plain
from dorylus_py.worker import task_runner
from dorylus_py.worker.row_cache import RowCache
from dorylus_py.worker.task_runner import TaskAborted, TaskRunner
from tests.clients import KEY, driver  # noqa: F401  (a fixture)
from tests.graph_servers import TASK, hello, leave, pump, served  # noqa: F401  (a fixture)
from tests.worker import event_for


def rows(n: int, value: float = 0.0) -> np.ndarray:
    return np.full((n, 25), value, np.float32)  # n x 100 bytes


def test_a_full_cache_keeps_what_it_holds_so_a_cycle_of_chunks_still_hits():
    cache = RowCache(1000)
    hits = 0
    for epoch in range(3):  # chunks 0, 1, 2 come round every epoch; two fit
        for chunk in range(3):
            hits += bool(cache.held(("gs", 0, chunk)))
            cache.keep(("gs", 0, chunk), "P", f"t{chunk}", rows(4, chunk))  # 400 bytes each
    assert cache.nbytes == 800 and len(cache) == 2 and cache.held(("gs", 0, 2)) == {}
    assert hits == 4  # chunks 0 and 1 in epochs 2 and 3 (least recently used out would hit none)
    cache.resize(500)  # a smaller cap drops the oldest
    assert cache.held(("gs", 0, 0)) == {} and cache.held(("gs", 0, 1))["P"][0] == "t1" and cache.nbytes == 400


def test_a_new_token_replaces_the_slots_rows_and_oversized_rows_are_not_kept():
    cache = RowCache(1000)
    cache.keep(("gs", 0, 0), "P", "old", rows(4, 1.0))
    cache.keep(("gs", 0, 0), "P", "new", rows(4, 2.0))
    token, held = cache.held(("gs", 0, 0))["P"]
    assert token == "new" and held[0, 0] == 2.0 and cache.nbytes == 400
    cache.keep(("gs", 0, 1), "P", "huge", rows(11))
    assert cache.held(("gs", 0, 1)) == {} and cache.nbytes == 400
    cache.keep(("gs", 1, 0), "P", "other server", rows(4))  # the same chunk of another server is another slot
    assert len(cache) == 2


def test_held_rows_stay_with_the_caller_when_evicted_and_a_zero_cap_empties_the_cache():
    cache = RowCache(1000)
    cache.keep(("gs", 0, 0), "P", "t", rows(4, 7.0))
    held = cache.held(("gs", 0, 0))
    cache.resize(0)
    assert len(cache) == 0 and cache.nbytes == 0 and held["P"][1][0, 0] == 7.0
    cache.keep(("gs", 0, 0), "P", "t", rows(1))
    assert len(cache) == 0  # nothing fits in 0 bytes


def _runner(monkeypatch, cache, graph_server="tcp://gs") -> TaskRunner:
    """A lease's runner with ``cache`` as its container's, and a layer's weights that need no weight server."""
    monkeypatch.setattr(task_runner, "_row_cache", cache)
    runner = TaskRunner(event_for(graph_server, 1), Session(KEY), Plain.of_job(KEY))
    monkeypatch.setattr(runner, "_weights", lambda ref, task: ({"version": 0}, {"W": torch.ones(16, 8)}))
    return runner


def _task(static, tensors, chunk: int = 0) -> Message:
    return Message("task", {"lease": "l1", "task": dict(TASK, chunk=chunk), "ws": [0], "id_start": 0, "edge_start": 0,
                            "ghost_edge_start": 0, "static": static}, tensors)


def test_the_worker_uses_held_rows_only_under_the_token_the_server_named(monkeypatch):
    cache = RowCache(1 << 20)
    cache.keep(("tcp://gs", 0, 0), "P", "mine", np.full((2, 16), 3.0, np.float32))
    runner = _runner(monkeypatch, cache)
    assert runner.held() == ["mine"]
    out = runner.run(_task({"P": "mine"}, {}))
    np.testing.assert_array_equal(out.tensors["Z"], np.full((2, 8), 48.0, np.float32))  # 16 x 3.0 per row
    fresh = np.full((2, 16), 5.0, np.float32)  # the server's token changed (a restart on other data)
    runner.run(_task({"P": "theirs"}, {"P": fresh}))
    assert cache.held(("tcp://gs", 0, 0))["P"][0] == "theirs" and runner.held() == ["theirs"]


@pytest.mark.parametrize("static", ["x", 5, [["P", "t"]], {"P": 5}, {"P": None}, {"P": "not held"}, {"Q": "mine"},
                                    {"P": ["mine"]}])
def test_a_malformed_or_unheld_static_field_fails_the_task_and_nothing_else(monkeypatch, static):
    cache = RowCache(1 << 20)
    cache.keep(("tcp://gs", 0, 0), "P", "mine", np.zeros((2, 16), np.float32))
    with pytest.raises((TaskAborted, ProtocolError)):
        _runner(monkeypatch, cache).run(_task(static, {}))


def test_any_json_as_the_static_field_is_used_or_fails_the_task(monkeypatch):
    from tests.cluster.fuzz_corpus import hypothesis_values

    runner = _runner(monkeypatch, RowCache(1 << 20))
    for value in hypothesis_values(300):
        try:
            runner.run(_task(value, {"P": np.zeros((1, 16), np.float32)}))
        except (TaskAborted, ProtocolError):
            pass


def test_a_lease_that_holds_the_rows_is_not_sent_them_and_computes_the_same(served, monkeypatch):
    gs, client = served()
    cache = RowCache(1 << 20)
    first, second = gs.platform.events
    cold = hello(gs, client, first.lease, want=2)
    runner = _runner(monkeypatch, cache, gs.node.address)
    cold_out = [runner.run(t) for t in cold]
    assert len(cache) == 2 and sorted(runner.held()) == sorted(t["static"]["P"] for t in cold)
    assert leave(gs, client, first.lease)[0].op == "release"  # both tasks back in the queue, for the next lease
    warm = hello(gs, client, second.lease, want=2, have=runner.held())
    assert all("P" not in t.tensors for t in warm)
    warm_out = [runner.run(t) for t in warm]
    for a, b in zip(cold_out, warm_out):
        np.testing.assert_array_equal(a.tensors["Z"], b.tensors["Z"])
    assert task_runner._row_cache_of(0) is None and len(cache) == 0  # a later event that turns the cache off empties it
