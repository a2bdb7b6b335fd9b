"""The job key on AWS (moto): `dorylus aws put-secret`, the read path of servers and Lambdas, and the
server role's S3 policy enforced against the paths the code reads and writes."""

from __future__ import annotations

import json

import boto3
import numpy as np
import pytest
import requests

from dorylus_py.checkpoint import checkpoint_root, save_checkpoint
from dorylus_py.cli import main
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.jobkey import load_job_key
from dorylus_py.partition import PartitionStore, prepare
from dorylus_py.partition import s3 as s3store

pytest.importorskip("hcl2")
from tests.aws.terraform import render, statements  # noqa: E402


@pytest.fixture()
def secret(moto_url):
    kms = boto3.client("kms").create_key(Description="the bucket's key")["KeyMetadata"]["Arn"]
    return boto3.client("secretsmanager").create_secret(Name="dorylus-job-key-x", KmsKeyId=kms)["ARN"]


def test_put_secret_then_every_process_reads_the_same_key(secret, capsys):
    with pytest.raises(ConfigError, match=r"no value stored yet \(run `dorylus aws put-secret --secret-id"):
        load_job_key(environ={"DORYLUS_KEY_SECRET": secret})  # applied, but the key not stored yet
    assert main(["aws", "put-secret", "--secret-id", secret]) == 0
    stored = boto3.client("secretsmanager").get_secret_value(SecretId=secret)["SecretString"]
    out = capsys.readouterr().out
    assert stored not in out and "version" in out  # never printed
    key = bytes.fromhex(stored)
    assert len(key) == 32
    assert load_job_key(environ={"DORYLUS_KEY_SECRET": secret}) == key  # the Lambda, from its environment
    assert load_job_key(key_secret=secret, environ={}) == key  # servers and driver, from the cluster file
    assert main(["aws", "put-secret", "--secret-id", secret]) == 0  # a new key for the next job
    assert load_job_key(key_secret=secret, environ={}) != key
    assert load_job_key(key_secret=secret, environ={"DORYLUS_KEY": "ab" * 16}) == b"\xab" * 16  # explicit wins


def test_key_errors_are_one_line_and_name_the_fix(moto_url, capsys):
    with pytest.raises(ConfigError, match="no job key: set DORYLUS_KEY"):
        load_job_key(environ={})
    with pytest.raises(ConfigError, match="must be hex digits"):
        load_job_key(environ={"DORYLUS_KEY": "not hex"})
    with pytest.raises(ConfigError, match="at least 16"):
        load_job_key(environ={"DORYLUS_KEY": "abcd"})
    with pytest.raises(ConfigError, match="not found"):
        load_job_key(key_secret="nope", environ={})
    assert main(["aws", "put-secret", "--secret-id", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: secret nope") and "Traceback" not in err


def _enforce_iam(url: str, on: bool) -> None:
    """moto checks every request against IAM from now on (or stops)."""
    requests.post(f"{url}/moto-api/reset-auth", data=b"0" if on else b"inf", timeout=10).raise_for_status()


def test_server_role_reads_datasets_and_writes_nothing(moto_url, small_graph, tmp_path, monkeypatch):
    """The server policy from infra/iam.tf, rendered for bucket dorylus-data-x, enforced by moto on the real
    code paths: graph servers can read their partitions; checkpoints, which the driver writes into its run
    folder, are not in S3, and the role can write nowhere in the bucket."""
    bucket = "dorylus-data-x"
    boto3.client("s3").create_bucket(Bucket=bucket)
    store = f"s3://{bucket}/datasets/mygraph"
    prepare(small_graph, store, 2)  # as the operator
    iam = boto3.client("iam")
    iam.create_user(UserName="server")
    iam.put_user_policy(UserName="server", PolicyName="server", PolicyDocument=render(statements()["server"]))
    creds = iam.create_access_key(UserName="server")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", creds["AccessKeyId"])  # a new S3 client for the new identity
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", creds["SecretAccessKey"])
    monkeypatch.setenv("DORYLUS_CACHE", str(tmp_path / "server-cache"))
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it caches the credentials it first resolved
    _enforce_iam(moto_url, True)
    try:
        assert PartitionStore.open(store).load(1).num_local > 0  # graph servers read their partition
        save_checkpoint(str(tmp_path / "run" / "checkpoints"), 3, {"W0": np.ones((2, 2), np.float32)})  # the driver
        with pytest.raises(DataError, match="AccessDenied"):  # cannot touch the dataset
            s3store.put_file(store, "manifest.json", _file(tmp_path))
        for root in (checkpoint_root(store), f"s3://{bucket}/checkpoints"):  # nor write checkpoints anywhere in S3
            with pytest.raises(DataError, match="AccessDenied"):
                save_checkpoint(root, 3, {"W0": np.ones(1, np.float32)})
    finally:
        _enforce_iam(moto_url, False)
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]}
    assert not [k for k in keys if "checkpoints" in k]
    assert json.loads(boto3.client("s3").get_object(Bucket=bucket, Key="datasets/mygraph/manifest.json")["Body"].read())


def _file(tmp_path):
    path = tmp_path / "junk.json"
    path.write_text("{}")
    return path
