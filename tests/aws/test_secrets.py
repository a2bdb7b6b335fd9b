"""The job key on AWS (moto): `dorylus aws put-secret`, the read path of servers and Lambdas, and the
server role's policy enforced against the paths the code reads and writes."""

from __future__ import annotations

import boto3
import numpy as np
import pytest

from dorylus_py import s3 as s3store
from dorylus_py.checkpoint import load_checkpoint, save_checkpoint
from dorylus_py.cli import main
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.jobkey import load_job_key
from dorylus_py.partition import PartitionStore, prepare
from dorylus_py.partition.store import checkpoint_root
from dorylus_py.platforms.aws import deployed_memory_mb

pytest.importorskip("hcl2")
from tests.aws.terraform import render, statements  # noqa: E402

JOB = {"store": "0" * 32, "model": "gcn", "widths": [2, 2], "partitions": 2}  # a checkpoint's fingerprint


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


def test_server_role_does_what_servers_and_driver_do_and_nothing_more(moto_aws, small_graph, tmp_path, monkeypatch):
    """The server policy from infra/iam.tf, rendered for bucket dorylus-data-x, enforced on the real code
    paths: graph servers read their partition; the driver on graph server 0 reads the function's
    deployed memory (every --backend lambda start) and writes checkpoints under checkpoints/; the role
    can write nothing else, the dataset and its old checkpoints/ folder included."""
    bucket = "dorylus-data-x"
    boto3.client("s3").create_bucket(Bucket=bucket)
    store = f"s3://{bucket}/datasets/mygraph"
    prepare(small_graph, store, 2)  # as the operator
    role = boto3.client("iam").create_role(RoleName="dorylus-lambda", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    boto3.client("lambda").create_function(FunctionName="dorylus-tensor", Role=role, PackageType="Image", MemorySize=1769,
                                           Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/dorylus-lambda:v1"})
    iam = boto3.client("iam")
    iam.create_user(UserName="server")
    iam.put_user_policy(UserName="server", PolicyName="server", PolicyDocument=render(statements()["server"]))
    creds = iam.create_access_key(UserName="server")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", creds["AccessKeyId"])  # a new S3 client for the new identity
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", creds["SecretAccessKey"])
    monkeypatch.setenv("DORYLUS_CACHE", str(tmp_path / "server-cache"))
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it caches the credentials it first resolved
    moto_aws.enforce(True)
    try:
        assert PartitionStore.open(store).load(1).num_local > 0  # graph servers read their partition
        moto_aws.enforce(False)
        boto3.client("s3", aws_access_key_id="testing", aws_secret_access_key="testing").delete_object(
            Bucket=bucket, Key="datasets/mygraph/part-00000/labels.npy")  # (the harness, not the role)
        moto_aws.enforce(True)
        with pytest.raises(DataError, match="part-00000/labels.npy: missing"):  # S3 said 403; a listing, absent
            PartitionStore.open(store).load(0)
        assert deployed_memory_mb("dorylus-tensor") == 1769  # the driver's start
        run = f"s3://{bucket}/checkpoints/run1"
        save_checkpoint(run, 3, {"W0": np.ones((2, 2), np.float32)}, JOB)
        assert int(load_checkpoint(run)["epoch"]) == 3
        with pytest.raises(DataError, match="AccessDenied"):  # cannot touch the dataset
            s3store.put_file(store, "manifest.json", _file(tmp_path))
        for root in (checkpoint_root(store), f"s3://{bucket}/elsewhere"):  # nor write outside checkpoints/
            with pytest.raises(DataError, match="AccessDenied"):
                save_checkpoint(root, 3, {"W0": np.ones(1, np.float32)}, JOB)
        with pytest.raises(DataError, match="AccessDenied"):  # the save above stops at the index it reads
            s3store.put_file(f"s3://{bucket}/elsewhere", "epoch-000003.npz", _file(tmp_path))
    finally:
        moto_aws.enforce(False)
    denied = {(c.action, c.resource, c.context.get("s3:prefix", "")) for c in moto_aws.calls if not c.allowed}
    assert denied == {("s3:PutObject", f"arn:aws:s3:::{bucket}/datasets/mygraph/manifest.json", ""),
                      ("s3:PutObject", f"arn:aws:s3:::{bucket}/datasets/mygraph/checkpoints/epoch-000003.npz", ""),
                      ("s3:PutObject", f"arn:aws:s3:::{bucket}/elsewhere/epoch-000003.npz", ""),
                      # a save lists the index it extends: absent is what a listing says, never a refused read
                      ("s3:ListBucket", f"arn:aws:s3:::{bucket}", "elsewhere/latest.json"),
                      # the read of the deleted labels.npy: 403, as S3 says to whom may list a prefix only
                      ("s3:ListBucket", f"arn:aws:s3:::{bucket}", "")}
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]}
    assert {k for k in keys if "checkpoints" in k} == {"checkpoints/run1/epoch-000003.npz", "checkpoints/run1/latest.json"}


