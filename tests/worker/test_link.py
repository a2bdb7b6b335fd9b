"""A worker's emulated link (``--lambda-bandwidth-mbps``): each way at its rate, one message after another."""

import pytest

from dorylus_py.platforms.base import LambdaContext
from dorylus_py.worker.link import Link, frame_bytes, link_of


def test_a_link_carries_each_way_at_its_rate_one_message_after_another():
    link = Link(8.0)  # 1 MB/s
    assert link.arrives(500_000, now=10.0) == pytest.approx(10.5)
    assert link.arrives(500_000, now=10.1) == pytest.approx(11.0)  # queued behind the first
    assert link.arrives(100_000, now=20.0) == pytest.approx(20.1)  # the link was idle meanwhile
    assert link.departs(1_000_000, now=10.2) == pytest.approx(11.2)  # the other direction is free


def test_only_a_capped_context_gets_a_link_and_a_warm_worker_keeps_it():
    assert link_of(None) is None and link_of(LambdaContext(1000)) is None
    a, b = link_of(LambdaContext(1000, bandwidth_mbps=200)), link_of(LambdaContext(1000, bandwidth_mbps=200))
    assert a is b and a.rate == 25e6  # 200 Mbps: 25 MB/s
    assert frame_bytes([b"abc", memoryview(bytearray(8)), bytearray(5)]) == 16
