"""``stale_step``: a gradient computed d versions behind the newest weighs 1/(d+1) (inverse: the gradient
scaled; inverse-lr: the step's learning rate), checked against Adam run by hand."""

import numpy as np
import pytest

from dorylus_py.weights import WeightStore
from dorylus_py.weights.adam import AdamParam, adam_step

RNG = np.random.default_rng(0)
W0 = RNG.standard_normal((4, 3)).astype(np.float32)
G = [RNG.standard_normal((4, 3)).astype(np.float32) for _ in range(4)]


def _by_hand(steps: list[tuple[np.ndarray, float]]) -> np.ndarray:
    p = AdamParam(W0.copy(), 0.0)
    for grad, lr in steps:
        adam_step(p, grad, lr)
    return p.w


@pytest.mark.parametrize("rule", ["none", "inverse", "inverse-lr"])
def test_chunk_updates_weigh_a_gradient_d_versions_behind_by_one_over_d_plus_one(rule):
    """Three fresh steps, then a gradient computed at version 1 when the newest is 3 (d = 2)."""
    store = WeightStore({0: {"W": W0}}, lr=0.01, weight_decay={}, update="chunk", expected=4, stale_step=rule)
    for i in range(3):
        store.push(0, i, (0, 0, i), {"W": G[i]})
    store.push(0, 1, (0, 0, 3), {"W": G[3]})
    last = {"none": (G[3], 0.01), "inverse": (G[3] * np.float32(1 / 3), 0.01), "inverse-lr": (G[3], 0.01 / 3)}[rule]
    np.testing.assert_array_equal(store.pull(0)[1]["W"], _by_hand([(G[i], 0.01) for i in range(3)] + [last]))


def test_epoch_updates_scale_each_stale_gradient_before_the_sum():
    """An epoch's sum of 2: one gradient from version 1 (fresh), one from version 0 (d = 1, halved)."""
    store = WeightStore({0: {"W": W0}}, lr=0.01, weight_decay={}, update="epoch", expected=2, stale_step="inverse")
    store.push(0, 0, (0, 0, 0), {"W": G[0]})
    store.push(0, 0, (0, 0, 1), {"W": G[1]})  # version 1
    store.push(0, 1, (1, 0, 0), {"W": G[2]})
    store.push(0, 0, (1, 0, 1), {"W": G[3]})  # d = 1
    expected = _by_hand([(G[0] + G[1], 0.01), (G[2] + G[3] * np.float32(0.5), 0.01)])
    np.testing.assert_array_equal(store.pull(0)[1]["W"], expected)


def test_epoch_updates_inverse_lr_divides_by_the_mean_staleness_plus_one():
    store = WeightStore({0: {"W": W0}}, lr=0.01, weight_decay={}, update="epoch", expected=2, stale_step="inverse-lr")
    for key, version, grad in (((0, 0, 0), 0, G[0]), ((0, 0, 1), 0, G[1]), ((1, 0, 0), 1, G[2]), ((1, 0, 1), 0, G[3])):
        store.push(0, version, key, {"W": grad})
    expected = _by_hand([(G[0] + G[1], 0.01), (G[2] + G[3], 0.01 / 1.5)])  # d = 0 and 1: mean 0.5
    np.testing.assert_array_equal(store.pull(0)[1]["W"], expected)


def test_an_unknown_rule_is_refused_and_the_flag_offers_the_stores_rules():
    from dorylus_py import sections
    from dorylus_py.weights import store

    assert sections.STALE_STEPS == store.STALE_STEPS
    with pytest.raises(ValueError, match="stale_step"):
        WeightStore({0: {"W": W0}}, lr=0.01, weight_decay={}, stale_step="sqrt")