def _server_user(statements_: list[dict]) -> dict:
    iam = boto3.client("iam")
    iam.create_user(UserName="server")
    iam.put_user_policy(UserName="server", PolicyName="server", PolicyDocument=render(statements_))
    return iam.create_access_key(UserName="server")["AccessKey"]


def test_a_read_of_a_missing_key_is_refused_without_list_bucket_as_on_aws(moto_aws):
    """Real S3 answers a GET or HEAD of a key that is not there with 403 AccessDenied to a caller without
    s3:ListBucket on the bucket, 404 to one with it; the rehearsal's S3 does the same (moto says 404)."""
    from botocore.exceptions import ClientError

    boto3.client("s3").create_bucket(Bucket="bkt")
    statement = {"sid": "Read", "actions": ["s3:GetObject"], "resources": ["arn:aws:s3:::bkt/*"]}
    lister = {"sid": "List", "actions": ["s3:ListBucket"], "resources": ["arn:aws:s3:::bkt"]}
    for policy, status in (([statement], "403"), ([statement, lister], "404")):
        iam = boto3.client("iam")
        name = f"u{len(policy)}"
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=render(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        s3 = boto3.client("s3", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
        moto_aws.enforce(True)
        try:
            for call in (lambda: s3.get_object(Bucket="bkt", Key="nope"), lambda: s3.head_object(Bucket="bkt", Key="nope")):
                with pytest.raises(ClientError) as e:
                    call()
                assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == int(status)
        finally:
            moto_aws.enforce(False)
    assert [(c.action, c.allowed) for c in moto_aws.calls if c.principal.endswith("user/u1")] == [
        ("s3:GetObject", True), ("s3:ListBucket", False)] * 2


def test_the_first_checkpoint_under_issue_54s_server_policy_fails_naming_the_fix(moto_aws, monkeypatch):
    """The policy before issue 54 let the servers list datasets/ only: the driver's first checkpoint then
    dies (its latest.json, not there yet, cannot be told absent) with a line that says what to grant."""
    boto3.client("s3").create_bucket(Bucket="dorylus-data-x")
    before = [dict(st, condition=[{**st["condition"][0], "values": ["${var.dataset_prefix}/*"]}]) if st["sid"].startswith("List")
              else st for st in statements()["server"]]
    creds = _server_user(before)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", creds["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", creds["SecretAccessKey"])
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it caches the credentials it first resolved
    moto_aws.enforce(True)
    try:
        with pytest.raises(DataError, match=r"checkpoints/run1/latest.json: AccessDenied: the caller needs "
                                            r"s3:ListBucket on the bucket for this prefix"):
            save_checkpoint("s3://dorylus-data-x/checkpoints/run1", 1, {"W0": np.ones(1, np.float32)}, JOB)
    finally:
        moto_aws.enforce(False)


def _file(tmp_path):
    path = tmp_path / "junk.json"
    path.write_text("{}")
    return path


def test_the_rehearsals_refusal_check_passes_infra_roles_and_flags_an_allow_all():
    """audit.overbroad: what each role must never do, put to infra/iam.tf's policies (none allowed) and to
    a policy that allows everything (every request flagged), which the used-or-listed audit alone passes."""
    import json

    from dorylus_py.rehearsal.audit import MUST_REFUSE, overbroad

    roles = {kind: json.loads(render(statements()[kind])) for kind in ("server", "lambda")}
    assert overbroad(roles, "dorylus-data-x") == []
    everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    flagged = overbroad({"server": everything, "lambda": roles["lambda"]}, "dorylus-data-x")
    assert len(flagged) == len(MUST_REFUSE["server"]) and all(f.startswith("server may") for f in flagged)
