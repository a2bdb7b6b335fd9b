"""A warm worker's static-row cache: bounded by bytes, least recently used out, one block per chunk and
tensor name (a new token for the same chunk replaces the old rows)."""

import numpy as np

from lambda_functions.row_cache import RowCache


def rows(n: int, value: float = 0.0) -> np.ndarray:
    return np.full((n, 25), value, np.float32)  # n x 100 bytes


def test_the_least_recently_used_rows_go_first_and_the_bytes_stay_under_the_cap():
    cache = RowCache(1000)
    for chunk in range(3):
        cache.keep(("gs", 0, chunk), "P", f"t{chunk}", rows(4, chunk))  # 400 bytes each
    assert cache.nbytes == 800 and len(cache) == 2 and cache.held(("gs", 0, 0)) == {}
    assert list(cache.held(("gs", 0, 1))) == ["t1"]  # now the most recently used
    cache.keep(("gs", 0, 3), "P", "t3", rows(4))
    assert cache.held(("gs", 0, 2)) == {} and set(cache.held(("gs", 0, 1))) == {"t1"} and cache.nbytes == 800


def test_a_new_token_replaces_the_slots_rows_and_oversized_rows_are_not_kept():
    cache = RowCache(1000)
    cache.keep(("gs", 0, 0), "P", "old", rows(4, 1.0))
    cache.keep(("gs", 0, 0), "P", "new", rows(4, 2.0))
    held = cache.held(("gs", 0, 0))
    assert list(held) == ["new"] and held["new"][0, 0] == 2.0 and cache.nbytes == 400
    cache.keep(("gs", 0, 1), "P", "huge", rows(11))
    assert cache.held(("gs", 0, 1)) == {} and cache.nbytes == 400
    cache.keep(("gs", 1, 0), "P", "other server", rows(4))  # the same chunk of another server is another slot
    assert len(cache) == 2


def test_held_rows_stay_with_the_caller_when_evicted_and_a_zero_cap_empties_the_cache():
    cache = RowCache(1000)
    cache.keep(("gs", 0, 0), "P", "t", rows(4, 7.0))
    held = cache.held(("gs", 0, 0))
    cache.resize(0)
    assert len(cache) == 0 and cache.nbytes == 0 and held["t"][0, 0] == 7.0
    cache.keep(("gs", 0, 0), "P", "t", rows(1))
    assert len(cache) == 0  # nothing fits in 0 bytes
