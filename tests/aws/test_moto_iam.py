"""The rehearsal's IAM: policy evaluation, moto enforcing it on the resource each request names, and the
audit of recorded calls against the policies (dorylus_py/rehearsal/)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError

from dorylus_py.errors import ConfigError
from dorylus_py.rehearsal import audit
from dorylus_py.rehearsal.iam import allowed, decision
from dorylus_py.rehearsal.moto_aws import Call, MotoAws
from dorylus_py.rehearsal.terraform import find_tools

FN = "arn:aws:lambda:us-east-1:123456789012:function:"


def doc(*statements) -> dict:
    return {"Version": "2012-10-17", "Statement": list(statements)}


def test_policy_evaluation_wildcards_conditions_and_deny():
    p = doc({"Effect": "Allow", "Action": "S3:Get*", "Resource": "arn:aws:s3:::b/data/*"},
            {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::b",
             "Condition": {"StringLike": {"s3:prefix": "data/*"}}},
            {"Effect": "Deny", "Action": "s3:*", "Resource": "arn:aws:s3:::b/data/secret",
             "Condition": {"Bool": {"aws:SecureTransport": "false"}}})
    assert allowed([p], "s3:GetObject", "arn:aws:s3:::b/data/x")  # actions fold case, resources do not
    assert not allowed([p], "s3:GetObject", "arn:aws:s3:::b/Data/x")
    assert allowed([p], "s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "data/a"})
    assert not allowed([p], "s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "other/"})
    assert not allowed([p], "s3:ListBucket", "arn:aws:s3:::b")  # a missing key fails the condition
    assert decision([p], "s3:GetObject", "arn:aws:s3:::b/data/secret", {"aws:SecureTransport": "false"}) == "deny"
    assert allowed([p], "s3:GetObject", "arn:aws:s3:::b/data/secret", {"aws:SecureTransport": "true"})
    assert not allowed([doc({"Effect": "Allow", "Action": "kms:CreateKey", "Resource": "arn:aws:kms:*:*:key/*"})],
                       "kms:CreateKey", "*")  # an action not scoped to resources needs "Resource": "*"
    with pytest.raises(ValueError, match="NumericLessThan"):
        allowed([doc({"Effect": "Allow", "Action": "*", "Resource": "*", "Condition": {"NumericLessThan": {"k": "1"}}})],
                "s3:GetObject", "x", {"k": "0"})


def test_moto_enforces_statements_scoped_to_one_function_and_checks_passrole(moto_aws, monkeypatch):
    iam = boto3.client("iam")
    roles = [iam.create_role(RoleName=n, AssumeRolePolicyDocument="{}")["Role"]["Arn"] for n in ("mine", "other")]
    iam.create_user(UserName="u")
    iam.put_user_policy(UserName="u", PolicyName="p", PolicyDocument=json.dumps(doc(
        {"Effect": "Allow", "Action": ["lambda:CreateFunction", "lambda:GetFunctionConfiguration"],
         "Resource": FN + "mine-*"},
        {"Effect": "Allow", "Action": "iam:PassRole", "Resource": roles[0]})))
    key = iam.create_access_key(UserName="u")["AccessKey"]
    lam = boto3.client("lambda", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
    image = {"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:v1"}
    moto_aws.enforce(True)
    lam.create_function(FunctionName="mine-1", Role=roles[0], PackageType="Image", Code=image)
    assert lam.get_function_configuration(FunctionName="mine-1")["FunctionName"] == "mine-1"
    for name, role in (("theirs", roles[0]), ("mine-2", roles[1])):  # another function; another role to pass
        with pytest.raises(ClientError, match="403|AccessDenied"):
            lam.create_function(FunctionName=name, Role=role, PackageType="Image", Code=image)
    denied = {(c.action, c.resource) for c in moto_aws.calls if not c.allowed}
    assert denied == {("lambda:CreateFunction", FN + "theirs"), ("iam:PassRole", roles[1])}


def test_audit_finds_denied_calls_unused_grants_and_a_stale_docs_table(tmp_path):
    docs = tmp_path / "aws.md"
    docs.write_text("## Permissions the rehearsal does not use\n\n| who | actions | why |\n| --- | --- | --- |\n"
                    "| server | `s3:ListBucket` | reasons |\n| server | `s3:GetObject` (statement `Old`) | resume |\n")
    server = doc({"Sid": "Read", "Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"},
                 {"Sid": "Old", "Effect": "Allow", "Action": ["s3:GetObject", "s3:DeleteObject"], "Resource": "arn:aws:s3:::b/old/*"})
    role = "arn:aws:sts::123456789012:assumed-role/dorylus-server/i-1"
    calls = [Call(role, "s3:GetObject", "arn:aws:s3:::b/data/x", True), Call(role, "s3:PutObject", "arn:aws:s3:::b/y", False),
             Call("arn:aws:iam::123456789012:user/rehearsal-harness", "s3:DeleteBucket", "*", True)]
    found = audit.check(calls, {"server": server, "lambda": doc()}, doc(), docs)
    assert found.problems == ["server was denied s3:PutObject on arn:aws:s3:::b/y",
                              "server may s3:DeleteObject (Old) but no step used it, and docs/aws.md does not say why"]
    calls.append(Call(role, "s3:ListBucket", "arn:aws:s3:::b", True))
    assert "docs/aws.md says the rehearsal does not use server's s3:ListBucket, but it did" in \
        audit.check(calls, {"server": server, "lambda": doc()}, doc(), docs).problems


def test_a_missing_terraform_or_provider_is_named_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("TERRAFORM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="needs terraform on PATH"):
        find_tools()
    (tmp_path / "terraform").write_text("#!/bin/sh\n")
    (tmp_path / "terraform").chmod(0o755)
    with pytest.raises(ConfigError, match=r"needs the hashicorp/aws provider for offline use .*providers mirror.* none in "
                                          + str(tmp_path)):
        find_tools(str(tmp_path))
    packed = tmp_path / "registry.terraform.io" / "hashicorp" / "aws"  # as `terraform providers mirror` lays it out
    packed.mkdir(parents=True)
    (packed / "terraform-provider-aws_5.100.0_linux_amd64.zip").write_bytes(b"")
    assert find_tools(str(tmp_path)) == (str(tmp_path / "terraform"), tmp_path)


def test_the_bucket_policy_denies_plain_http_and_its_condition_holds_over_tls(tmp_path):
    """moto's own bucket-policy check denies whenever a statement has a condition; here the condition is
    evaluated: TLS-only holds over HTTPS, and refuses plain HTTP."""
    import os

    policy = json.dumps(doc({"Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": ["arn:aws:s3:::tls-only", "arn:aws:s3:::tls-only/*"],
                             "Condition": {"Bool": {"aws:SecureTransport": "false"}}}))
    for tls, ok in ((tmp_path / "tls", True), (None, False)):
        aws = MotoAws(tls_dir=tls)
        aws.start()
        try:
            s3 = boto3.client("s3", endpoint_url=aws.url, region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing", verify=aws.ca_bundle or None)
            s3.create_bucket(Bucket="tls-only")
            s3.put_bucket_policy(Bucket="tls-only", Policy=policy)
            if ok:
                s3.put_object(Bucket="tls-only", Key="k", Body=b"x")
            else:
                with pytest.raises(ClientError, match="403"):
                    s3.put_object(Bucket="tls-only", Key="k", Body=b"x")
        finally:
            aws.stop()
    assert os.path.exists(tmp_path / "tls" / "moto.pem")


# AWS's "Required permissions for Amazon S3 API operations": (method, bucket, key, query, headers) -> checks
S3_TABLE = [
    (("HEAD", "b", "k", {}), [("s3:GetObject", "b/k")]),  # HeadObject
    (("GET", "b", "k", {"versionId": "v1"}), [("s3:GetObjectVersion", "b/k")]),
    (("GET", "b", "k", {"tagging": ""}), [("s3:GetObjectTagging", "b/k")]),
    (("GET", "b", "", {"list-type": "2", "prefix": "p/"}), [("s3:ListBucket", "b", {"s3:prefix": "p/"})]),
    (("HEAD", "b", "", {}), [("s3:ListBucket", "b")]),  # HeadBucket
    (("GET", "b", "", {"versions": "", "prefix": "p"}), [("s3:ListBucketVersions", "b", {"s3:prefix": "p"})]),
    (("POST", "b", "k", {"uploads": ""}), [("s3:PutObject", "b/k")]),  # CreateMultipartUpload
    (("PUT", "b", "k", {"partNumber": "1", "uploadId": "u"}), [("s3:PutObject", "b/k")]),  # UploadPart
    (("POST", "b", "k", {"uploadId": "u"}), [("s3:PutObject", "b/k")]),  # CompleteMultipartUpload
    (("DELETE", "b", "k", {"uploadId": "u"}), [("s3:AbortMultipartUpload", "b/k")]),
    (("DELETE", "b", "k", {"versionId": "v1"}), [("s3:DeleteObjectVersion", "b/k")]),
    (("PUT", "b", "", {"publicAccessBlock": ""}), [("s3:PutBucketPublicAccessBlock", "b")]),
    (("GET", "b", "", {"encryption": ""}), [("s3:GetEncryptionConfiguration", "b")]),
    (("DELETE", "b", "", {"policy": ""}), [("s3:DeleteBucketPolicy", "b")]),
    (("GET", "b", "", {"lifecycle": ""}), [("s3:GetLifecycleConfiguration", "b")]),
    (("GET", "b", "", {"object-lock": ""}), [("s3:GetBucketObjectLockConfiguration", "b")]),
    (("PUT", "b", "", {}), [("s3:CreateBucket", "b")]),
    (("DELETE", "b", "", {}), [("s3:DeleteBucket", "b")]),
    (("PUT", "b", "copy", {}, {"x-amz-copy-source": "/src/a%20b"}), [("s3:GetObject", "src/a b"), ("s3:PutObject", "b/copy")]),
    (("GET", "", "", {}), [("s3:ListAllMyBuckets", "*")]),
]


def test_s3_requests_are_the_actions_of_aws_table():
    from dorylus_py.rehearsal.s3_requests import actions

    for request, want in S3_TABLE:
        method, bucket, key, query, *headers = request
        got = actions(method, bucket, key, query, headers[0] if headers else {})
        assert got == [(a, "*" if r == "*" else f"arn:aws:s3:::{r}", c[0] if c else {}) for a, r, *c in want], request
    body = ('<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Object><Key>a&amp;b</Key></Object>'
            '<Object><Key>c</Key><VersionId>v9</VersionId></Object></Delete>')
    assert actions("POST", "b", "", {"delete": ""}, {}, body.encode()) == [  # DeleteObjects: each object
        ("s3:DeleteObject", "arn:aws:s3:::b/a&b", {}), ("s3:DeleteObjectVersion", "arn:aws:s3:::b/c", {})]


def test_moto_judges_the_s3_calls_the_project_makes_as_aws_would(moto_aws, tmp_path):
    """Each S3 call of the code, the guide and Terraform, through moto with its check replaced, is judged as
    the IAM action AWS checks, whatever name the installed moto gives it (5.2.6 called a HeadObject
    ``s3:HeadObject``, an action IAM does not have, and the rehearsal failed on it)."""
    from boto3.s3.transfer import TransferConfig

    iam = boto3.client("iam")
    iam.create_user(UserName="all")
    iam.put_user_policy(UserName="all", PolicyName="p", PolicyDocument=json.dumps(doc(
        {"Effect": "Allow", "Action": "*", "Resource": "*"})))
    key = iam.create_access_key(UserName="all")["AccessKey"]
    boto3.client("s3").create_bucket(Bucket="bkt")
    s3 = boto3.client("s3", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
    s3.put_bucket_versioning(Bucket="bkt", VersioningConfiguration={"Status": "Enabled"})
    big = tmp_path / "big"
    big.write_bytes(b"x" * (6 * 2**20))
    moto_aws.enforce(True)  # everything allowed; every check recorded
    try:
        start = len(moto_aws.calls)
        s3.upload_file(str(big), "bkt", "d/big", Config=TransferConfig(multipart_threshold=5 * 2**20))
        s3.head_object(Bucket="bkt", Key="d/big")
        s3.get_object(Bucket="bkt", Key="d/big", Range="bytes=0-9")
        s3.list_objects_v2(Bucket="bkt", Prefix="d/big", MaxKeys=1)
        s3.head_bucket(Bucket="bkt")
        s3.copy_object(Bucket="bkt", Key="d/copy", CopySource={"Bucket": "bkt", "Key": "d/big"})
        versions = s3.list_object_versions(Bucket="bkt")["Versions"]
        s3.delete_objects(Bucket="bkt", Delete={"Objects": [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in versions]})
        s3.get_bucket_versioning(Bucket="bkt")
        got = [(c.action, c.resource.removeprefix("arn:aws:s3:::")) for c in moto_aws.calls[start:]]
    finally:
        moto_aws.enforce(False)
    assert got == [("s3:PutObject", "bkt/d/big")] * 3 + [  # create, one part, complete
        ("s3:GetObject", "bkt/d/big"), ("s3:GetObject", "bkt/d/big"), ("s3:ListBucket", "bkt"), ("s3:ListBucket", "bkt"),
        ("s3:GetObject", "bkt/d/big"), ("s3:PutObject", "bkt/d/copy"), ("s3:ListBucketVersions", "bkt"),
        ("s3:DeleteObjectVersion", "bkt/d/big"), ("s3:DeleteObjectVersion", "bkt/d/copy"), ("s3:GetBucketVersioning", "bkt")]


def test_the_moto_internals_the_rehearsal_relies_on_are_there():
    """rehearsal/moto_aws.py replaces moto's IAM check, and checks.py reads moto's backends, through these
    names; a moto release that moves one fails here, naming it (pyproject's dev extra bounds moto to the
    releases tried)."""
    import inspect

    from moto.core import authorization
    from moto.ec2.models import ec2_backends
    from moto.iam import access_control
    from moto.iam.models import iam_backends
    from moto.kms.models import kms_backends
    from moto.s3.models import FakeBucket, s3_backends

    def params(fn) -> list[str]:
        return list(inspect.signature(fn).parameters)

    mixin = authorization.ActionAuthenticatorMixin
    need = {
        "ActionAuthenticatorMixin._authenticate_and_authorize_normal_action(self, resource)":
            lambda: params(mixin._authenticate_and_authorize_normal_action)[:2] == ["self", "resource"],
        "ActionAuthenticatorMixin._authenticate_and_authorize_s3_action(self, bucket_name, key_name)":
            lambda: params(mixin._authenticate_and_authorize_s3_action) == ["self", "bucket_name", "key_name"],
        "ActionAuthenticatorMixin._authenticate_and_authorize_action(self, iam_request_cls, resource)":
            lambda: params(mixin._authenticate_and_authorize_action)[:3] == ["self", "iam_request_cls", "resource"],
        "IAMRequest, S3IAMRequest: check_action_permitted, _create_aws_request, _raise_access_denied":
            lambda: all(hasattr(c, m) for c in (access_control.IAMRequest, access_control.S3IAMRequest)
                        for m in ("check_action_permitted", "_create_aws_request", "_raise_access_denied")),
        "IAMPolicy(doc)._policy_json": lambda: access_control.IAMPolicy('{"Statement": []}')._policy_json is not None,
        "PermissionResult.PERMITTED, DENIED, NEUTRAL":
            lambda: all(hasattr(access_control.PermissionResult, n) for n in ("PERMITTED", "DENIED", "NEUTRAL")),
        "FakeBucket.get_permission": lambda: callable(FakeBucket.get_permission),
        "s3_backends[account]['aws'].get_object": lambda: callable(s3_backends["123456789012"]["aws"].get_object),
        "ec2_backends[account][region].tags, .route_tables":
            lambda: all(hasattr(ec2_backends["123456789012"]["us-east-1"], a) for a in ("tags", "route_tables")),
        "kms_backends[account][region].describe_key": lambda: callable(kms_backends["123456789012"]["us-east-1"].describe_key),
        "iam_backends[account]['aws'].get_role_by_arn, get_instance_profile":
            lambda: all(callable(getattr(iam_backends["123456789012"]["aws"], m))
                        for m in ("get_role_by_arn", "get_instance_profile")),
    }
    moved = []
    for name, check in need.items():
        try:
            ok = check()
        except Exception as e:  # noqa: BLE001  (an import or attribute that moved: that is the finding)
            ok, name = False, f"{name} ({type(e).__name__}: {e})"
        if not ok:
            moved.append(name)
    assert moved == [], f"moto moved what the rehearsal relies on: {moved}"
