"""infra/: parsed with python-hcl2 and checked for wiring and least privilege; `terraform fmt -check`
and checkov (offline) when their binaries are here. Policies are also created in moto's IAM."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

pytest.importorskip("hcl2")

from tests.aws.terraform import INFRA, _one, blocks, render, statements, text  # noqa: E402


def test_every_variable_is_used_and_documented():
    variables = blocks("variable")
    assert variables, "no variables parsed"
    source = text()
    for (name,), body in variables.items():
        assert re.search(rf"var\.{name}\b", source), f"variable {name} is never used"
        assert body.get("description"), f"variable {name} has no description"


def test_no_ingress_from_the_whole_internet_and_ports_match_the_cluster():
    resources = blocks("resource")
    ingress = {n: b for (t, n), b in resources.items() if t == "aws_vpc_security_group_ingress_rule"}
    assert ingress
    for name, rule in ingress.items():
        assert rule.get("cidr_ipv4") != "0.0.0.0/0" and rule.get("cidr_ipv6") != "::/0", name
        assert "cidr_ipv4" not in rule or rule["cidr_ipv4"] == "${var.operator_cidr}", name  # SSH only
    servers = {n: r for n, r in ingress.items() if r["security_group_id"] == "${aws_security_group.servers.id}"}
    server_ports = {r["from_port"] for r in servers.values() if r.get("referenced_security_group_id")}
    assert server_ports == {"${var.graph_server_port}", "${var.weight_server_port}", "${var.driver_port}"}
    lambda_sources = {r["from_port"] for r in servers.values()
                      if r.get("referenced_security_group_id") == "${aws_security_group.lambda.id}"}
    assert lambda_sources == {"${var.graph_server_port}", "${var.weight_server_port}"}  # never the driver
    endpoints = [r for r in ingress.values() if r["security_group_id"] == "${aws_security_group.endpoints.id}"]
    assert {(r["from_port"], r["referenced_security_group_id"]) for r in endpoints} == {
        (443, "${aws_security_group.lambda.id}"), (443, "${aws_security_group.servers.id}")}
    for sg in (b for (t, _), b in resources.items() if t == "aws_security_group"):
        assert "ingress" not in sg and "egress" not in sg  # rules live in their own resources only
    # the cluster file the servers are started with uses the same port variables
    network = (INFRA / "network.tf").read_text()
    for var in ("driver_port", "graph_server_port", "weight_server_port"):
        assert f"${{var.{var}}}" in network


def test_iam_is_least_privilege():
    st = statements()
    for doc in ("lambda", "server"):
        for s in st[doc]:
            for action in s["actions"]:
                assert "*" not in action, f"{doc}: wildcard action {action}"
    lam = {s["sid"]: s for s in st["lambda"]}
    assert set(lam) == {"OwnLogs", "VpcNetworkInterfaces", "ReadJobKey"}
    assert lam["OwnLogs"]["resources"] == ["${aws_cloudwatch_log_group.lambda.arn}:*"]
    assert all(a.startswith("ec2:") and ("NetworkInterface" in a or "PrivateIp" in a)
               for a in lam["VpcNetworkInterfaces"]["actions"])
    server = {s["sid"]: s for s in st["server"]}
    for role in (lam, server):  # that one secret, read only
        assert role["ReadJobKey"]["actions"] == ["secretsmanager:GetSecretValue"]
        assert role["ReadJobKey"]["resources"] == ["${aws_secretsmanager_secret.job_key.arn}"]
    for sid in ("InvokeTensorWorker", "ReadTensorWorkerMemory"):
        assert server[sid]["resources"] == ["${aws_lambda_function.tensor.arn}"]
    assert all(r != "*" for s in st["server"] for r in s["resources"])
    assert set(a for s in st["server"] for a in s["actions"]) == {
        "s3:ListBucket", "s3:GetObject", "s3:PutObject", "lambda:InvokeFunction", "lambda:GetFunctionConfiguration",
        "secretsmanager:GetSecretValue"}
    writes = [s for s in st["server"] if any(a != "s3:GetObject" and a.startswith("s3:") and "List" not in a
                                             for a in s["actions"])]
    assert [w["resources"] for w in writes] == [["${aws_s3_bucket.data.arn}/${var.checkpoint_prefix}/*"]]  # only there
    endpoint = _one(st["endpoint"])
    assert endpoint["actions"] == ["secretsmanager:GetSecretValue"]
    assert endpoint["resources"] == ["${aws_secretsmanager_secret.job_key.arn}"]
    kms = {s["sid"]: s for s in st["kms"]}
    assert kms["LambdaReadsTheJobKey"]["actions"] == ["kms:Decrypt"]
    assert _one(kms["LambdaReadsTheJobKey"]["condition"])["values"] == ["secretsmanager.${var.region}.amazonaws.com"]


def test_nothing_secret_in_state_user_data_or_outputs():
    resources = blocks("resource")
    assert not [k for k in resources if k[0].startswith("random_") or k[0] == "aws_secretsmanager_secret_version"], \
        "a secret value made or set by Terraform lands in its state"
    secret = resources[("aws_secretsmanager_secret", "job_key")]
    assert secret["kms_key_id"] == "${aws_kms_key.data.arn}"  # the bucket's KMS key
    for (name,), out in blocks("output").items():
        assert not out.get("sensitive"), f"output {name} is sensitive: outputs must hold nothing secret"
    template = (INFRA / "templates" / "server.sh.tftpl").read_text()
    user_data = resources[("aws_instance", "server")]["user_data"]
    assert set(re.findall(r"\$\{(\w+)\}", template)) <= {"role", "rank", "cluster_json", "region", "bucket", "wheel_key",
                                                          "wheel_file", "wheel_sha256", "requirements", "python",
                                                          "image_torch"}
    references = set(re.findall(r"\b(?:var|local|aws_\w+)\.[\w.]+", user_data))
    assert references == {"local.cluster", "var.region", "aws_s3_bucket.data.bucket", "aws_s3_object.server_wheel.key",
                          "var.server_wheel", "local.wheel_sha256", "local.lock", "local.lock_without_torch"}, references  # names and addresses only: no secret value, no token
    env = _one(resources[("aws_lambda_function", "tensor")]["environment"])["variables"]
    assert env == {"DORYLUS_KEY_SECRET": "${aws_secretsmanager_secret.job_key.arn}"}  # a name, not the key
    assert "key_secret" in (INFRA / "network.tf").read_text()  # the cluster file names it for the servers


def test_bucket_is_kept_on_destroy_unless_asked():
    assert blocks("resource")[("aws_s3_bucket", "data")]["force_destroy"] == "${var.force_destroy}"
    assert blocks("variable")[("force_destroy",)]["default"] is False


def test_bucket_is_encrypted_versioned_and_private():
    resources = blocks("resource")
    assert ("aws_s3_bucket_server_side_encryption_configuration", "data") in resources
    assert _one(resources[("aws_s3_bucket_versioning", "data")]["versioning_configuration"])["status"] == "Enabled"
    block = resources[("aws_s3_bucket_public_access_block", "data")]
    assert all(block[k] is True for k in ("block_public_acls", "block_public_policy", "ignore_public_acls",
                                          "restrict_public_buckets"))


def test_policies_are_accepted_by_iam(moto_url):
    import boto3

    iam = boto3.client("iam")
    for doc in ("lambda", "server"):
        arn = iam.create_policy(PolicyName=f"dorylus-{doc}", PolicyDocument=render(statements()[doc]))["Policy"]["Arn"]
        version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
        stored = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
        stored = json.loads(stored) if isinstance(stored, str) else stored
        assert len(stored["Statement"]) == len(statements()[doc])


def _binary(name: str, env: str) -> str | None:
    return os.environ.get(env) or shutil.which(name)


def test_terraform_fmt_check():
    terraform = _binary("terraform", "TERRAFORM")
    if not terraform:
        if os.environ.get("DORYLUS_REQUIRE_TERRAFORM") == "1":
            pytest.fail("terraform is not installed here (DORYLUS_REQUIRE_TERRAFORM=1)", pytrace=False)
        pytest.skip("terraform is not installed here")
    proc = subprocess.run([terraform, "fmt", "-check", "-recursive", str(INFRA)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"not formatted: {proc.stdout}"


def test_checkov_offline_finds_nothing_unexplained():
    checkov = _binary("checkov", "CHECKOV")
    if not checkov:
        pytest.skip("checkov is not installed here (it pins an old boto3: give it its own venv, set CHECKOV=path)")
    proc = subprocess.run([checkov, "-d", str(INFRA), "--framework", "terraform", "--skip-download", "--compact",
                           "--quiet", "-o", "json"], capture_output=True, text=True, check=False, timeout=600)
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]
    failed = [f"{c['check_id']} {c['resource']}" for r in reports for c in r.get("results", {}).get("failed_checks", [])]
    assert not failed, "checkov findings without a justification next to the resource:\n" + "\n".join(failed)
