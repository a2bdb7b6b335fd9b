"""The narrower wire forms of row blocks: each round-trips within its bound, and int8's stochastic rounding is
unbiased (the mean of many decodes is the original)."""

from __future__ import annotations

import numpy as np
import pytest

from dorylus_py.protocol.quantize import WIRE_DTYPES, dither, pack, unpack, wire_bytes


def rows(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((64, 33)) * rng.uniform(0.01, 100, (64, 1))).astype(np.float32)
    x[5] = 0.0  # a row of zeros: scale 0
    return x


def round_trip(x: np.ndarray, dtype: str, rng=None) -> np.ndarray:
    block = pack(x, dtype, rng)
    assert block.nbytes == wire_bytes(*x.shape, dtype)
    return unpack(memoryview(block).cast("B").tobytes(), *x.shape, dtype)  # read-only bytes, as received


@pytest.mark.parametrize("dtype, rel", [("float32", 0.0), ("float16", 2**-11), ("bfloat16", 2**-8)])
def test_float_forms_round_to_nearest(dtype, rel):
    x = rows()
    back = round_trip(x, dtype)
    assert back.dtype == np.float32 and back.shape == x.shape
    assert np.all(np.abs(back - x) <= rel * np.abs(x) + 1e-30)


def test_bfloat16_is_the_upper_half_rounded_to_even_and_float16_saturates():
    x = np.array([[1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5]], np.float32)
    assert round_trip(x, "bfloat16").tolist() == [[1.0, 1.0, 1.0 + 4 * 2**-8, -2.5]]  # ties go to the even one
    big = np.array([[1e6, -1e6, 3.0]], np.float32)
    assert round_trip(big, "float16").tolist() == [[65504.0, -65504.0, 3.0]]  # not infinity


def test_int8_errs_below_one_step_and_is_unbiased():
    x = rows()
    g = np.random.default_rng(1)
    scale = np.abs(x).max(axis=1) / 127 * (1 + 2**-7)  # the scale sent: rounded up to a bfloat16
    back = round_trip(x, "int8", g)
    assert np.all(np.abs(back - x) <= scale[:, None] * (1 + 1e-5)) and np.all(back[5] == 0)
    mean = np.mean([round_trip(x, "int8", g) for _ in range(400)], axis=0)
    # the mean of 400 draws of a variable within one step: off by a few hundredths of a step at most
    assert np.all(np.abs(mean - x) <= 0.2 * scale[:, None] + 1e-12)
    assert abs(float(np.mean((mean - x) / np.where(scale > 0, scale, 1)[:, None]))) < 0.01  # no drift either way


def test_the_dither_is_uniform_on_a_grid_of_half_steps():
    """int8's rounding draws: 16 bits each, (k + 1/2) / 2**16, so their mean is 1/2 and none is 0 or 1."""
    u = dither(np.random.default_rng(3), (1001, 7))  # a count that is no multiple of the four draws a word
    assert u.shape == (1001, 7) and u.dtype == np.float32
    k = u.astype(np.float64) * 2**16 - 0.5
    assert np.array_equal(k, np.round(k)) and k.min() >= 0 and k.max() <= 2**16 - 1
    assert abs(u.mean() - 0.5) < 0.01 and len(np.unique(u)) > 5000
    assert np.histogram(u, bins=8, range=(0, 1))[0].min() > 0.9 * u.size / 8


def test_int8_scale_is_the_largest_magnitude_negative_or_not():
    x = np.array([[0.5, -127.0, 3.0], [-0.25, 0.125, 0.0]], np.float32)
    back = round_trip(x, "int8", np.random.default_rng(0))
    assert back[0, 1] == -127.0  # the row's scale is exactly 1: |-127| / 127
    assert np.all(np.abs(back - x) <= np.array([[1.0], [0.25 / 127 * (1 + 2**-7)]]))


def test_bytes_and_refusals():
    assert [wire_bytes(10, 8, d) for d in WIRE_DTYPES] == [320, 160, 160, 100]
    with pytest.raises(ValueError, match="wire dtype"):
        pack(rows(), "int4")
    with pytest.raises(ValueError, match="2-D float32"):
        pack(rows().astype(np.float64), "int8")
    with pytest.raises(ValueError, match="bytes for"):
        unpack(b"\0" * 9, 2, 3, "int8")
