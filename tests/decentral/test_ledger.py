"""The recorder's decisions from the ledger: which epoch to evaluate, what a dead worker took with it,
when the job is over."""

from __future__ import annotations

from dorylus_py.decentral.ledger import EpochLedger


def test_epochs_are_recorded_in_order_once_all_their_batches_are_in():
    ledger = EpochLedger(world=2, epochs=3, per_epoch=4)
    ledger.add(0, 2, [0, 1, 2, 3], left=True)  # epoch 2 is complete, epoch 1 not yet
    assert ledger.next_to_record() is None
    ledger.add(1, 1, [0, 1], left=True, loss_sum=3.0, count=2)
    ledger.add(0, 1, [2, 3], left=False, loss_sum=1.0, count=2)
    assert ledger.next_to_record() == 1 and ledger.loss(1) == 1.0
    ledger.add_row({"epoch": 1, "val_acc": 0.5})
    ledger.add_row({"epoch": 3, "val_acc": 0.5})  # out of order: ignored
    assert ledger.recorded == 1 and ledger.next_to_record() == 2
    assert ledger.batches_per_worker == [6, 2]


def test_a_dead_workers_batches_are_adopted_once_every_live_worker_left_the_epoch():
    ledger = EpochLedger(world=3, epochs=2, per_epoch=6)
    ledger.add(0, 1, [0, 3], left=True)
    ledger.add(1, 1, [1, 4], left=True)  # worker 2 died holding 2 and 5
    assert ledger.repairs(live=[0, 1, 2]) == {}  # worker 2 may still report
    assert ledger.repairs(live=[0, 1]) == {1: [2, 5]}
    assert ledger.repairs(live=[0, 1]) == {}  # adopted once
    ledger.add(1, 1, [2], left=False)  # worker 1 stole 5 from the recorder, then died
    assert ledger.repairs(live=[0]) == {1: [5]}  # after a further death: again
    ledger.add(0, 1, [5], left=False)
    assert ledger.complete(1) and ledger.repairs(live=[0]) == {}


def test_the_job_is_over_after_the_last_epoch_or_at_the_target():
    ledger = EpochLedger(world=1, epochs=3, per_epoch=1)
    assert not ledger.finished(0.8)
    ledger.add_row({"epoch": 1, "val_acc": 0.5})
    assert not ledger.finished(0.8) and not ledger.finished(0.0)
    ledger.add_row({"epoch": 2, "val_acc": 0.81})
    assert ledger.finished(0.8) and not ledger.finished(0.0)
    ledger.add_row({"epoch": 3, "val_acc": 0.1})
    assert ledger.finished(0.0)
