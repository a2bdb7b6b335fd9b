from dorylus_py.pipeline.events import TaskKey
from dorylus_py.pipeline.tasks import RelaunchPolicy, TaskTracker

KEY = TaskKey("fwd", True, 1, 0, 0)


def test_first_result_wins_later_ones_refused():
    t = TaskTracker(RelaunchPolicy(min_s=5.0))
    t.launch(KEY, now=0.0)
    assert t.is_running(KEY)
    assert t.complete(KEY, now=1.0, attempt=1)
    assert not t.complete(KEY, now=1.5, attempt=2)  # a relaunched copy's late result
    assert t.refused == 1 and not t.is_running(KEY)
    assert not t.pulled(KEY, 2, now=2.0)  # a copy asking for rows now is told to stop


def test_a_failed_copy_is_replaced_at_once_an_overdue_one_gets_a_second_copy():
    t = TaskTracker(RelaunchPolicy(min_s=1.0, factor=3.0))
    t.launch(KEY, now=0.0)
    assert t.due(now=0.5) == []
    t.ended(KEY, 1, ok=False, error="boom")
    assert t.due(now=0.6) == [(KEY, 2)]  # failed: no waiting out the timeout
    assert t.due(now=1.5) == []  # the new copy is young
    assert t.due(now=1.7) == [(KEY, 3)]  # overdue: a second copy beside it
    assert t.in_flight(KEY) == 2
    assert t.due(now=100.0) == []  # never more than two at once
    assert t.relaunches == 2


def test_overdue_allowance_learns_per_phase_and_backs_off():
    t = TaskTracker(RelaunchPolicy(min_s=0.5, factor=3.0, startup_hint_s=3.0))
    t.launch(KEY, now=0.0)
    assert t.due(now=2.9) == []  # before anything is learned, start-up may take the cold-start hint
    t.pulled(KEY, 1, now=2.0)  # started after 2 s (cold)
    assert t.due(now=2.4) == []  # running: min_s since it started
    assert t.complete(KEY, now=2.2, attempt=1)
    assert t.startup_s["fwd"] == 2.0 and abs(t.run_s["fwd"] - 0.2) < 1e-9
    k2 = KEY._replace(chunk=1)
    t.launch(k2, now=10.0)
    assert t.due(now=15.9) == []  # 3 x 2 s of usual start-up
    assert t.due(now=16.1) == [(k2, 2)]
    t.ended(k2, 1, ok=False)
    assert t.due(now=16.2) == [(k2, 3)]  # the first copy failed: replace it
    assert t.due(now=100.0) == []  # copies 2 and 3 run: no third
    assert t.allowance_s(k2, t.running[k2]) == (16.2, 12.0)  # one overdue relaunch so far: the allowance doubled


def test_attempts_run_out_with_the_last_error():
    t = TaskTracker(RelaunchPolicy(min_s=1.0, max_attempts=3))
    t.launch(KEY, now=0.0)
    for attempt in (1, 2, 3):
        assert t.exhausted() is None
        t.ended(KEY, attempt, ok=False, error=f"error {attempt}")
        t.due(now=float(attempt))
    assert t.exhausted() == (KEY, "error 3")


def test_forget_before_drops_old_keys():
    t = TaskTracker()
    for e in (1, 2, 3):
        k = KEY._replace(epoch=e)
        t.launch(k, 0.0)
        t.complete(k, 0.1)
    t.forget_before(3)
    assert t.done == {KEY._replace(epoch=3)}


def test_a_copy_waiting_for_a_worker_is_allowed_the_queue_ahead_of_it():
    # 2 workers, tasks of a kind that usually runs 1 s, 10 launched at once: the tenth has 9 ahead,
    # about 4.5 s of queue, so it is not overdue at min_s (5 s) but only after 5 + 4.5 s.
    keys = [KEY._replace(chunk=c) for c in range(10)]
    for workers, due_at_6 in ((2, {0, 1}), (0, set(range(10)))):
        t = TaskTracker(RelaunchPolicy(min_s=5.0, factor=3.0), workers=workers)
        t.run_s["fwd"] = 1.0
        for k in keys:
            t.launch(k, now=0.0)
        assert {k.chunk for k, _ in t.due(now=6.0)} == due_at_6
    t = TaskTracker(RelaunchPolicy(min_s=5.0, factor=3.0), workers=2)
    t.run_s["fwd"] = 1.0
    for k in keys:
        t.launch(k, now=0.0)
    assert [k.chunk for k, _ in t.due(now=9.4)] == list(range(9))  # the tenth: 5 + 9 / 2 s
    assert t.due(now=9.6)[-1] == (keys[9], 2)
    t2 = TaskTracker(RelaunchPolicy(min_s=5.0), workers=2)
    t2.run_s["fwd"] = 1.0
    for k in keys:
        t2.launch(k, now=0.0)
    t2.pulled(keys[9], 1, now=1.0)  # it started: from then on only its run counts, not the queue
    assert keys[9] not in {k for k, _ in t2.due(now=5.9)}
    assert keys[9] in {k for k, _ in t2.due(now=6.1)}
