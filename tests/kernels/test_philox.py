"""The dropout masks a GPU draws (``kernels/philox.py`` in torch integer ops) are numpy's bit for bit:
sync mode on a GPU equals the reference only if they are. Run on the CPU, where both draw."""

import numpy as np
import pytest
import torch

from dorylus_py.kernels.dropout import EDGE, VERTEX, drawn_by_torch, dropout_keep_mask
from dorylus_py.kernels.philox import philox_blocks, philox_words16

KEYS = [(0, 0), (7, 5 << 16 | 1), (2**64 - 1, 2**64 - 1), (2**63 + 12345, 0x1234_5678_9ABC_DEF0)]


@pytest.mark.parametrize("key", KEYS)
def test_blocks_are_numpys_raw_stream(key):
    for first in (0, 1, 1000, 2**40):
        bitgen = np.random.Philox(key=np.array(key, dtype=np.uint64))
        bitgen.advance(first)
        want = bitgen.random_raw(4 * 37).view(np.int64)
        assert np.array_equal(philox_blocks(first, 37, key).reshape(-1).numpy(), want), first


@pytest.mark.parametrize("first, count", [(0, 1), (5, 100), (16, 16), (31, 1), (12345, 7777)])
def test_words_at_any_offset_are_numpys_bytes(first, count):
    key = KEYS[1]
    bitgen = np.random.Philox(key=np.array(key, dtype=np.uint64))
    want = np.frombuffer(np.random.Generator(bitgen).bytes(2 * (first + count)), "<u2")[first:]
    assert np.array_equal(philox_words16(first, count, key).numpy(), want.astype(np.int32))


@pytest.mark.parametrize("start, stop, width, p, stream", [(0, 50, 16, 0.5, VERTEX), (3, 41, 7, 0.1, VERTEX),
                                                          (1001, 1400, 128, 0.5, VERTEX), (17, 90, 8, 0.3, EDGE)])
def test_a_mask_drawn_by_torch_is_the_host_mask(start, stop, width, p, stream):
    seed, epoch, layer = 2**63 + 3, 11, 1
    host = dropout_keep_mask(start, stop, width, p, seed, epoch, layer, stream)
    key = (seed, (epoch << 16) | (stream << 8) | layer)
    torch_drawn = drawn_by_torch(start, stop, width, p, key, "cpu")
    assert torch_drawn.dtype == torch.bool and torch.equal(torch_drawn, host)
    assert 0.9 * (1 - p) < host.float().mean() < 1.1 * (1 - p)  # a mask, not all kept


def test_off_the_cpu_the_mask_is_drawn_on_the_device():
    mask = dropout_keep_mask(10, 30, 8, 0.5, 0, 1, 0, device="meta")  # meta: shapes only, no host draw
    assert mask.device.type == "meta" and mask.shape == (20, 8) and mask.dtype == torch.bool
