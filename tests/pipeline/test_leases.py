"""Which lease runs which copy (``pipeline/leases.py``), without sockets: a lease per copy waiting or out,
up to the pool; two copies out on a lease at most, the least loaded first and, among those, one that
holds the chunk's static rows; copies of a lease that ended come back; a shrunk pool releases idle
leases; copies meant for the server's own threads go only there, outside the pool; and, under random
interleavings, no copy is ever out twice or both out and waiting."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dorylus_py.pipeline.events import TaskKey
from dorylus_py.pipeline.leases import Dispatcher


def copy(chunk: int, attempt: int = 1, kind: str = "fwd"):
    return TaskKey(kind, True, 1, 0, chunk), attempt


def test_a_lease_for_each_copy_up_to_the_pool_and_two_out_on_each():
    d = Dispatcher(size=3, depth=2)
    for c in range(5):
        d.submit(copy(c))
    assert d.to_start() == 3  # five copies, three leases at most
    for lease in "abc":
        d.started(lease, 0.0)
    assert d.to_start() == 0 and d.assign(lambda key: None, 0.0) == []  # none connected yet
    d.hello("a", "peer-a", frozenset(), 1.0)
    d.hello("b", "peer-b", frozenset(), 1.0)
    sent = d.assign(lambda key: None, 1.0)
    assert [(lease.id, c[0].chunk) for lease, c in sent] == [("a", 0), ("b", 1), ("a", 2), ("b", 3)]  # least loaded first
    assert list(d.queue) == [copy(4)] and d.load() == (2, 1, 2)
    d.hello("c", "peer-c", frozenset(), 2.0)
    assert [(lease.id, c[0].chunk) for lease, c in d.assign(lambda key: None, 2.0)] == [("c", 4)]
    assert not d.hello("c", "peer-c2", frozenset(), 2.0) and not d.hello("z", "peer-z", frozenset(), 2.0)
    d.validate()


def test_an_idle_lease_that_holds_the_rows_is_preferred_and_a_busy_one_is_not():
    d = Dispatcher(size=3, depth=2)
    for lease, held in (("a", {"t0"}), ("b", {"t1"}), ("c", set())):
        d.started(lease, 0.0)
        d.hello(lease, lease, frozenset(held), 0.0)
    token = {0: "t0", 1: "t1", 2: "t2"}
    d.submit(copy(1))
    d.submit(copy(0))
    assert [lease.id for lease, _ in d.assign(lambda key: token[key.chunk], 0.0)] == ["b", "a"]
    d.submit(copy(0, kind="bwd"))  # "a" holds its rows but is busy: the idle one gets it, and the rows
    assert [lease.id for lease, _ in d.assign(lambda key: token[key.chunk], 0.0)] == ["c"]
    assert d.finished("b", copy(1), frozenset({"t1", "t2"}), 1.0) and not d.finished("b", copy(1), None, 1.0)
    assert d.leases["b"].held == {"t1", "t2"} and d.leases["b"].idle_since == 1.0


def test_an_ended_lease_gives_back_its_copies_and_a_shrunk_pool_releases_the_idle_ones():
    d = Dispatcher(size=2, depth=2)
    d.submit(copy(0))
    d.submit(copy(1))
    for lease in "ab":
        d.started(lease, 0.0)
        d.hello(lease, lease, frozenset(), 0.0)
    d.assign(lambda key: None, 0.0)
    assert d.ended("a") == [copy(0)] and d.ended("a") == [] and d.to_start() == 0  # "b" can take it back
    d.finished("b", copy(1), None, 2.0)
    d.size = 0
    assert [lease.id for lease in d.to_release()] == ["b"]
    d.submit(copy(0, 2))
    d.forget(lambda key: key.chunk == 0)  # done elsewhere: no copy of it is sent
    assert not d.queue


def test_copies_for_the_servers_own_threads_go_there_and_no_lease_is_started_for_them():
    d = Dispatcher(size=2, depth=2, here_depth=1)
    d.own_threads("direct", "threads", 0.0)
    d.submit(copy(0, kind="loss"), here=True)
    d.submit(copy(1, kind="loss"), here=True)
    d.submit(copy(0))
    assert d.to_start() == 1 and d.load() == (0, 1, 0)  # the pool's view: one copy waits for a Lambda
    sent = d.assign(lambda key: None, 0.0)
    assert [(lease.id, c[0].kind) for lease, c in sent] == [("direct", "loss")]  # one out on a thread, one waits
    assert list(d.queue) == [copy(0)] and list(d.queue_here) == [copy(1, kind="loss")]
    d.started("a", 0.0)
    d.hello("a", "peer-a", frozenset(), 0.0)
    assert [(lease.id, c[0].kind) for lease, c in d.assign(lambda key: None, 0.0)] == [("a", "fwd")]
    d.size = 0
    assert [lease.id for lease in d.to_release()] == []  # "a" is busy; the threads are never released
    d.finished("a", copy(0), None, 1.0)
    assert [lease.id for lease in d.to_release()] == ["a"]
    d.forget(lambda key: key.kind == "loss")
    assert not d.queue_here
    d.validate()


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_no_copy_is_ever_out_twice_under_any_interleaving(seed):
    rng = random.Random(seed)
    d = Dispatcher(size=rng.randint(1, 4), depth=rng.randint(1, 3), here_depth=rng.randint(0, 2))
    if d.here_depth:
        d.own_threads("direct", "threads", 0.0)
    attempts, leases = {}, 0
    for _ in range(60):
        step = rng.randrange(7)
        if step == 0:
            chunk = rng.randrange(4)
            attempts[chunk] = attempts.get(chunk, 0) + 1
            d.submit(copy(chunk, attempts[chunk]), here=bool(d.here_depth) and rng.random() < 0.3)
        elif step == 1:
            before = len(d.leases)
            for _ in range(d.to_start()):
                leases += 1
                d.started(str(leases), 0.0)
            assert len(d.leases) <= max(d.size + bool(d.here_depth), before)  # never past the pool
        elif step == 2 and d.leases:
            lease = rng.choice(list(d.leases))
            d.hello(lease, lease, frozenset(), 0.0)
        elif step == 3:
            d.assign(lambda key: None, 0.0)
        elif step == 4 and d.leases:
            lease = rng.choice(list(d.leases.values()))
            if lease.out:
                d.finished(lease.id, rng.choice(lease.out), None, 0.0)
        elif step == 5 and (pool := [lease for lease in d.leases if lease != "direct"]):
            for c in reversed(d.ended(rng.choice(pool))):
                d.queue.appendleft(c)  # as a lease that left gives them back
        elif step == 6:
            d.size = rng.randint(0, 4)
            for lease in d.to_release():
                d.ended(lease.id)
        d.validate()
