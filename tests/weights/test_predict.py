"""``predict`` (``--predict-weights``): a training pull of epoch ``e`` answered with a version ``d`` updates
behind ``e - 1`` (sync's) gets ``W_v + d (W_v - W_(v-1))``; the same pull again (a backward of the stashed
version) gets the same arrays; evaluation pulls, sync-age pulls and stores that do not predict get ``W_v``."""

import numpy as np
import pytest

from dorylus_py.weights import WeightStore

RNG = np.random.default_rng(1)
W0 = RNG.standard_normal((4, 3)).astype(np.float32)
G = [RNG.standard_normal((4, 3)).astype(np.float32) for _ in range(4)]


def _two_versions(predict: bool, expected: int = 1) -> WeightStore:
    store = WeightStore({0: {"W": W0}}, lr=0.01, weight_decay={}, update="epoch", expected=expected, predict=predict)
    store.push(0, 0, (1, 0, 0), {"W": G[0]})
    store.push(0, 1, (2, 0, 0), {"W": G[1]})  # version 2 now; W_1 freed
    return store


def test_a_pull_one_update_behind_its_epoch_gets_the_weights_extrapolated_one_update():
    store = _two_versions(predict=True)
    w2 = store.pull(0)[1]["W"].copy()
    w1_to_w2 = store.layers[0].deltas[2]["W"]
    v, arrays = store.pull(0, hold=(4, 0, 0), epoch=4)  # epoch 4 trains on version 3 in sync mode: d = 1
    assert v == 2
    np.testing.assert_array_equal(arrays["W"], w2 + w1_to_w2)
    assert not np.array_equal(arrays["W"], w2)
    v, again = store.pull(0, version=2, epoch=4)  # its backward, as stashed
    np.testing.assert_array_equal(again["W"], arrays["W"])
    assert store.predicted == 2


def test_d_updates_behind_extrapolates_d_times_the_last_update():
    store = _two_versions(predict=True)
    w2, delta = store.pull(0)[1]["W"].copy(), store.layers[0].deltas[2]["W"]
    np.testing.assert_allclose(store.pull(0, epoch=5)[1]["W"], w2 + 2 * delta, rtol=0, atol=1e-6)


@pytest.mark.parametrize("epoch", [None, 3, 2])  # evaluation; sync's own version (e - 1 = 2); behind it
def test_no_prediction_where_the_version_is_not_behind_its_epoch(epoch):
    store = _two_versions(predict=True)
    np.testing.assert_array_equal(store.pull(0, epoch=epoch)[1]["W"], store.pull(0)[1]["W"])
    assert store.predicted == 0


def test_a_store_that_does_not_predict_serves_the_version_as_it_is():
    store = _two_versions(predict=False)
    np.testing.assert_array_equal(store.pull(0, epoch=4)[1]["W"], store.pull(0)[1]["W"])
    assert store.layers[0].deltas == {}


def test_predicted_weights_leave_the_real_ones_and_the_gradients_step_unchanged():
    """The gradient computed at predicted weights is applied to the real newest version."""
    plain, pred = _two_versions(predict=False), _two_versions(predict=True)
    pred.pull(0, hold=(4, 0, 0), epoch=4)
    for store in (plain, pred):
        store.push(0, 2, (4, 0, 0), {"W": G[2]})
    np.testing.assert_array_equal(pred.pull(0)[1]["W"], plain.pull(0)[1]["W"])


def test_chunk_updates_count_an_epoch_as_its_chunks_updates():
    store = WeightStore({0: {"W": W0}}, lr=0.01, weight_decay={}, update="chunk", expected=2, predict=True)
    assert store.ahead(0, 2) == 2 and store.ahead(2, 2) == 0 and store.ahead(1, 3) == 3


def test_deltas_go_with_the_versions_they_belong_to():
    store = _two_versions(predict=True)
    store.pull(0, hold=(4, 0, 0), epoch=4)  # holds version 2
    store.push(0, 2, (3, 0, 0), {"W": G[2]})
    assert sorted(store.layers[0].deltas) == [2, 3]
    store.push(0, 2, (4, 0, 0), {"W": G[3]})  # releases the hold on 2
    assert sorted(store.layers[0].deltas) == [4]
