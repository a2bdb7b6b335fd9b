"""The partition store in S3 (moto): prepare to s3://, load and verify, corruption, a training job."""

from __future__ import annotations

import json

import boto3
import numpy as np
import pytest

from dorylus_py.checkpoint import load_checkpoint, save_checkpoint
from dorylus_py.cli import main
from dorylus_py.data import write_npz
from dorylus_py.errors import DataError
from dorylus_py.partition import PartitionStore, prepare
from dorylus_py.partition.store import checkpoint_root

JOB = {"store": "0" * 32, "model": "gcn", "widths": [2, 2], "partitions": 2}  # a checkpoint's fingerprint


@pytest.fixture()
def graph_file(small_graph, tmp_path):
    path = tmp_path / "g.npz"
    write_npz(small_graph, path)
    return path


@pytest.fixture()
def bucket(moto_url):
    boto3.client("s3").create_bucket(Bucket="dorylus-data")
    return "dorylus-data"


def test_prepare_to_s3_and_load_back(small_graph, graph_file, bucket, tmp_path, capsys):
    assert main(["prepare", str(graph_file), "-k", "3", "--out", f"s3://{bucket}/cora/k3"]) == 0
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]}
    assert "cora/k3/manifest.json" in keys and "cora/k3/part-00002/features.npy" in keys
    local = prepare(small_graph, tmp_path / "local", 3)
    remote = PartitionStore.open(f"s3://{bucket}/cora/k3")
    assert remote.manifest["parts"] == local["parts"]  # same files, same checksums
    for k in range(3):
        a, b = remote.load(k), PartitionStore.open(tmp_path / "local").load(k)
        assert np.array_equal(a.features, b.features) and np.array_equal(a.local_indices, b.local_indices)
    capsys.readouterr()
    assert main(["check", f"s3://{bucket}/cora/k3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["edges"] == small_graph.num_edges


def test_corrupt_or_missing_objects_are_named(graph_file, bucket, capsys, tmp_path):
    uri = f"s3://{bucket}/g"
    assert main(["prepare", str(graph_file), "-k", "2", "--out", uri]) == 0
    s3 = boto3.client("s3")
    key = "g/part-00001/labels.npy"
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[-1] ^= 0xFF  # same size, one byte flipped
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    s3.delete_object(Bucket=bucket, Key="g/part-00000/features.npy")
    with pytest.raises(DataError, match=rf"{uri}/part-00001/labels.npy: checksum mismatch"):
        PartitionStore.open(uri).load(1)
    with pytest.raises(DataError, match=rf"{uri}/part-00000/features.npy: missing"):
        PartitionStore.open(uri).load(0)
    assert not list((tmp_path / "cache").rglob("*.npy.part"))  # nothing half-written left in the cache
    capsys.readouterr()
    assert main(["check", uri]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: s3://") and "Traceback" not in err


def test_prepare_refuses_to_overwrite_and_names_a_missing_bucket(graph_file, bucket, capsys):
    assert main(["prepare", str(graph_file), "-k", "2", "--out", f"s3://{bucket}/x"]) == 0
    assert main(["prepare", str(graph_file), "-k", "2", "--out", f"s3://{bucket}/x"]) == 2
    assert "already holds objects" in capsys.readouterr().err
    assert main(["prepare", str(graph_file), "-k", "3", "--out", f"s3://{bucket}/x", "--overwrite"]) == 0
    assert PartitionStore.open(f"s3://{bucket}/x").num_parts == 3
    assert main(["prepare", str(graph_file), "-k", "2", "--out", "s3://no-such-bucket/x"]) == 2
    assert "s3://no-such-bucket/x" in capsys.readouterr().err


def test_graph_servers_train_from_s3(graph_file, bucket, tmp_path):
    uri = f"s3://{bucket}/train"
    assert main(["prepare", str(graph_file), "-k", "2", "--out", uri]) == 0
    out = tmp_path / "run"
    assert main(["train", "--backend", "cpu", "--data", uri, "--graph-servers", "2", "--epochs", "3", "--quiet",
                 "--checkpoint-every", "2", "--checkpoint-dir", f"{uri}/checkpoints", "--out", str(out)]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix="train/checkpoints/")["Contents"]}
    assert keys == {"train/checkpoints/epoch-000002.npz", "train/checkpoints/epoch-000003.npz", "train/checkpoints/latest.json"}
    ckpt = load_checkpoint(f"{uri}/checkpoints")
    final = np.load(out / "weights.npz")
    assert int(ckpt["epoch"]) == 3 and np.array_equal(ckpt["W0:W"], final["W0"]) and np.array_equal(ckpt["W1:W"], final["W1"])
    assert float(ckpt["W0:adam_step"]) == 3 and int(ckpt["W1:version"]) == 3 and ckpt["W0:adam_v"].any()


def test_many_processes_fetch_the_same_store_at_once(graph_file, bucket):
    """Graph servers and the driver share one cache: concurrent fetches must not trip over each other.
    (Plain subprocesses: a multiprocessing pool would leave its resource tracker running.)"""
    import subprocess
    import sys

    uri = f"s3://{bucket}/shared"
    assert main(["prepare", str(graph_file), "-k", "2", "--out", uri]) == 0
    code = "import sys; from dorylus_py.partition import PartitionStore; " \
           "print(PartitionStore.open(sys.argv[1]).load(int(sys.argv[2])).num_local)"
    procs = [subprocess.Popen([sys.executable, "-c", code, uri, str(k % 2)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(6)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-500:] for _, err in outs]
    sizes = [int(out) for out, _ in outs]
    assert len(set(sizes[0::2])) == 1 and len(set(sizes[1::2])) == 1 and sum(sizes[:2]) == 600


def test_overwrite_in_s3_keeps_checkpoints_unless_told(small_graph, tmp_path, moto_url, capsys):
    boto3.client("s3").create_bucket(Bucket="bkt")
    write_npz(small_graph, tmp_path / "g.npz")
    prepare = ["prepare", str(tmp_path / "g.npz"), "-k", "2", "--out", "s3://bkt/datasets/g"]
    assert main(prepare) == 0
    save_checkpoint(checkpoint_root("s3://bkt/datasets/g"), 1, {"W0": np.ones(2, np.float32)}, JOB)
    capsys.readouterr()
    assert main([*prepare, "--overwrite"]) == 2 and "s3://bkt/datasets/g/checkpoints: holds 2" in capsys.readouterr().err
    assert main([*prepare, "--overwrite", "--delete-checkpoints"]) == 0
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="bkt")["Contents"]]
    assert not [k for k in keys if "/checkpoints/" in k]


def test_overwrite_in_s3_refuses_a_prefix_holding_objects_it_did_not_write(graph_file, bucket, capsys):
    """prepare --overwrite deletes the whole prefix: an object its manifest does not list (a user's notes,
    a file under a part's folder) stops it, in one line naming the object, with nothing deleted."""
    uri = f"s3://{bucket}/mine"
    assert main(["prepare", str(graph_file), "-k", "2", "--out", uri]) == 0
    s3 = boto3.client("s3")
    for key in ("mine/notes.txt", "mine/part-00000/extra.npy"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"the user's")
    before = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="mine/")["Contents"])
    capsys.readouterr()
    assert main(["prepare", str(graph_file), "-k", "3", "--out", uri, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "holds 2 object(s) that dorylus did not write (notes.txt, part-00000/extra.npy)" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="mine/")["Contents"]) == before
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "mine/notes.txt"}, {"Key": "mine/part-00000/extra.npy"}]})
    assert main(["prepare", str(graph_file), "-k", "3", "--out", uri, "--overwrite"]) == 0  # its own: replaced
    assert PartitionStore.open(uri).num_parts == 3


