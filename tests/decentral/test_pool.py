"""The work pool's decisions, event in, instruction out: dealing, stealing, epochs, deaths."""

from __future__ import annotations

import pytest

from dorylus_py.decentral.pool import (
    AwaitSteal,
    Idle,
    Report,
    Steal,
    Stop,
    Train,
    WorkPool,
    deal,
    steal_count,
    watched,
)


def test_the_deal_covers_every_batch_once_among_the_live():
    shares = [list(deal(10, [0, 1, 2], r)) for r in range(3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert list(deal(10, [0, 2], 1)) == [] and sorted(list(deal(10, [0, 2], 0)) + list(deal(10, [0, 2], 2))) == list(range(10))


@pytest.mark.parametrize("remaining, victim_s, thief_s, expected", [
    (0, 1.0, 1.0, 0),
    (1, 1.0, 1.0, 1),  # the victim is busy with a batch: the idle thief takes the last one
    (2, 1.0, 1.0, 1),
    (6, 1.0, 1.0, 3),
    (2, 1.0, 3.0, 0),  # a 3x slower thief would finish later than the victim alone
    (2, 3.0, 1.0, 2),  # a 3x straggler gives all it holds to a fast thief
    (4, None, None, 2),  # speeds not measured yet: equal
])
def test_steal_count_finishes_both_soonest(remaining, victim_s, thief_s, expected):
    assert steal_count(remaining, victim_s, thief_s) == expected


def test_each_worker_watches_the_next_live_one_and_the_recorder_all():
    assert watched(2, [0, 2, 3, 5]) == [3] and watched(5, [0, 2, 3, 5]) == [0]
    assert watched(0, [0, 2, 3, 5]) == [2, 3, 5]
    assert watched(1, [1]) == [] and watched(4, [0, 1]) == []


def _drain(pool: WorkPool, stop_at=(Steal, AwaitSteal, Idle, Stop)):
    """Run ``pool`` alone until an action of ``stop_at``; the batches trained, the reports, that action."""
    trained, reports = [], []
    while True:
        action = pool.next_action()
        if isinstance(action, Train):
            pool.trained(action.epoch, action.batch)
            trained.append((action.epoch, action.batch))
        elif isinstance(action, Report):
            reports.append(action)
        if isinstance(action, stop_at):
            return trained, reports, action


def test_a_lone_worker_trains_every_epoch_in_order_then_idles():
    pool = WorkPool(0, 1, epochs=2, per_epoch=3)
    trained, reports, last = _drain(pool)
    assert trained == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)] and isinstance(last, Idle)
    assert reports == [Report(1, (0, 1, 2), True), Report(2, (0, 1, 2), True)]
    pool.stop()
    assert isinstance(pool.next_action(), Stop)


def test_a_thief_takes_from_the_tail_of_that_epoch_only():
    victim = WorkPool(0, 2, epochs=3, per_epoch=8)
    assert victim.next_action() == Train(1, 0)  # victim holds 2, 4, 6 of epoch 1 now
    assert victim.serve_steal(1, 1, thief_s=1.0, my_s=1.0) == [(1, 4), (1, 6)]
    assert 1 in victim.nothing_for_me  # a thief has nothing for its victim either
    assert victim.serve_steal(1, 3, thief_s=1.0, my_s=1.0) == [(3, 4), (3, 6)]  # a future epoch's share goes too
    assert victim.queues[3] == __import__("collections").deque([0, 2]) and 2 not in victim.queues
    assert victim.next_action() == Train(1, 2)


def test_stealing_ahead_then_training_ahead_while_the_answers_come():
    pool = WorkPool(0, 3, epochs=2, per_epoch=6, seed=1)  # share of epoch 1: 0, 3
    assert pool.next_action() == Train(1, 0)
    pool.trained(1, 0)
    assert pool.next_action() == Train(1, 3)
    ahead = pool.steal_ahead()  # the last batch of the share is being trained: ask one peer now
    assert isinstance(ahead, Steal) and len(ahead.peers) == 1 and ahead.epoch == 1
    assert pool.steal_ahead() is None  # one at a time
    pool.trained(1, 3)
    assert pool.peek() == (2, 0)  # while it waits, it would train ahead
    assert pool.next_action() == Train(2, 0)  # the epoch is not left while a steal is out
    pool.on_steal_reply(ahead.peers[0], 1, [])
    everyone = pool.next_action()
    assert everyone == Steal(tuple(p for p in (1, 2) if p != ahead.peers[0]), 1)
    assert pool.next_action() == Train(2, 3)  # training ahead again
    assert pool.next_action() == AwaitSteal()  # nothing ahead left either
    pool.on_steal_reply(everyone.peers[0], 1, [(1, 5)])
    assert pool.next_action() == Train(1, 5)  # stolen batches of the open epoch come first
    pool.trained(1, 5)
    assert pool.next_action() == Steal(everyone.peers, 1)  # it had some: asked again
    pool.on_steal_reply(everyone.peers[0], 1, [])
    assert pool.next_action() == Report(1, (0, 3, 5), left=True)  # every peer had nothing more
    assert pool.epoch == 2


def test_batches_of_an_epoch_already_left_are_trained_first_and_reported_alone():
    pool = WorkPool(0, 1, epochs=3, per_epoch=2)
    _drain(pool, stop_at=(Report,))  # left epoch 1
    pool.adopt(1, [1, 0])
    pool.adopt(1, [0])  # already held: not twice
    assert pool.next_action() == Train(1, 1) and pool.next_action() == Train(1, 0)
    pool.trained(1, 1)
    pool.trained(1, 0)
    assert pool.next_action() == Report(1, (1, 0), left=False)


def test_a_dead_peer_leaves_the_deal_and_a_declared_worker_stops():
    pool = WorkPool(1, 3, epochs=2, per_epoch=6)
    assert pool.on_peer_dead(2) and not pool.on_peer_dead(2)  # news once
    assert pool.next_action() == Train(1, 1) and list(pool.queues[1]) == [3, 5]  # dealt among 0 and 1
    pool.stealing_from.add(0)
    pool.on_peer_dead(0)
    assert not pool.stealing_from  # its answer will not come
    pool.on_peer_dead(1)
    assert isinstance(pool.next_action(), Stop)
