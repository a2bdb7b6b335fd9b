"""A warm worker's static-row cache: bounded by bytes, once full it keeps what it holds, one block per
chunk and tensor name (a new token for the same chunk replaces the old rows); against a real graph
server, the worker (``handler._pull_rows``) puts the held rows back, bit for bit."""

import threading

import numpy as np
import pytest

from dorylus_py.worker import handler as worker
from dorylus_py.worker.row_cache import RowCache
from dorylus_py.protocol.transport import Plain
from tests.clients import KEY, driver  # noqa: F401  (a fixture)
from tests.graph_servers import TASK, served  # noqa: F401  (a fixture)
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


def _pull_with_reply(monkeypatch, cache, reply):
    """The worker's side of a pull, against a graph server that answers ``reply``; returns the tensors
    and the pull it sent."""
    from dorylus_py.worker import handler as worker

    sent = []
    monkeypatch.setattr(worker, "_row_cache", cache)
    _, tensors = worker._pull_rows(event_for("tcp://gs", 1, **TASK), TASK, lambda msg: sent.append(msg) or reply)
    return tensors, sent[0]


def test_the_worker_uses_held_rows_only_under_the_token_it_named(monkeypatch):
    from dorylus_py.protocol import Message

    cache = RowCache(1 << 20)
    cache.keep(("tcp://gs", 0, 0), "P", "mine", rows(2, 3.0))
    tensors, pull = _pull_with_reply(monkeypatch, cache, Message("rows", {"static": {"P": "mine"}}, {"dZ": rows(2)}))
    assert pull["have"] == ["mine"] and tensors["P"][0, 0] == 3.0 and "dZ" in tensors
    fresh = rows(2, 5.0)  # the server's token changed (a restart on other data): new rows replace the old
    tensors, _ = _pull_with_reply(monkeypatch, cache, Message("rows", {"static": {"P": "theirs"}}, {"P": fresh}))
    assert tensors["P"] is fresh and cache.held(("tcp://gs", 0, 0))["P"][0] == "theirs"


@pytest.mark.parametrize("static", ["x", 5, [["P", "t"]], {"P": 5}, {"P": None}, {"P": "not held"}, {"Q": "mine"},
                                    {"P": ["mine"]}])
def test_a_malformed_or_unheld_static_field_aborts_the_task_and_nothing_else(monkeypatch, static):
    from dorylus_py.protocol import Message
    from dorylus_py.worker.handler import TaskAborted

    cache = RowCache(1 << 20)
    cache.keep(("tcp://gs", 0, 0), "P", "mine", rows(2))
    with pytest.raises(TaskAborted, match="pull_rows"):
        _pull_with_reply(monkeypatch, cache, Message("rows", {"static": static}, {}))


def test_any_json_as_the_static_field_is_used_or_aborts_the_task(monkeypatch):
    from dorylus_py.protocol import Message
    from dorylus_py.worker.handler import TaskAborted
    from tests.cluster.fuzz_corpus import hypothesis_values

    for value in hypothesis_values(300):
        try:
            _pull_with_reply(monkeypatch, RowCache(1 << 20), Message("rows", {"static": value}, {"P": rows(1)}))
        except TaskAborted:
            pass


def test_the_worker_puts_its_held_rows_back_bit_for_bit(served, monkeypatch):
    gs, client = served()
    cache = RowCache()
    monkeypatch.setattr(worker, "_row_cache", cache)
    event = event_for(gs.node.address, 1, **TASK)
    got = []

    def pulls():
        sock = worker._socket(gs.node.address, Plain.of_job(KEY))  # past the server's gate
        try:
            for _ in range(2):
                reply, tensors = worker._pull_rows(event, TASK, lambda msg: worker._request(sock, msg, client.session))
                got.append((reply, {k: np.array(v) for k, v in tensors.items()}))
        finally:
            sock.close(0)

    t = threading.Thread(target=pulls)
    t.start()
    while t.is_alive():
        gs.node.serve_once(gs.handle, 20)
    (cold, cold_rows), (warm, warm_rows) = got
    assert "P" in cold.tensors and "P" not in warm.tensors and len(cache) == 1
    np.testing.assert_array_equal(warm_rows["P"], cold_rows["P"])
    assert warm_rows["P"].dtype == np.float32

    assert worker._row_cache_of(0) is None and len(cache) == 0  # a later event that turns the cache off empties it
