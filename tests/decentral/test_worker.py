"""How a gossip worker takes in what its partners sent: shifts never past the partners' mean, averages
in full, each partner gradient as one Adam step of its own."""

from __future__ import annotations

import numpy as np

from dorylus_py.config import TrainConfig
from dorylus_py.decentral.worker import Trainer


def _trainer() -> Trainer:
    cfg = TrainConfig(mode="gossip", workers=2, lr=0.1, weight_decay=0.0)
    return Trainer(cfg, batches=None, dims=[3, 2], rank=0, world=2, device="cpu")


def test_several_exchanges_move_half_way_to_their_mean_and_an_average_moves_all_the_way():
    t = _trainer()
    x = t.params()
    t._apply([("shift", np.full(6, 2.0, np.float32)), ("shift", np.full(6, 4.0, np.float32))])
    assert np.allclose(t.params(), x + 3.0)  # (2 + 4) / 2: not 6, which would overshoot
    t._apply([("shift", np.ones(6, np.float32)), ("average", np.full(6, 10.0, np.float32))])
    assert np.allclose(t.params(), x + 3.0 + 1.0 + 10.0)


def test_partner_gradients_are_steps_of_their_own_and_ours_is_shared_with_its_step():
    t, twin = _trainer(), _trainer()
    assert t.share()[1] == {}  # no gradient yet
    for m in (t, twin):
        m.model.weights[0].grad.fill_(1.0)
        m.steps = 7
    before = t.params()
    t._step([("grad", np.concatenate([np.full(6, -1.0), np.zeros(4)]).astype(np.float32))])
    twin._step([])  # our step alone
    after_one = twin.params()
    assert np.allclose(after_one[:6], before[:6] - 0.1)  # Adam's first step: lr x sign
    assert np.all(t.params()[:6] > after_one[:6])  # the partner's -1 was a second step, back up
    tensors, fields = t.share()
    assert fields == {"grad_step": 7} and np.allclose(tensors["grad"][:6], 1.0)  # our own gradient, not theirs
