"""Leases that rest between stages (``pipeline/rests.py``, ``--lease-rest predict``), without sockets: a gap
is predicted from the same stage's gap before; the idle leases are released only where the prediction
leaves time for two invocations, and as many are wanted again (the dispatcher's ``ahead``) one latency
before three quarters of the gap are over; copies that come early end the rest and are the dispatcher's."""

import pytest
from pytest import approx

from dorylus_py.config import TrainConfig
from dorylus_py.errors import ConfigError
from dorylus_py.pipeline.events import TaskKey
from dorylus_py.pipeline.leases import Dispatcher
from dorylus_py.pipeline.rests import RestPlanner

FWD0, BWD0 = ("fwd", 0, True), ("bwd", 0, True)


def test_a_stage_never_seen_and_an_unknown_latency_keep_their_leases():
    r = RestPlanner()
    assert r.idle(0.0, FWD0, 4) == 0  # no latency measured yet
    r.busy(0.3)
    r.connected(0.02)
    assert r.gaps == {FWD0: approx(0.3)}
    assert r.idle(1.0, BWD0, 4) == 0 and r.due(5.0) == 0  # a stage without a gap seen


def test_a_long_gap_releases_the_idle_leases_and_wants_them_back_before_it_ends():
    r = RestPlanner()
    r.connected(0.02)
    r.idle(0.0, FWD0, 4)
    r.busy(0.4)  # the first epoch: the gap after fwd 0 was 0.4 s
    assert r.idle(10.0, FWD0, 3) == 3  # 0.3 s of the predicted gap leave room for two invocations
    assert r.wake_at == approx(10.0 + 0.75 * 0.4 - 0.02)
    assert r.due(10.2) == 0
    assert r.due(10.29) == 3 and r.due(10.3) == 0  # once
    r.busy(10.42)
    assert r.gaps[FWD0] == approx(0.42)  # the new gap predicts the next epoch's


def test_a_short_gap_keeps_the_leases_and_early_copies_end_the_rest():
    r = RestPlanner()
    r.connected(0.05)
    r.idle(0.0, FWD0, 2)
    r.busy(0.12)
    assert r.idle(1.0, FWD0, 2) == 0  # 0.09 s of the gap: under two invocations of 0.05 s
    r.busy(1.5)
    assert r.idle(2.0, FWD0, 2) == 2  # now 0.5 s was seen
    r.busy(2.05)  # copies came early: no lease is wanted ahead of them
    assert r.due(3.0) == 0 and r.resting == 0


def test_the_latency_is_a_moving_average_of_invoked_to_connected():
    r = RestPlanner()
    r.connected(0.1)
    r.connected(0.2)
    assert r.latency == approx(0.7 * 0.1 + 0.3 * 0.2)


def test_leases_wanted_ahead_are_started_without_copies_within_the_pool():
    d = Dispatcher(size=3, depth=2)
    assert d.to_start() == 0 and not d.has_copies()
    d.ahead = 5
    assert d.to_start() == 3  # the pool's size at most
    d.started("a", 0.0)
    d.hello("a", "peer-a", frozenset(), 0.1)
    assert d.to_start() == 2 and [l.id for l in d.idle()] == ["a"]
    d.submit((TaskKey("fwd", True, 1, 0, 0), 1))
    assert d.has_copies()
    d.ahead = 0
    assert d.to_start() == 0  # one lease for one copy: there is one


def test_a_resting_pool_needs_a_fixed_size_and_says_so():
    TrainConfig(backend="local", lease_rest="predict").check()
    with pytest.raises(ConfigError, match="predict.? needs a fixed .?lambdas"):
        TrainConfig(backend="local", lambdas="auto", lease_rest="predict").check()
    with pytest.raises(ConfigError, match="lease_rest"):
        TrainConfig(lease_rest="sometimes")