def test_an_s3_checkpoint_index_cannot_write_outside_its_folder(bucket, tmp_path):
    """Whoever can write the checkpoint prefix controls latest.json: its file name was used as a local
    path (a `--resume` downloaded the object to wherever '../..' or '/abs' pointed, then failed)."""
    root = f"s3://{bucket}/run/checkpoints"
    save_checkpoint(root, 3, {"W0": np.ones((2, 2), np.float32)}, JOB)
    s3 = boto3.client("s3")
    latest = json.loads(s3.get_object(Bucket=bucket, Key="run/checkpoints/latest.json")["Body"].read())
    target = tmp_path / "escaped-by-resume.pth"
    s3.put_object(Bucket=bucket, Key="run/checkpoints/" + f"../../../../../../..{target}", Body=b"import os")
    for name in [f"../../../../../../..{target}", str(target), "x/../epoch-000003.npz"]:
        s3.put_object(Bucket=bucket, Key="run/checkpoints/latest.json", Body=json.dumps(latest | {"file": name}).encode())
        with pytest.raises(DataError, match="is not a checkpoint file name"):
            load_checkpoint(root)
        assert not target.exists()


def test_a_huge_s3_checkpoint_index_is_refused_without_being_downloaded(bucket, tmp_path, monkeypatch):
    """latest.json over 64 KB (10 MB here) is refused after one ranged read of 64 KB + 1 byte, with no
    download of the whole object (the cap used to apply after fetching it)."""
    from dorylus_py import s3 as s3store

    root = f"s3://{bucket}/big/checkpoints"
    boto3.client("s3").put_object(Bucket=bucket, Key="big/checkpoints/latest.json", Body=b" " * (10 << 20))
    read = []
    real = s3store.client

    def counting():
        c = real()
        get = c.get_object
        c.get_object = lambda **kw: read.append(kw.get("Range")) or get(**kw)
        return c
    monkeypatch.setattr(s3store, "client", counting)
    monkeypatch.setattr(s3store, "fetch", lambda *a, **k: pytest.fail("downloaded whole"))
    with pytest.raises(DataError, match="latest.json: larger than 65536 bytes"):
        load_checkpoint(root)
    assert read == ["bytes=0-65536"]


def test_s3_addresses_cannot_lead_the_cache_outside_its_folder(bucket, tmp_path):
    for uri in [f"s3://{bucket}/../../etc", f"s3://{bucket}/a/./b", "s3://../x", "s3://Not_A_Bucket/x"]:
        with pytest.raises(DataError, match="segments|bucket name"):
            PartitionStore.open(uri)
