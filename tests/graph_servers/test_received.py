"""The peers' contributions as Gather backward reads them: the same bits in any arrival order."""

from __future__ import annotations

import itertools
import weakref

import numpy as np
import pytest

from dorylus_py.protocol import ProtocolError
from graph_servers.received import NewestParts, OrderedSum

N, WIDTH = 50, 3
KEYS = [(1, 0), (1, 1), (2, 0), (2, 1)]


def parts(seed: int) -> dict:
    """A part per key: distinct rows of ours (int32), float32 values of very different magnitudes, so
    that a change in the order of the additions changes bits."""
    rng = np.random.default_rng(seed)
    out = {}
    for key in KEYS:
        rows = np.sort(rng.choice(N, size=30, replace=False)).astype(np.int32)
        out[key] = (rows, (rng.standard_normal((30, WIDTH)) * 10.0 ** rng.integers(-6, 6, (30, 1))).astype(np.float32))
    return out


def test_the_sum_has_the_same_bits_in_every_arrival_order_and_restarts_each_epoch():
    total = OrderedSum(N, WIDTH, KEYS)
    results = []
    for order in itertools.permutations(KEYS):
        for epoch in range(2):  # the same holder, epoch after epoch
            p = parts(epoch)
            for i, key in enumerate(order):
                assert total.done <= i  # nothing after a missing key is folded early
                total.add(key, *p[key])
            target = np.ones((N, WIDTH), np.float32)
            total.add_to(0, N, target)
            results.append((epoch, target))
            assert total.nbytes == 0 and total.done == 0
    for epoch in range(2):
        first = next(t for e, t in results if e == epoch)
        assert all(np.array_equal(t, first) for e, t in results if e == epoch)
        expected = np.ones((N, WIDTH), np.float64)
        for rows, values in parts(epoch).values():
            expected[rows] += values
        np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-6)


def test_the_next_epoch_writes_into_the_last_sum_only_once_nothing_holds_it():
    """The sum is written again next epoch (graph_servers/spares.py), never while a slice of the taken sum
    is still held (sent zero-copy), and with the same bits as a fresh start."""
    want = {}
    for seed in (1, 2, 3):
        fresh = OrderedSum(N, WIDTH, KEYS)
        for key, (rows, values) in parts(seed).items():
            fresh.add(key, rows, values)
        want[seed] = fresh.take()
    total = OrderedSum(N, WIDTH, KEYS)

    def epoch(seed: int) -> np.ndarray:
        for key in reversed(KEYS):  # every part but the last one in waits
            total.add(key, *parts(seed)[key])
        return total.take()

    first = epoch(1)
    held = first[:10]  # a peer's slice, still on its socket
    first_buffer, held_copy = weakref.ref(first.base), held.copy()
    del first
    second = epoch(2)
    assert np.array_equal(second, want[2]) and np.array_equal(held, held_copy)
    assert second.base is not first_buffer()  # the held sum was not written into
    second_buffer = weakref.ref(second.base)
    del second, held
    third = epoch(3)
    assert np.array_equal(third, want[3])
    assert third.base is second_buffer() or third.base is first_buffer()  # one nothing held was written into again
    assert 0 < total.spares.nbytes <= 64 << 20


def test_the_sum_refuses_a_repeat_and_an_early_read():
    total, p = OrderedSum(N, WIDTH, KEYS), parts(0)
    total.add((1, 1), *p[(1, 1)])
    with pytest.raises(ProtocolError, match="peer 1 chunk 1 contributed twice"):
        total.add((1, 1), *p[(1, 1)])
    total.add((1, 0), *p[(1, 0)])  # folds both
    with pytest.raises(ProtocolError, match="peer 1 chunk 0 contributed twice"):
        total.add((1, 0), *p[(1, 0)])
    with pytest.raises(ValueError, match="2 of 4 parts in"):
        total.add_to(0, N, np.zeros((N, WIDTH), np.float32))
    for key in KEYS[2:]:
        total.add(key, *p[key])
    with pytest.raises(ValueError, match="rows 0..10"):
        total.add_to(0, 10, np.zeros((10, WIDTH), np.float32))


def test_the_newest_part_of_a_peer_chunk_replaces_its_previous_one():
    newest, old, new = NewestParts(), parts(0), parts(1)
    for key in KEYS:
        newest.add(key, *old[key])
    newest.add((2, 0), *new[(2, 0)])
    target = np.zeros((N, WIDTH), np.float32)
    newest.add_to(10, 40, target[10:40])
    expected = np.zeros((N, WIDTH), np.float64)
    for key in KEYS:
        rows, values = (new if key == (2, 0) else old)[key]
        expected[rows] += values
    np.testing.assert_allclose(target[10:40], expected[10:40], rtol=1e-5, atol=1e-6)
    assert not target[:10].any() and not target[40:].any()
