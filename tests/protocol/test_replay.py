"""The replay guard: windows, and forgetting senders without re-opening replays."""

import pytest

from dorylus_py.protocol import AuthError
from dorylus_py.protocol.replay import WINDOW, ReplayGuard

NOW = 1_700_000_000.0


def us(t: float) -> int:
    return int(t * 1e6)


def test_window_accepts_overtaken_messages_once_and_refuses_older_ones():
    g = ReplayGuard()
    g.accept(b"a", 5, us(NOW), NOW)
    g.accept(b"a", 3, us(NOW), NOW)  # overtaken by 5: accepted once
    g.accept(b"a", 3 + WINDOW - 1, us(NOW), NOW)
    with pytest.raises(AuthError, match="replay"):
        g.accept(b"a", 3, us(NOW), NOW)
    g.accept(b"a", 6, us(NOW), NOW)  # never seen, still inside the window
    with pytest.raises(AuthError, match="older than the window"):
        g.accept(b"a", 2, us(NOW), NOW)
    g.accept(b"a", 10**9, us(NOW), NOW)  # a jump clears the window
    with pytest.raises(AuthError, match="older than the window"):
        g.accept(b"a", 5 + WINDOW, us(NOW), NOW)
    g.accept(b"b", 1, us(NOW), NOW)  # senders are independent


def test_clock_skew_is_refused_with_a_hint():
    g = ReplayGuard(max_skew_s=60, max_age_s=120)
    with pytest.raises(AuthError, match=r"\+61 s .*NTP"):
        g.accept(b"a", 1, us(NOW + 61), NOW)
    with pytest.raises(AuthError, match="-61 s"):
        g.accept(b"a", 1, us(NOW - 61), NOW)


def test_idle_senders_are_forgotten_without_reopening_their_replays():
    g = ReplayGuard(max_age_s=240, max_skew_s=120)
    g.accept(b"old", 1, us(NOW - 100), NOW)
    g.accept(b"old", 2, us(NOW - 90), NOW)
    later = NOW + 241
    g.accept(b"new", 1, us(later), later)  # forgets "old"
    assert list(g.senders) == [b"new"]
    with pytest.raises(AuthError, match="forgotten"):  # its old message, replayed (its clock still within skew)
        g.accept(b"old", 1, us(NOW - 90), NOW + 20)
    g.accept(b"fresh", 1, us(later - 119), later)  # a correct clock is never below the floor


def test_memory_is_bounded_and_eviction_keeps_replays_out():
    g = ReplayGuard(capacity=100)
    for i in range(1000):  # many short-lived senders (Lambdas), one message each
        g.accept(i.to_bytes(16, "big"), 1, us(NOW) - 5000 + i, NOW)
    assert len(g.senders) == 100
    with pytest.raises(AuthError, match="forgotten"):
        g.accept((5).to_bytes(16, "big"), 1, us(NOW) - 5000 + 5, NOW)
    g.accept((5).to_bytes(16, "big"), 2, us(NOW) - 1000, NOW)  # its next, newer message is fine


def test_the_age_must_cover_twice_the_skew():
    with pytest.raises(ValueError):
        ReplayGuard(max_age_s=100, max_skew_s=60)
