import numpy as np
import pytest
import torch

from dorylus_py.models import model_spec
from dorylus_py.weights import WeightError, WeightStore
from dorylus_py.weights.blocks import join, split, weight_blocks


def init():
    rng = np.random.default_rng(0)
    return {0: {"W": rng.standard_normal((4, 3)).astype(np.float32)}, 1: {"W": rng.standard_normal((3, 2)).astype(np.float32)}}


def g(arr):
    return {"W": arr}


def test_sync_sums_all_chunks_then_one_adam_step_equal_to_torch():
    w = init()
    store = WeightStore(w, lr=0.01, weight_decay={"W": 5e-4}, update="epoch", expected=3)
    grads = [np.random.default_rng(i).standard_normal((4, 3)).astype(np.float32) for i in range(3)]
    p = torch.nn.Parameter(torch.tensor(w[0]["W"]))
    opt = torch.optim.Adam([{"params": [p], "weight_decay": 5e-4}], lr=0.01)
    for epoch in range(2):
        for chunk, g in enumerate(grads):
            assert store.latest(0) == epoch
            assert store.pull(0, epoch + 1) is None  # not there until every chunk is in
            assert store.push(0, epoch, (epoch, 0, chunk), {"W": g})
        p.grad = torch.tensor(sum(grads))
        opt.step()
        v, got = store.pull(0, epoch + 1)
        assert v == epoch + 1
        np.testing.assert_allclose(got["W"], p.detach().numpy(), rtol=1e-6)
    assert store.latest(1) == 0  # the other layer had no gradients


def test_duplicate_gradient_is_never_applied_twice():
    store = WeightStore(init(), lr=0.1, weight_decay={}, update="epoch", expected=2)
    gr = g(np.ones((4, 3), np.float32))
    assert store.push(0, 0, (1, 0, 0), gr)
    assert not store.push(0, 0, (1, 0, 0), gr)  # a relaunched task's copy
    assert store.latest(0) == 0  # still waiting for chunk 1: the duplicate did not count
    assert store.push(0, 0, (1, 0, 1), gr)
    assert store.latest(0) == 1 and store.updates == 1


def test_async_steps_per_chunk_and_stashes_held_versions():
    store = WeightStore(init(), lr=0.1, weight_decay={}, update="chunk", expected=2)  # 2 chunks: an epoch = 2 steps
    v0, w0 = store.pull(0, None, hold=(1, 0, 0))  # chunk 0's forward holds version 0
    gr = g(np.ones((4, 3), np.float32))
    assert store.push(0, 0, (1, 0, 1), gr)  # chunk 1's gradient: one step
    assert store.latest(0) == 1
    assert store.held_versions(0) == [0, 1]  # version 0 kept for chunk 0's backward
    v, w = store.pull(0, v0)
    np.testing.assert_array_equal(w["W"], w0["W"])
    v1 = store.pull(0, None, hold=(2, 0, 1))[0]  # chunk 1's next forward holds version 1
    assert store.push(0, v0, (1, 0, 0), gr)  # chunk 0's backward releases its hold
    assert store.held_versions(0) == [1, 2]
    assert store.push(0, v1, (2, 0, 1), gr)
    assert store.held_versions(0) == [3]
    with pytest.raises(WeightError, match="freed"):
        store.pull(0, 1)  # mid-epoch, not held: gone
    np.testing.assert_array_equal(store.pull(0, 2)[1]["W"], store.state(0, 2)["W:W"])  # an epoch boundary: kept
    np.testing.assert_array_equal(store.pull(0, 0)[1]["W"], w0["W"])


def test_epoch_snapshots_hold_weights_and_adam_state_of_one_version():
    store = WeightStore(init(), lr=0.1, weight_decay={}, update="epoch", expected=1, keep=2)
    gr = g(np.ones((4, 3), np.float32))
    for epoch in range(1, 4):
        store.push(0, epoch - 1, (epoch, 0, 0), gr)
    assert [int(store.state(0, v)["W:version"]) for v in (2, 3)] == [2, 3]
    assert float(store.state(0, 3)["W:adam_step"]) == 3 and store.state(0, 4) is None  # to come: the pull waits
    with pytest.raises(WeightError, match="no epoch snapshot"):
        store.state(0, 1)  # only the newest two are kept
    with pytest.raises(WeightError, match="out of reach"):
        store.pull(0, 10**6)


def test_errors():
    store = WeightStore(init(), lr=0.1, weight_decay={})
    with pytest.raises(WeightError, match="layer 5 is not held"):
        store.pull(5)
    with pytest.raises(WeightError, match="gradient shape"):
        store.push(0, 0, (1, 0, 0), g(np.ones((2, 2), np.float32)))
    with pytest.raises(WeightError, match="expected"):
        store.push(0, 0, (1, 0, 0), {"V": np.ones((4, 3), np.float32)})


def test_blocks_spread_every_model_over_more_servers_than_layers_and_train_bit_for_bit_alike():
    spec = model_spec("gat", [20, 4, 3], heads=2)
    tensors = {t.name: np.random.default_rng(1).standard_normal(t.shape).astype(np.float32) for t in spec.tensors()}
    grads = [{n: np.random.default_rng(10 + i).standard_normal(a.shape).astype(np.float32) for n, a in tensors.items()}
             for i in range(3)]
    results = []
    for servers in (1, 2, 3, 5):
        blocks = weight_blocks(spec.tensors(), servers)
        assert {b.server for b in blocks} == set(range(servers))  # 2 layers, up to 5 servers: none idle
        stores = []
        for s in range(servers):
            mine = [b for b in blocks if b.server == s]
            arrays = split(mine, tensors)
            stores.append(WeightStore({l: {b.name: arrays[b.name] for b in mine if b.layer == l} for l in (0, 1)},
                                      lr=0.01, weight_decay={b.name: 5e-4 for b in mine if b.decay}, expected=1))
        for epoch, grad in enumerate(grads):
            parts = split(blocks, grad)
            for s, store in enumerate(stores):
                for l in (0, 1):
                    store.push(l, epoch, (epoch + 1, 0, 0), {b.name: parts[b.name] for b in blocks if b.server == s and b.layer == l})
        state = {k: v for store in stores for l in (0, 1) for k, v in store.state(l, 3).items()}
        results.append(join(state, ":W") | join(state, ":adam_v") | join(state, ":version"))
    for other in results[1:]:
        assert other.keys() == results[0].keys() and all(np.array_equal(other[k], results[0][k]) for k in other)
    assert results[0]["W0:W"].shape == (20, 8) and int(results[0]["b1:version"]) == 3
