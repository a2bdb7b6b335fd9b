import numpy as np
import pytest
import torch

from dorylus_py.weights import WeightError, WeightStore


def init():
    rng = np.random.default_rng(0)
    return {0: rng.standard_normal((4, 3)).astype(np.float32), 1: rng.standard_normal((3, 2)).astype(np.float32)}


def test_sync_sums_all_chunks_then_one_adam_step_equal_to_torch():
    w = init()
    store = WeightStore(w, lr=0.01, weight_decay={0: 5e-4}, update="epoch", expected=3)
    grads = [np.random.default_rng(i).standard_normal((4, 3)).astype(np.float32) for i in range(3)]
    p = torch.nn.Parameter(torch.tensor(w[0]))
    opt = torch.optim.Adam([{"params": [p], "weight_decay": 5e-4}], lr=0.01)
    for epoch in range(2):
        for chunk, g in enumerate(grads):
            assert store.latest(0) == epoch
            assert store.pull(0, epoch + 1) is None  # not there until every chunk is in
            assert store.push(0, epoch, (epoch, 0, chunk), g)
        p.grad = torch.tensor(sum(grads))
        opt.step()
        v, got = store.pull(0, epoch + 1)
        assert v == epoch + 1
        np.testing.assert_allclose(got, p.detach().numpy(), rtol=1e-6)
    assert store.latest(1) == 0  # the other layer had no gradients


def test_duplicate_gradient_is_never_applied_twice():
    store = WeightStore(init(), lr=0.1, weight_decay={}, update="epoch", expected=2)
    g = np.ones((4, 3), np.float32)
    assert store.push(0, 0, (1, 0, 0), g)
    assert not store.push(0, 0, (1, 0, 0), g)  # a relaunched task's copy
    assert store.latest(0) == 0  # still waiting for chunk 1: the duplicate did not count
    assert store.push(0, 0, (1, 0, 1), g)
    assert store.latest(0) == 1 and store.updates == 1


def test_async_steps_per_chunk_and_stashes_held_versions():
    store = WeightStore(init(), lr=0.1, weight_decay={}, update="chunk", expected=2)  # 2 chunks: an epoch = 2 steps
    v0, w0 = store.pull(0, None, hold=(1, 0, 0))  # chunk 0's forward holds version 0
    g = np.ones((4, 3), np.float32)
    assert store.push(0, 0, (1, 0, 1), g)  # chunk 1's gradient: one step
    assert store.latest(0) == 1
    assert store.held_versions(0) == [0, 1]  # version 0 kept for chunk 0's backward
    v, w = store.pull(0, v0)
    np.testing.assert_array_equal(w, w0)
    v1 = store.pull(0, None, hold=(2, 0, 1))[0]  # chunk 1's next forward holds version 1
    assert store.push(0, v0, (1, 0, 0), g)  # chunk 0's backward releases its hold
    assert store.held_versions(0) == [1, 2]
    assert store.push(0, v1, (2, 0, 1), g)
    assert store.held_versions(0) == [3]
    with pytest.raises(WeightError, match="freed"):
        store.pull(0, 1)  # mid-epoch, not held: gone
    np.testing.assert_array_equal(store.pull(0, 2)[1], store.state(0, 2)["W"])  # an epoch boundary: kept
    np.testing.assert_array_equal(store.pull(0, 0)[1], w0)


def test_epoch_snapshots_hold_weights_and_adam_state_of_one_version():
    store = WeightStore(init(), lr=0.1, weight_decay={}, update="epoch", expected=1, keep=2)
    g = np.ones((4, 3), np.float32)
    for epoch in range(1, 4):
        store.push(0, epoch - 1, (epoch, 0, 0), g)
    assert [int(store.state(0, v)["version"]) for v in (2, 3)] == [2, 3]
    assert float(store.state(0, 3)["adam_step"]) == 3 and store.state(0, 4) is None  # to come: the pull waits
    with pytest.raises(WeightError, match="no epoch snapshot"):
        store.state(0, 1)  # only the newest two are kept
    with pytest.raises(WeightError, match="out of reach"):
        store.pull(0, 10**6)


def test_errors():
    store = WeightStore(init(), lr=0.1, weight_decay={})
    with pytest.raises(WeightError, match="layer 5 is not held"):
        store.pull(5)
    with pytest.raises(WeightError, match="gradient shape"):
        store.push(0, 0, (1, 0, 0), np.ones((2, 2), np.float32))
