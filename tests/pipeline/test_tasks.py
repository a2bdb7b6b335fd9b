import pytest

from dorylus_py.pipeline import TaskTracker


def test_first_result_wins_later_ones_refused():
    t = TaskTracker(min_timeout_s=1.0)
    key = ("fwd", True, 1, 0, 0)
    t.launch(key, now=0.0)
    assert t.complete(key, now=0.5)
    assert not t.complete(key, now=0.6)
    assert t.refused == 1
    with pytest.raises(ValueError):
        t.launch(key, now=1.0)


def test_relaunch_after_timeout_or_failure():
    t = TaskTracker(min_timeout_s=1.0, factor=3.0)
    a, b = ("fwd", True, 1, 0, 0), ("fwd", True, 1, 0, 1)
    t.launch(a, 0.0)
    t.launch(b, 0.0)
    assert t.due(0.9) == []
    t.failed(b)
    assert t.due(0.9) == [b] and t.attempts(b) == 2
    assert t.due(1.1) == [a]
    assert t.due(1.2) == []  # the clock restarted
    assert t.relaunches == 2


def test_timeout_follows_moving_average_of_the_kind():
    t = TaskTracker(min_timeout_s=0.1, factor=3.0, smoothing=0.5)
    for chunk, took in enumerate([1.0, 3.0]):
        key = ("bwd", True, 1, 0, chunk)
        t.launch(key, 0.0)
        t.complete(key, took)
    assert t.timeout_s("bwd") == pytest.approx(3.0 * 2.0)
    assert t.timeout_s("fwd") == 0.1
