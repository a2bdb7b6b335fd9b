import hashlib
import zipfile

import numpy as np
import pytest

from dorylus_py.data.extsort import KeyBuckets, sort_unique
from dorylus_py.data.npystream import NpzWriter, npz_members, write_npy
from dorylus_py.errors import DataError


def test_npy_written_in_blocks_reads_back_with_numpy_and_hashes_itself(tmp_path):
    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    meta = write_npy(tmp_path / "x.npy", np.float32, (20, 3), [x[:7], x[7:7], x[7:]])
    assert np.array_equal(np.load(tmp_path / "x.npy"), x)
    assert meta["sha256"] == hashlib.sha256((tmp_path / "x.npy").read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="7 rows written, 20 announced"):
        write_npy(tmp_path / "y.npy", np.float32, (20, 3), [x[:7]])
    with pytest.raises(ValueError, match="more than the 5 rows"):
        write_npy(tmp_path / "z.npy", np.float32, (5, 3), [x])


def test_npz_members_stream_in_blocks(tmp_path):
    z = NpzWriter(tmp_path / "a.npz")
    ids = np.arange(1000, dtype=np.int32)
    z.member("ids", np.int32, (1000,), [ids[:400], ids[400:]])
    z.member("k", np.int64, (), [np.int64(7)])
    z.close()
    with np.load(tmp_path / "a.npz") as loaded:  # an ordinary .npz
        assert np.array_equal(loaded["ids"], ids) and int(loaded["k"]) == 7
    members = npz_members(tmp_path / "a.npz")
    assert [len(b) for b in members["ids"].blocks(300)] == [300, 300, 300, 100]
    assert np.array_equal(np.concatenate(list(members["ids"].blocks(300))), ids)
    assert int(members["k"].read()) == 7


def test_truncated_member_is_named(tmp_path):
    np.savez(tmp_path / "a.npz", ids=np.arange(1000))
    with zipfile.ZipFile(tmp_path / "a.npz") as z:
        raw = z.read("ids.npy")
    with zipfile.ZipFile(tmp_path / "b.npz", "w") as z:
        z.writestr("ids.npy", raw[:-16])
    with pytest.raises(DataError, match="b.npz:ids.npy: truncated"):
        list(npz_members(tmp_path / "b.npz")["ids"].blocks(100))


def test_key_buckets_sort_and_deduplicate_in_key_order(tmp_path):
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 10**6, 50_000)
    b = KeyBuckets(tmp_path, 10**6, len(keys), bucket_keys=4_000)
    assert b.count > 10
    for part in np.array_split(keys, 7):
        b.add(part)
    got = np.concatenate([k for _, k in b.sorted_buckets()])
    assert np.array_equal(got, np.unique(keys))
    assert b.compact() == len(np.unique(keys))
    with pytest.raises(ValueError, match="out of range"):
        b.add(np.array([10**7]))
    b.remove()
    assert list(tmp_path.iterdir()) == []
    assert np.array_equal(sort_unique(np.array([3, 1, 3, 2, 1])), [1, 2, 3])
