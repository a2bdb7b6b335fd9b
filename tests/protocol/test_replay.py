"""The replay guard: windows, and forgetting senders without re-opening replays."""

import pytest

from dorylus_py.protocol import AuthError
from dorylus_py.protocol.messages import StaleMessage
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


def test_a_flood_stamped_ahead_neither_lifts_the_floor_nor_locks_out_a_fresh_sender(caplog):
    """Issue 40: 70,000 senders stamped 110 s ahead overflowed the 65,536 slots, the evictions lifted the
    floor 110 s into the future, and every new sender was refused. Now those ahead are capped before they
    take a slot, eviction forgets only senders stamped in the past, and the refusals are warned about at
    most once a second."""
    g = ReplayGuard(since_us=us(NOW - 1))
    refused = 0
    with caplog.at_level("WARNING", logger="dorylus_py.protocol.replay"):
        for i in range(70_000):
            try:
                g.accept(i.to_bytes(16, "big"), 1, us(NOW + 110), NOW + i * 1e-5)  # 0.7 s of flood
            except AuthError:
                refused += 1
    assert refused == 70_000 - g.max_ahead and g.refused["ahead"] == refused
    assert g.floor <= us(NOW + 1)  # never past the present
    g.accept(b"honest", 1, us(NOW + 1), NOW + 1)  # a fresh sender with a correct clock is served
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert 1 <= len(warnings) <= 2 and "ahead" in warnings[0].getMessage()  # 0.7 s: one line, maybe two


def test_room_is_made_by_forgetting_senders_of_the_past_only():
    g = ReplayGuard(capacity=100, max_ahead=10)
    for i in range(10):  # ahead of the clock: kept, not evicted for room
        g.accept(b"ahead-%d" % i, 1, us(NOW + 50), NOW)
    for i in range(500):  # many senders of the past: they make room for one another
        g.accept(i.to_bytes(16, "big"), 1, us(NOW) - 1000 + i, NOW)
    assert all(b"ahead-%d" % i in g.senders for i in range(10)) and len(g.senders) == 100
    assert g.floor < us(NOW)
    with pytest.raises(AuthError, match="ahead"):  # one more ahead is refused before it takes a slot
        g.accept(b"one more", 1, us(NOW + 5), NOW)
    assert b"one more" not in g.senders
    later = NOW + 51  # the clock has passed their stamps: they may go, and others may be ahead
    g.accept(b"one more", 1, us(later + 5), later)
    for i in range(500, 700):
        g.accept(i.to_bytes(16, "big"), 1, us(later) - 1000 + i, later)
    assert not any(b"ahead-%d" % i in g.senders for i in range(10))
    assert g.floor <= us(later)
    with pytest.raises(AuthError, match="forgotten"):  # forgetting them re-opened no replay
        g.accept(b"ahead-3", 1, us(NOW + 50), later)


def test_a_message_before_the_session_is_refused_quietly(caplog):
    g = ReplayGuard(since_us=us(NOW))
    with caplog.at_level("WARNING", logger="dorylus_py.protocol.replay"):
        with pytest.raises(StaleMessage):
            g.accept(b"a", 1, us(NOW - 1), NOW)
    assert g.refused["before"] == 1 and not caplog.records
