"""Which gradients a weight store takes (``weights/guard.py``, issue 52 item 4): keys within their layer's
window, values whose Adam step is finite and whose norm is within orders of magnitude of the running
scale; a refused key is taken with no effect, so the update it belongs to still comes."""

import numpy as np
import pytest

from dorylus_py.weights import WeightStore
from dorylus_py.weights.guard import ADAM_LIMIT, FLOOR, SCALE_FACTOR, GradientRefused, KeyRefused, WindowSpec


def weights(rows=4):
    return {0: {"W": np.random.default_rng(0).standard_normal((rows, 3)).astype(np.float32)}}


def grad(scale=1.0, seed=1, rows=4):
    return {"W": (scale * np.random.default_rng(seed).standard_normal((rows, 3))).astype(np.float32)}


def store(chunks=(2,), first=1, staleness=0, update="epoch", **kw) -> WeightStore:
    return WeightStore(weights(), lr=0.01, weight_decay={}, update=update, expected=sum(chunks),
                       window=WindowSpec(chunks, first, staleness), **kw)


def test_a_key_far_ahead_of_its_layer_is_refused_and_nothing_of_it_taken():
    """The issue's attack: keys of epoch 25 while the job is in its first epochs. Sync (S = 0): a layer in
    epoch 1 takes keys up to epoch 1 + SLACK_EPOCHS = 3."""
    s = store()
    for key in [(25, 0, 0), (25, 0, 1), (4, 0, 0)]:
        with pytest.raises(KeyRefused, match="past the epoch the layer is in"):
            s.push(0, 0, key, grad())
    assert not s.layers[0].seen and not s.layers[0].pending and s.latest(0) == 0
    assert s.push(0, 0, (3, 0, 0), grad())  # within the slack: gradients still on their way
    for epoch in (1, 2):  # the layer moves on once both chunks' gradients of an epoch came
        assert s.push(0, epoch - 1, (epoch, 0, 1), grad()) and s.push(0, epoch - 1, (epoch, 0, 0), grad())
    assert s.layers[0].window.epoch == 3 and s.latest(0) == 2
    assert s.push(0, 2, (5, 0, 1), grad())  # 3 + 2


def test_the_window_follows_the_chunk_furthest_behind_and_the_staleness_bound():
    """One chunk's keys do not move the window (only the chunk furthest behind does); async, the bound
    adds S epochs; a restarted job's window starts at its first epoch, and a key before it names no task."""
    s = store(staleness=2, update="chunk")
    for epoch in range(1, 6):  # chunk 0 alone, up to 1 + S + 2
        assert s.push(0, s.latest(0), (epoch, 0, 0), grad())
    with pytest.raises(KeyRefused, match="more than 4 past"):
        s.push(0, s.latest(0), (6, 0, 0), grad())
    resumed = store(first=11)
    with pytest.raises(KeyRefused, match="before this start's first, 11"):
        resumed.push(0, 0, (10, 0, 0), grad())
    with pytest.raises(KeyRefused, match="no chunk 2 of graph server 0"):
        resumed.push(0, 0, (11, 0, 2), grad())
    assert resumed.push(0, 0, (11, 0, 0), grad())


def test_a_value_adams_square_would_overflow_is_refused_the_key_taken_and_nothing_applied():
    """1e30 passed the finiteness check and made Adam's second moment inf: every later step was zero.
    Now the key counts as come (the epoch's update sums the other chunk's gradient alone, and a copy
    of the key is a duplicate), and the weights and Adam's state are what the genuine gradient makes."""
    attacked, clean = store(), WeightStore(weights(), lr=0.01, weight_decay={}, expected=1)
    huge = {"W": np.full((4, 3), 1e30, np.float32)}
    with pytest.raises(GradientRefused, match="overflow Adam's second moment"):
        attacked.push(0, 0, (1, 0, 0), huge)
    assert not attacked.push(0, 0, (1, 0, 0), grad())  # its real gradient, now a duplicate
    assert attacked.push(0, 0, (1, 0, 1), grad(seed=2)) and attacked.latest(0) == 1
    clean.push(0, 0, (1, 0, 1), grad(seed=2))
    for field in ("W:W", "W:adam_m", "W:adam_v"):
        np.testing.assert_array_equal(attacked.state(0, 1)[field], clean.state(0, 1)[field])
    assert np.isfinite(attacked.state(0, 1)["W:adam_v"]).all()
    bound = ADAM_LIMIT / 2  # two chunks' values summed
    edge = store()
    assert edge.push(0, 0, (1, 0, 0), {"W": np.full((4, 3), bound * 0.99, np.float32)})
    with pytest.raises(GradientRefused):
        edge.push(0, 0, (1, 0, 1), {"W": np.full((4, 3), bound * 1.01, np.float32)})


def test_a_norm_orders_of_magnitude_above_the_running_scale_is_refused():
    """Once every chunk has sent one, a gradient over SCALE_FACTOR x the largest of every chunk's last norm
    is refused; the largest chunk sets the scale (one chunk holding every training vertex, one none)."""
    s = store()
    assert s.push(0, 0, (1, 0, 0), grad(10.0))  # the chunk with the training vertices
    assert s.push(0, 0, (1, 0, 1), {"W": np.zeros((4, 3), np.float32)})  # a chunk with none: exactly zero
    scale = np.linalg.norm(grad(10.0)["W"].astype(np.float64))
    near = grad(1.0, seed=3)["W"] * np.float32(0.999 * SCALE_FACTOR * scale / np.linalg.norm(grad(1.0, seed=3)["W"]))
    assert s.push(0, 1, (2, 0, 1), {"W": near})  # the zero chunk's next: large, but within the bound
    with pytest.raises(GradientRefused, match="times the running scale"):
        s.push(0, 1, (2, 0, 0), {"W": near * np.float32(1.01 / 0.999)})
    assert s.latest(0) == 2 and s.layers[0].pending == {}  # the epoch's update came, with the other one alone
    with pytest.raises(GradientRefused):
        s.push(0, 2, (3, 0, 1), grad(1e12))
    assert s.push(0, 2, (3, 0, 0), grad(10.0, seed=5))


def test_one_accepted_large_gradient_does_not_lift_the_bound_for_the_next():
    """A chunk's scale is the lower median of its recent norms: a gradient just inside the bound is taken,
    but a second one as far past it is still measured against the old scale (no ratchet by F a push)."""
    s = store(update="chunk")
    s.push(0, 0, (1, 0, 0), grad())
    s.push(0, 1, (1, 0, 1), grad(seed=2))
    factor = np.float32(0.5 * SCALE_FACTOR)
    assert s.push(0, 2, (2, 0, 0), {"W": grad()["W"] * factor})
    with pytest.raises(GradientRefused):
        s.push(0, 3, (2, 0, 1), {"W": grad()["W"] * factor * factor})


def test_a_block_whose_gradients_were_zero_may_come_back_to_life():
    """A block's scale is floored at FLOOR x its layer's largest block's: units dead in every chunk (a zero
    block) that come back are not refused for it."""
    w = {0: {"A": np.ones((4, 3), np.float32), "B": np.ones((2, 3), np.float32)}}
    s = WeightStore(w, lr=0.01, weight_decay={}, expected=1, window=WindowSpec((1,), 1, 0))
    s.push(0, 0, (1, 0, 0), {"A": np.ones((4, 3), np.float32), "B": np.zeros((2, 3), np.float32)})
    back = np.full((2, 3), 0.9 * SCALE_FACTOR * FLOOR * np.sqrt(12) / np.sqrt(6), np.float32)
    assert s.push(0, 1, (2, 0, 0), {"A": np.ones((4, 3), np.float32), "B": back})
    with pytest.raises(GradientRefused):
        s.push(0, 2, (3, 0, 0), {"A": np.ones((4, 3), np.float32), "B": back * np.float32(1e6)})


def test_chunk_updates_move_the_version_on_with_the_weights_as_they_are():
    """With an update per chunk gradient the version still counts one per key (the driver reads epoch
    boundaries by version), and a refused one changes neither the weights nor Adam's state."""
    s = store(update="chunk")
    s.push(0, 0, (1, 0, 0), grad())
    s.push(0, 1, (1, 0, 1), grad(seed=2))
    before = {k: v.copy() for k, v in s.state(0, 2).items()}
    with pytest.raises(GradientRefused):
        s.push(0, 2, (2, 0, 0), grad(1e9))
    assert s.latest(0) == 3 and s.updates == 3
    np.testing.assert_array_equal(s.pull(0, 3)[1]["W"], before["W:W"])
    s.push(0, 3, (2, 0, 1), grad(seed=4))
    assert float(s.state(0, 4)["W:adam_step"]) == 3  # two steps, then the refused key's none, then one
